package localenv

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// capiFeatureGates turns off what QCP does not use, and turns on
// ClusterTopology (alpha, off by default), which ClusterClass and managed
// topologies need, as every ClusterClass user turns it on. ReconcilerRateLimiting
// (one reconcile per object per second) is off so tests react at event speed;
// figures measured with it off say so.
const capiFeatureGates = "MachinePool=false,ClusterTopology=true,RuntimeSDK=false,ReconcilerRateLimiting=false"

func (e *Env) startCAPI(ctx context.Context, opts Options) error {
	path, err := binaries.Path("capi-manager", opts.CAPIVersion)
	if err != nil {
		return err
	}
	start := func(addrs []string) (*Process, error) {
		args := e.capiManagerArgs(e.WebhookPort, addrs, capiFeatureGates)
		return StartProcess("capi-manager", path, args, capiManagerEnv, e.Dir)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if e.capi, _, err = e.startOnFreePorts(ctx, "capi-manager", 2, start, func(addrs []string) string { return "http://" + addrs[0] + "/readyz" }); err != nil {
		return fmt.Errorf("CAPI core manager did not become ready (log: %s/capi-manager.log): %w", e.Dir, err)
	}
	return nil
}

// CAPI returns the CAPI core manager process, or nil if it is not running.
func (e *Env) CAPI() *Process { return e.capi }

// RestartCAPI starts CAPI core again, as Start did, once the process that
// ran it has ended (a fault test killed it).
func (e *Env) RestartCAPI(ctx context.Context) error {
	if e.capi != nil && !e.capi.Exited() {
		return fmt.Errorf("CAPI core (pid %d) is still running", e.capi.PID())
	}
	return e.startCAPI(ctx, e.opts)
}

// cabpkWebhookNamePrefix keeps CABPK's webhook configurations apart from
// CAPI core's, which controller-gen names the same.
const cabpkWebhookNamePrefix = "cabpk-"

// startCABPK starts CAPI's kubeadm bootstrap provider, which gives worker
// Machines their `kubeadm join` bootstrap data, and installs its webhooks.
func (e *Env) startCABPK(ctx context.Context, opts Options) error {
	path, err := binaries.Path("cabpk-manager", opts.CAPIVersion)
	if err != nil {
		return err
	}
	if e.cabpkWebhookPort == 0 {
		if e.cabpkWebhookPort, err = stablePort(e.webhookHost); err != nil {
			return err
		}
	}
	start := func(addrs []string) (*Process, error) {
		args := e.capiManagerArgs(e.cabpkWebhookPort, addrs, "MachinePool=false")
		return StartProcess("cabpk-manager", path, args, capiManagerEnv, e.Dir)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if e.cabpk, _, err = e.startOnFreePorts(ctx, "cabpk-manager", 2, start, func(addrs []string) string { return "http://" + addrs[0] + "/readyz" }); err != nil {
		return fmt.Errorf("CABPK did not become ready (log: %s/cabpk-manager.log): %w", e.Dir, err)
	}
	if opts.Repository != "" {
		// clusterctl installed them, pointed at the same port.
		return nil
	}
	return e.installWebhooks("capi/cabpk-webhook-manifests.yaml", cabpkWebhookNamePrefix, e.cabpkWebhookPort)
}

// capiManagerArgs are the flags of a CAPI manager (core or CABPK) serving
// its webhooks on webhookPort, its health and diagnostics on addrs[0] and
// addrs[1], with featureGates.
func (e *Env) capiManagerArgs(webhookPort int, addrs []string, featureGates string) []string {
	return []string{
		"--kubeconfig=" + e.Kubeconfig,
		"--leader-elect=false",
		"--webhook-port=" + strconv.Itoa(webhookPort),
		"--webhook-cert-dir=" + e.WebhookCertDir,
		"--health-addr=" + addrs[0],
		"--diagnostics-address=" + addrs[1],
		"--insecure-diagnostics=true",
		"--feature-gates=" + featureGates,
	}
}

// capiManagerEnv turns the watch-list client off: it costs seconds at
// start-up against a fresh apiserver and buys nothing at this size.
var capiManagerEnv = []string{"KUBE_FEATURE_WatchListClient=false"}
