// Command qcp-manager hosts QCP's controllers and webhooks.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/qcp-dev/qcp/images"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/cloudinit"
	"github.com/qcp-dev/qcp/internal/controllers/controlplane"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/controllers/etcdcluster"
	"github.com/qcp-dev/qcp/internal/controllers/process"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/hostnet"
	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/scheme"
	"github.com/qcp-dev/qcp/internal/version"
	"github.com/qcp-dev/qcp/internal/webhooks"
)

// controllerNames are the controllers --controllers may pick from.
var controllerNames = []string{"process", "controlplane"}

// The events the manager may emit per object: a burst of eventBurst, then
// eventQPS a second. Each planner step is one event, and steps come seconds
// apart at most, so nothing QCP does is dropped.
const (
	eventBurst = 500
	eventQPS   = 1
)

func main() {
	var (
		metricsAddr, healthAddr string
		profilerAddr            string
		leaderElect, showVer    bool
		processOpts             process.Options
		machineNetwork          string
		machineImage            string
		webhookOpts             webhook.Options
		cpOpts                  controlPlaneOptions
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "127.0.0.1:8080", "where Prometheus metrics are served; 0 turns them off")
	flag.StringVar(&healthAddr, "health-probe-bind-address", "127.0.0.1:8081", "where /healthz and /readyz are served")
	flag.StringVar(&profilerAddr, "profiler-address", "", "where Go's pprof profiles are served, as CAPI's managers' flag of that name (default: not served)")
	flag.BoolVar(&leaderElect, "leader-elect", false, "use leader election, for running more than one replica")
	flag.StringVar(&cpOpts.namespace, "namespace", "", "namespace whose objects the manager watches and reconciles (default: every namespace)")
	flag.StringVar((*string)(&cpOpts.watchFilter), "watch-filter", "", "reconcile only objects whose "+clusterv1.WatchLabel+" label has this value (default: every object)")
	flag.IntVar(&webhookOpts.Port, "webhook-port", webhook.DefaultPort, "port the admission webhooks are served on; 0 turns them off")
	flag.StringVar(&webhookOpts.Host, "webhook-host", "", "address the admission webhooks are served on (default: every interface)")
	flag.StringVar(&webhookOpts.CertDir, "webhook-cert-dir", "", "directory holding the webhooks' serving certificate tls.crt and key tls.key (default: controller-runtime's, under the temporary directory)")
	flag.BoolVar(&showVer, "version", false, "print the version and exit")
	flag.StringVar(&processOpts.MachineRoot, "machine-root", "", "directory holding the process machines' directories (required with the process controllers)")
	flag.StringVar(&processOpts.BinDir, "bin-dir", "", "directory of the pinned binaries (default: $QCP_BIN_DIR or the repository's bin/)")
	flag.StringVar(&processOpts.AgentPath, "agent", "", "path of qcp-agent (default: qcp-agent next to this binary)")
	flag.StringVar(&machineImage, "machine-image", "", "root of a machine image tree that images/install.sh installed: the process machines run its qcp-agent and pinned binaries, as a cloud's machines run their image's (--bin-dir and --agent override either)")
	flag.Func("address-range", "prefix machine and load balancer addresses come from: a loopback one (default "+process.DefaultAddressRange.String()+
		"), or with --machine-network=namespaces the machines' network (default "+hostnet.DefaultPrefix.String()+")", func(v string) error {
		p, err := netip.ParsePrefix(v)
		if err != nil || !p.Addr().Is4() {
			return fmt.Errorf("want an IPv4 prefix such as 127.20.0.0/16, got %q", v)
		}
		processOpts.AddressRange = p
		return nil
	})
	flag.StringVar(&machineNetwork, "machine-network", networkAuto, "where process machines live: "+networkLoopback+
		" (addresses of the host's loopback, shared by every machine), "+networkNamespaces+
		" (each machine and load balancer a network host of its own, a network namespace on a bridge of the host's, where `qcpctl machine isolate` cuts partitions; needs root) or "+networkAuto+
		" (namespaces where qcp-manager can make them and --address-range is not a loopback prefix, else loopback; each ProcessMachine's "+process.OwnNetworkCondition+" condition says which, and why)")
	flag.Func("controllers", "comma-separated controllers to run, of "+strings.Join(controllerNames, ", ")+" (default: all)", func(v string) error {
		cpOpts.controllers = map[string]bool{}
		for _, name := range strings.Split(v, ",") {
			if !slices.Contains(controllerNames, name) {
				return fmt.Errorf("unknown controller %q; choose from %s", name, strings.Join(controllerNames, ", "))
			}
			cpOpts.controllers[name] = true
		}
		return nil
	})
	flag.DurationVar(&cpOpts.kubeconfigLifetime, "kubeconfig-lifetime", controlplane.DefaultKubeconfigLifetime,
		"validity of the client certificate in each <cluster>-kubeconfig Secret; it is issued again at half-life")
	flag.DurationVar(&cpOpts.etcdClientLifetime, "etcd-client-certificate-lifetime", certs.LeafValidity,
		"validity of the client certificate qcp-manager issues itself for each etcd cluster it manages; it is issued again after two thirds of it, without a restart")
	flag.DurationVar(&cpOpts.machineCertificateLifetime, "machine-certificate-lifetime", 0,
		"validity of the leaf certificates each new control plane or etcd machine issues itself, overriding a QuorumControlPlane's spec.certificateValidityPeriodDays (default: that field, and 365 days for EtcdCluster machines); they are renewed in place after two thirds of it")
	flag.StringVar(&cpOpts.bootstrapFormat, "bootstrap-format", "cloud-config",
		"format of new machines' bootstrap data: cloud-config, which every infrastructure provider runs; qcp, QCP's own document, only stands in for a manager from before cloud-config, to show that its machines keep running and are replaced")
	flag.DurationVar(&cpOpts.serviceAccountTokenLifetime, "service-account-token-lifetime", agent.ServiceAccountTokenMaxLifetime,
		"how long a service-account key rotation waits, after the last API server stopped signing with the old key, before it distrusts it: the API servers' maximum token lifetime, which the agent sets; tests shorten it, which cuts off tokens of the old key that are still valid")
	flag.DurationVar(&cpOpts.tunables.LearnerStartTimeout, "learner-start-timeout", 0, "how long an added etcd learner may stay unstarted before its machine is replaced (default 5m)")
	flag.DurationVar(&cpOpts.tunables.UnhealthyTimeout, "unhealthy-member-timeout", 0, "how long an etcd voter may stay unhealthy before it is replaced (default 5m)")
	flag.DurationVar(&cpOpts.healthCheckTimeout, "health-check-timeout", controlplane.DefaultHealthCheckTimeout,
		"how long a control plane machine's Node may be not Ready, or a component unhealthy, before the control plane's MachineHealthCheck marks it")
	flag.IntVar(&cpOpts.concurrency, "quorumcontrolplane-concurrency", 10, "how many QuorumControlPlanes are reconciled at once")
	flag.IntVar(&cpOpts.etcdConcurrency, "etcdcluster-concurrency", 10, "how many EtcdClusters are reconciled at once")
	flag.BoolVar(&cpOpts.plan.SkipLeaderTransfer, "measure-without-leader-transfer", false,
		"benchmarks only, never in production: QuorumControlPlanes remove an etcd leader without moving leadership first, to measure the write gap leader transfer saves")
	// Milliseconds, not RFC 3339's whole seconds: steps, member changes and
	// a client's write gaps are told apart in the log by tens of ms.
	opts := zap.Options{TimeEncoder: zapcore.ISO8601TimeEncoder}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	if showVer {
		fmt.Println("qcp-manager", version.Get())
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	klog.SetLogger(ctrl.Log)
	if machineImage != "" {
		agent, binDir := images.Paths(machineImage)
		processOpts.AgentPath = cmp.Or(processOpts.AgentPath, agent)
		processOpts.BinDir = cmp.Or(processOpts.BinDir, binDir)
	}
	if err := run(metricsAddr, healthAddr, profilerAddr, leaderElect, machineNetwork, processOpts, webhookOpts, cpOpts); err != nil {
		ctrl.Log.Error(err, "qcp-manager failed")
		os.Exit(1)
	}
}

// controlPlaneOptions configure the QuorumControlPlane controller.
type controlPlaneOptions struct {
	controllers map[string]bool
	// namespace and watchFilter limit what every controller reconciles.
	namespace                   string
	watchFilter                 engine.WatchFilter
	kubeconfigLifetime          time.Duration
	serviceAccountTokenLifetime time.Duration
	etcdClientLifetime          time.Duration
	// machineCertificateLifetime overrides the machines' leaf validity.
	machineCertificateLifetime time.Duration
	// bootstrapFormat is the format of new machines' bootstrap data.
	bootstrapFormat    string
	healthCheckTimeout time.Duration
	tunables           quorum.Tunables
	// concurrency is how many QuorumControlPlanes, and how many
	// EtcdClusters, are reconciled at once.
	concurrency, etcdConcurrency int
	// plan changes the QuorumControlPlane planner for a measurement.
	plan quorum.Options
}

func (o controlPlaneOptions) runs(name string) bool {
	return o.controllers == nil || o.controllers[name]
}

// The values of --machine-network.
const (
	networkLoopback   = "loopback"
	networkNamespaces = "namespaces"
	networkAuto       = "auto"
)

// completeProcessOptions checks and defaults the process provider's flags,
// which only its controllers need: a manager that runs the control plane
// and EtcdCluster controllers alone (in a Pod, beside another
// infrastructure provider) is given none of them.
func completeProcessOptions(o process.Options, machineNetwork string, cpOpts controlPlaneOptions) (process.Options, error) {
	if !cpOpts.runs("process") {
		return o, nil
	}
	if machineNetwork == networkAuto {
		machineNetwork, o.LoopbackReason = autoMachineNetwork(o.AddressRange, hostnet.Available())
	}
	switch machineNetwork {
	case networkLoopback:
		if o.AddressRange.IsValid() && !o.AddressRange.Addr().IsLoopback() {
			return o, fmt.Errorf("--address-range=%s is not a loopback prefix: give one such as %s, or run the machines on a network of their own with --machine-network=%s", o.AddressRange, process.DefaultAddressRange, networkNamespaces)
		}
		o.LoopbackReason = cmp.Or(o.LoopbackReason, "qcp-manager runs with --machine-network="+networkLoopback)
	case networkNamespaces:
		if err := hostnet.Available(); err != nil {
			return o, fmt.Errorf("--machine-network=%s: %w; run qcp-manager as root, or use --machine-network=%s", networkNamespaces, err, networkLoopback)
		}
		r := cmp.Or(o.AddressRange, hostnet.DefaultPrefix)
		if r.Addr().IsLoopback() {
			return o, fmt.Errorf("--address-range=%s: the machines' network cannot be a loopback prefix; give a private one such as %s", r, hostnet.DefaultPrefix)
		}
		o.Network = hostnet.ForRange(r)
	default:
		return o, fmt.Errorf("--machine-network=%s: choose %s, %s or %s", machineNetwork, networkAuto, networkLoopback, networkNamespaces)
	}

	if o.MachineRoot == "" {
		return o, fmt.Errorf("--machine-root is required with the process controllers: name the directory that holds the process machines, or leave the controllers out with --controllers")
	}
	if o.BinDir == "" {
		dir, err := binaries.Dir()
		if err != nil {
			return o, err
		}
		o.BinDir = dir
	}
	if o.AgentPath == "" {
		self, err := os.Executable()
		if err != nil {
			return o, err
		}
		o.AgentPath = filepath.Join(filepath.Dir(self), "qcp-agent")
	}
	return o, nil
}

// autoMachineNetwork is what --machine-network=auto chooses, given the
// address range asked for (if any) and whether network namespaces can be
// made here (hostnet.Available's error): namespaces when they can be and
// the range is not a loopback one, else loopback and why, for the
// machines' OwnNetwork condition.
func autoMachineNetwork(addressRange netip.Prefix, unavailable error) (network, loopbackReason string) {
	switch {
	case addressRange.IsValid() && addressRange.Addr().IsLoopback():
		return networkLoopback, fmt.Sprintf("qcp-manager's --address-range=%s is a loopback prefix", addressRange)
	case unavailable != nil:
		return networkLoopback, fmt.Sprintf("qcp-manager cannot make network namespaces here (%v)", unavailable)
	}
	return networkNamespaces, ""
}

func run(metricsAddr, healthAddr, profilerAddr string, leaderElect bool, machineNetwork string, processOpts process.Options, webhookOpts webhook.Options, cpOpts controlPlaneOptions) error {
	if f := cpOpts.bootstrapFormat; f != cloudinit.Format && f != bootstrap.Format {
		return fmt.Errorf("--bootstrap-format=%s: use %s (or %s, QCP's format before cloud-config)", f, cloudinit.Format, bootstrap.Format)
	}
	processOpts, err := completeProcessOptions(processOpts, machineNetwork, cpOpts)
	if err != nil {
		return err
	}
	processOpts.WatchFilter = cpOpts.watchFilter
	var cacheOpts cache.Options
	if cpOpts.namespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{cpOpts.namespace: {}}
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading the management cluster's kubeconfig (set --kubeconfig): %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.New(),
		Cache:                  cacheOpts,
		Client:                 clientOptions(),
		WebhookServer:          webhook.NewServer(webhookOpts),
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: healthAddr,
		PprofBindAddress:       profilerAddr,
		LeaderElection:         leaderElect,
		LeaderElectionID:       "qcp-manager.qcp.dev",
		// client-go's default spam filter passes 25 events per object,
		// then one every 5 minutes: a control plane's creation alone
		// takes about 25 steps, so the events of every step after it (a
		// rollout, a remediation, a NOSPACE recovery) were dropped. The
		// manager lives as long as its process, which is the lifetime
		// this deprecated option asks for.
		EventBroadcaster: record.NewBroadcasterWithCorrelatorOptions(record.CorrelatorOptions{BurstSize: eventBurst, QPS: eventQPS}), //nolint:staticcheck
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	if cpOpts.runs("process") {
		if err := process.Setup(mgr, processOpts); err != nil {
			return err
		}
		if processOpts.Network != nil {
			ctrl.Log.Info("process machines are network hosts of their own", "network", processOpts.Network.Prefix.String(), "bridge", processOpts.Network.Bridge)
		} else {
			ctrl.Log.Info("process machines share the host's loopback network", "why", processOpts.LoopbackReason)
		}
	}
	if cpOpts.runs("controlplane") {
		if err := setupControlPlane(ctx, mgr, cpOpts); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if webhookOpts.Port != 0 {
		if err := webhooks.Setup(mgr); err != nil {
			return err
		}
		// Ready means admitting too: the local environment installs the
		// webhook configurations once this answers.
		if err := mgr.AddReadyzCheck("webhooks", mgr.GetWebhookServer().StartedChecker()); err != nil {
			return err
		}
	}
	ctrl.Log.Info("starting qcp-manager", "version", version.Get())
	return mgr.Start(ctx)
}

// clientOptions are the manager client's: it caches unstructured objects
// too, as CAPI's managers do, so that the infrastructure template each
// round of each control plane reads (engine.GetTemplate) is served by an
// informer, not by a GET on the management API server. The controllers
// may list and watch every infrastructure kind, as KCP's may.
func clientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{Unstructured: true}}
}

