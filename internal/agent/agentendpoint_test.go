package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestAgentEndpointWithoutEtcd serves the endpoint of a control plane
// machine on an external etcd: it serves its own certificate of the
// cluster CA, takes only a cluster-CA client named qcp-manager (not a
// Node's, not the etcd CA's, not none), has no etcd settings nor etcd
// authority (a 404, which SetAuthority explains), and renews its own
// serving certificate with the other leaves. A refused handshake is logged
// with the name it refused.
func TestAgentEndpointWithoutEtcd(t *testing.T) {
	now := time.Now()
	cas, _, doc := externalDoc(t, now)
	addr := testkit.ReserveAddress(t)
	dir := t.TempDir()
	m := Machine{Name: "m1", Namespace: "ns", Cluster: "c1", Address: addr, ProviderID: "p"}
	p, err := IssuePKI(dir, m, doc, now)
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.SyncBuffer{}
	_, ctx := serveEndpoint(t, dir, m, doc, p, logs)
	named := func(signer *certs.KeyPair, cn string) *tls.Config {
		cfg := clientTLS(t, cas.Cluster, nil)
		kp, err := signer.Issue(certs.Request{CommonName: cn, Usages: certs.ClientUsage}, now)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		return cfg
	}
	manager := named(cas.Cluster, ManagerCommonName)
	r, err := GetPKI(ctx, manager, addr)
	if err != nil {
		t.Fatal(err)
	}
	serving, ok := r.Find("agent-serving.crt")
	if !ok || !serving.Renewable || serving.Issuer != cas.Cluster.Cert.Subject.CommonName {
		t.Fatalf("GET %s: no renewable agent-serving.crt of the cluster CA in %+v", PKIPath, r)
	}
	if got := presentedSerial(t, manager, addr); got != serving.SerialNumber {
		t.Fatalf("the endpoint presents serial %s, want agent-serving.crt's %s", got, serving.SerialNumber)
	}
	for name, cfg := range map[string]*tls.Config{
		"no client certificate":         clientTLS(t, cas.Cluster, nil),
		"a Node's certificate":          named(cas.Cluster, "system:node:worker-1"),
		"the etcd CA's, as qcp-manager": named(cas.Etcd, ManagerCommonName),
	} {
		if _, err := GetPKI(ctx, cfg, addr); err == nil {
			t.Errorf("%s: GET answered; want the handshake refused", name)
		}
		if _, err := RenewPKI(ctx, cfg, addr, PKIRenewRequest{}); err == nil {
			t.Errorf("%s: POST answered; want the handshake refused", name)
		}
	}
	waitLogged(ctx, t, logs, "TLS handshake error", "system:node:worker-1", "refused")
	if err := callAgent(ctx, manager, addr, http.MethodGet, EtcdSettingsPath, time.Second, nil, new(any)); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("GET %s on a machine without etcd: %v; want 404", EtcdSettingsPath, err)
	}
	// A path the agent does not serve, as an agent older than a kind of
	// rotation answers: the error says how to go on.
	_, err = SetAuthority(ctx, manager, addr, EtcdAuthorityKind, Authority{CA: bootstrap.CertKey{Cert: string(cas.Etcd.CertPEM), Key: string(cas.Etcd.KeyPEM)}, Trust: string(cas.Etcd.CertPEM)})
	if se := (*StatusError)(nil); !errors.As(err, &se) || se.Code != http.StatusNotFound || !strings.Contains(err.Error(), "roll the machine out") {
		t.Errorf("PUT %s on a machine without etcd: %v; want a 404 that says to roll the machine out", EtcdAuthorityKind.Path(), err)
	}
	// The other kinds' paths are served where their components run: an
	// authority that does not parse is refused as such (400), not unknown.
	for _, k := range []AuthorityKind{ClusterAuthorityKind, FrontProxyAuthorityKind, ServiceAccountAuthorityKind} {
		_, err := SetAuthority(ctx, manager, addr, k, Authority{})
		if se := (*StatusError)(nil); !errors.As(err, &se) || se.Code != http.StatusBadRequest {
			t.Errorf("PUT %s with an empty authority: %v; want 400", k.Path(), err)
		}
	}
	res, err := RenewPKI(ctx, manager, addr, PKIRenewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	renewed, _ := res.Report.Find("agent-serving.crt")
	if renewed.SerialNumber == serving.SerialNumber || !slices.Contains(res.Renewed, "agent-serving.crt") {
		t.Errorf("POST %s: renewed %v, agent-serving.crt %+v", PKIRenewPath, res.Renewed, renewed)
	}
	if got := presentedSerial(t, manager, addr); got != renewed.SerialNumber {
		t.Errorf("after the renewal the endpoint presents serial %s, want the renewed %s", got, renewed.SerialNumber)
	}
}

// waitLogged waits until a line of the log holds every one of want: the
// server logs a refused handshake from its own goroutine, at about the
// time the client fails.
func waitLogged(ctx context.Context, t *testing.T, logs *testkit.SyncBuffer, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	logged := func() bool {
		return slices.ContainsFunc(strings.Split(logs.String(), "\n"), func(line string) bool {
			return !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(line, w) })
		})
	}
	for !logged() {
		select {
		case <-ctx.Done():
			t.Errorf("no line of the agent's log holds all of %q after 5s:\n%s", want, logs.String())
			return
		case <-tick.C:
		}
	}
}
