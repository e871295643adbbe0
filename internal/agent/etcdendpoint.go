package agent

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/qcp-dev/qcp/internal/lb"
)

// etcdEndpointListen is where the local etcd endpoint listens: loopback,
// which every etcd member's serving certificate names, so kube-apiserver
// verifies the member it reaches through it. The port is the system's
// choice: process machines share the host's loopback.
const etcdEndpointListen = "127.0.0.1:0"

// etcdEndpointPoll bounds how long a membership change takes to reach the
// local endpoint; the balancer probes its backends once a second anyway.
const etcdEndpointPoll = 2 * time.Second

// startEtcdEndpoint starts the local etcd endpoint of a machine whose API
// server uses an etcd cluster that changes members (an EtcdCluster). It is
// a TLS-passthrough forwarder on loopback that follows the member list:
// its backends are the voters' client URLs, each probed at /health, so a
// removed, killed or frozen member drops out within seconds and a new one
// comes in once promoted. kube-apiserver is given only this endpoint, so
// replacing every etcd member changes nothing in its configuration and
// rolls out no control plane machine. It lives and dies with the API
// server it serves, so it adds no failure etcd does not already have.
func (a *machineCtx) startEtcdEndpoint(ctx context.Context) (string, error) {
	ext := a.doc.Etcd.External
	tlsCfg, err := a.etcdTLS()
	if err != nil {
		return "", err
	}
	cli, err := a.etcdClient(ext.Endpoints)
	if err != nil {
		return "", err
	}
	context.AfterFunc(ctx, func() { cli.Close() })
	seeds := hostPorts(ext.Endpoints)
	listed := false
	source := func(ctx context.Context) ([]string, bool) {
		ctx, cancel := context.WithTimeout(ctx, etcdEndpointPoll)
		defer cancel()
		resp, err := cli.MemberList(ctx)
		if err != nil {
			// Until the member list has been read once, the endpoints the
			// machine was created with are the best guess.
			if !listed {
				listed = true
				return seeds, true
			}
			return nil, false
		}
		listed = true
		var urls []string
		for _, m := range resp.Members {
			if !m.IsLearner {
				urls = append(urls, m.ClientURLs...)
			}
		}
		if len(urls) == 0 {
			return nil, false
		}
		slices.Sort(urls)
		// The agent's own client follows the members too, so the list
		// stays readable after every member it started with is gone.
		if !slices.Equal(cli.Endpoints(), urls) {
			cli.SetEndpoints(urls...)
		}
		return hostPorts(urls), true
	}
	probeClient := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}}
	probe := func(ctx context.Context, backend string) bool {
		return lb.HTTPProbe(ctx, probeClient, "https://"+backend+"/health")
	}
	b := lb.NewBalancer(etcdEndpointListen, source, probe, a.log.With("component", "etcd-endpoint"))
	addr, err := b.Start(ctx)
	if err != nil {
		return "", err
	}
	a.log.Info("local etcd endpoint follows the etcd member list", "address", addr, "startingFrom", ext.Endpoints)
	return "https://" + addr, nil
}

// hostPorts turns client URLs into the host:port backends the balancer
// dials, skipping any that do not parse.
func hostPorts(urls []string) []string {
	var out []string
	for _, u := range urls {
		if parsed, err := url.Parse(u); err == nil && parsed.Host != "" {
			out = append(out, parsed.Host)
		}
	}
	return out
}