// setupControlPlane registers the QuorumControlPlane controller, with the
// ClusterCache it reaches workload clusters through and the etcd client pool.
func setupControlPlane(ctx context.Context, mgr ctrl.Manager, o controlPlaneOptions) error {
	cache, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient:     mgr.GetClient(),
		WatchFilterValue: string(o.watchFilter),
		Client:           clustercache.ClientOptions{UserAgent: "qcp-manager", Cache: clustercache.ClientCacheOptions{}},
	}, controller.Options{MaxConcurrentReconciles: 2})
	if err != nil {
		return fmt.Errorf("setting up the cluster cache: %w", err)
	}
	failpoints := engine.FailpointsFromEnv()
	if len(failpoints) > 0 {
		ctrl.Log.Info("Failpoints armed: qcp-manager kills itself on reaching one", "failpoints", os.Getenv(engine.FailpointsEnv))
	}
	pool := etcd.NewPool()
	r := &controlplane.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cache, Etcd: pool,
		Recorder:           mgr.GetEventRecorderFor("quorumcontrolplane-controller"),
		KubeconfigLifetime: o.kubeconfigLifetime, Tunables: o.tunables, Failpoints: failpoints,
		HealthCheckTimeout: o.healthCheckTimeout, Concurrency: o.concurrency, PlanOptions: o.plan,
		EtcdClientLifetime: o.etcdClientLifetime, MachineCertificateLifetime: o.machineCertificateLifetime,
		WatchFilter: o.watchFilter, ServiceAccountTokenLifetime: o.serviceAccountTokenLifetime, BootstrapFormat: o.bootstrapFormat,
	}
	if o.plan.SkipLeaderTransfer {
		ctrl.Log.Info("Measurement mode: QuorumControlPlanes remove etcd leaders without moving leadership first (--measure-without-leader-transfer); never run this in production")
	}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	ec := &etcdcluster.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Etcd: pool,
		Recorder: mgr.GetEventRecorderFor("etcdcluster-controller"),
		Tunables: o.tunables, Failpoints: failpoints, Concurrency: o.etcdConcurrency,
		EtcdClientLifetime: o.etcdClientLifetime, MachineCertificateLifetime: o.machineCertificateLifetime,
		WatchFilter: o.watchFilter, BootstrapFormat: o.bootstrapFormat,
	}
	return ec.SetupWithManager(ctx, mgr)
}
