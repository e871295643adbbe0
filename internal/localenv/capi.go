package localenv

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	run, err := e.capiManagerRun(ctx, opts, "capi-system", "capi-controller-manager", "capi-manager")
	if err != nil {
		return err
	}
	start := func(addrs []string) (*Process, error) {
		args, env := run.with(e.capiManagerArgs(run.kubeconfig, e.WebhookPort, addrs, capiFeatureGates))
		return StartProcess("capi-manager", path, args, env, e.Dir)
	}
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
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	run, err := e.capiManagerRun(ctx, opts, "capi-kubeadm-bootstrap-system", "capi-kubeadm-bootstrap-controller-manager", "cabpk-manager")
	if err != nil {
		return err
	}
	start := func(addrs []string) (*Process, error) {
		args, env := run.with(e.capiManagerArgs(run.kubeconfig, e.cabpkWebhookPort, addrs, "MachinePool=false"))
		return StartProcess("cabpk-manager", path, args, env, e.Dir)
	}
	if e.cabpk, _, err = e.startOnFreePorts(ctx, "cabpk-manager", 2, start, func(addrs []string) string { return "http://" + addrs[0] + "/readyz" }); err != nil {
		return fmt.Errorf("CABPK did not become ready (log: %s/cabpk-manager.log): %w", e.Dir, err)
	}
	if opts.Repository != "" {
		// clusterctl installed them, pointed at the same port.
		return nil
	}
	return e.installWebhooks("capi/cabpk-webhook-manifests.yaml", cabpkWebhookNamePrefix, e.cabpkWebhookPort)
}

// capiManagerArgs are the flags of a CAPI manager (core or CABPK) that
// reaches the API server with kubeconfig, serves its webhooks on
// webhookPort, its health and diagnostics on addrs[0] and addrs[1], with
// featureGates. With a release installed, they override the installed
// Deployment's (managerRun.with), each for a reason:
//   - --kubeconfig: a host process has no in-cluster configuration;
//   - --webhook-port, --webhook-cert-dir, --health-addr,
//     --diagnostics-address, --insecure-diagnostics: ports and
//     certificates of the host, where several management clusters run side
//     by side and the webhook configurations point (clusterctl.go);
//   - --leader-elect=false: one replica, which need not wait for a lease;
//   - --feature-gates: the local environment's (capiFeatureGates).
func (e *Env) capiManagerArgs(kubeconfig string, webhookPort int, addrs []string, featureGates string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
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

// managerRun is how a host process runs a manager a release installed as a
// Deployment: as the Deployment's ServiceAccount, with its arguments and
// environment. Without a release: as the administrator, with the
// environment's arguments alone.
type managerRun struct {
	// kubeconfig authenticates as the ServiceAccount (the administrator's
	// without a release).
	kubeconfig string
	args, env  []string
}

// capiManagerRun reads the Deployment namespace/name that clusterctl
// installed, and gives its ServiceAccount a kubeconfig named base. Without a
// release it runs the manager as the administrator, as before.
func (e *Env) capiManagerRun(ctx context.Context, opts Options, namespace, name, base string) (managerRun, error) {
	if opts.Repository == "" {
		return managerRun{kubeconfig: e.Kubeconfig, env: capiManagerEnv}, nil
	}
	d, container, err := e.installedManager(ctx, namespace, name)
	if err != nil {
		return managerRun{}, err
	}
	if err := e.waitForAggregatedRoles(ctx); err != nil {
		return managerRun{}, err
	}
	sa := d.Spec.Template.Spec.ServiceAccountName
	roles, err := e.boundClusterRoles(ctx, namespace, sa)
	if err != nil {
		return managerRun{}, fmt.Errorf("reading the roles of ServiceAccount %s/%s: %w", namespace, sa, err)
	}
	if e.capiIdentities == nil {
		e.capiIdentities = map[string]managerIdentity{}
	}
	e.capiIdentities[base] = managerIdentity{user: "system:serviceaccount:" + namespace + ":" + sa, roles: roles, namespace: namespace, serviceAccount: sa}
	kubeconfig, err := e.serviceAccountKubeconfig(ctx, namespace, sa, base)
	if err != nil {
		return managerRun{}, err
	}
	// The Pod's namespace, which the Deployment gives through the downward
	// API.
	env := append([]string{"POD_NAMESPACE=" + namespace}, capiManagerEnv...)
	return managerRun{kubeconfig: kubeconfig, args: container.Args, env: env}, nil
}

// installedManager reads the Deployment namespace/name that clusterctl
// installed, and its container named manager, as the clusterctl contract
// names it.
func (e *Env) installedManager(ctx context.Context, namespace, name string) (*appsv1.Deployment, *corev1.Container, error) {
	var d appsv1.Deployment
	if err := e.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &d); err != nil {
		return nil, nil, fmt.Errorf("reading the Deployment %s/%s clusterctl installed: %w", namespace, name, err)
	}
	i := slices.IndexFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == "manager" })
	if i < 0 {
		return nil, nil, fmt.Errorf("the Deployment %s/%s has no container named manager", namespace, name)
	}
	return &d, &d.Spec.Template.Spec.Containers[i], nil
}

// with returns the Deployment's arguments with overrides in place of those
// of the same flag, and the environment.
func (r managerRun) with(overrides []string) (args, env []string) {
	return overrideArgs(r.args, overrides), r.env
}

// overrideArgs is args without those of a flag overrides set, then
// overrides.
func overrideArgs(args, overrides []string) []string {
	var out []string
	for _, a := range args {
		if !slices.ContainsFunc(overrides, func(o string) bool { return flagName(o) == flagName(a) }) {
			out = append(out, a)
		}
	}
	return append(out, overrides...)
}

// flagName is the flag an argument such as --name=value sets.
func flagName(arg string) string {
	name, _, _ := strings.Cut(arg, "=")
	return name
}

// waitForAggregatedRoles waits until kube-controller-manager has filled
// every aggregated ClusterRole the release installed: the managers are
// bound to those, and are refused everything until then.
func (e *Env) waitForAggregatedRoles(ctx context.Context) error {
	var empty []string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var roles rbacv1.ClusterRoleList
		if err := e.Client.List(ctx, &roles, client.HasLabels{clusterv1.ProviderNameLabel}); err != nil {
			return false, nil
		}
		empty = nil
		for _, r := range roles.Items {
			if r.AggregationRule != nil && len(r.Rules) == 0 {
				empty = append(empty, r.Name)
			}
		}
		return len(empty) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-controller-manager to aggregate the release's ClusterRoles %v (log: %s/kube-controller-manager.log): %w", empty, e.Dir, err)
	}
	return nil
}
