package localenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/qcp-dev/qcp/images"
	"github.com/qcp-dev/qcp/internal/binaries"
)

// ManagerOptions configures a qcp-manager child process.
type ManagerOptions struct {
	// Path of the qcp-manager binary; default bin/qcp-manager.
	Path string
	// MachineRoot holds the process machines; default <Dir>/machines.
	MachineRoot string
	// MetricsAddr is where the manager serves Prometheus metrics; default a
	// free loopback port, which the returned Process names.
	MetricsAddr string
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
	// Env is added to the manager's environment, e.g. QCP_FAILPOINTS.
	Env []string
	// MayKillItself is for a manager with a failpoint armed: it may reach
	// the failpoint, and SIGKILL itself, before StartManager has seen it
	// ready or its webhooks called. StartManager then returns the killed
	// process without error. Any other exit is still an error.
	MayKillItself bool
	// EditRoles, if set, edits a copy of the release's roles before the
	// manager's ServiceAccount is bound to them: a test takes away a
	// permission the manager needs. The next start without it restores them.
	EditRoles func([]rbacv1.ClusterRole)
}

// StartManager starts qcp-manager against this management cluster, waits
// until it is ready, and then installs QCP's admission webhooks, served by
// it, and waits until the API server calls them. From then on every write of
// a QuorumControlPlane needs a running qcp-manager, as in a real deployment.
// The caller stops it with Stop; a test can stop and start it again to check
// that machines outlive the manager. One qcp-manager runs at a time: each
// serves the webhooks on the same port. It runs as its ServiceAccount, with
// the release's roles (managerKubeconfig), not as an administrator.
func (e *Env) StartManager(ctx context.Context, opts ManagerOptions) (*Process, error) {
	binDir, err := binaries.Dir()
	if err != nil {
		return nil, err
	}
	if opts.Path == "" {
		opts.Path = filepath.Join(binDir, "qcp-manager")
	}
	if opts.MachineRoot == "" {
		opts.MachineRoot = e.MachineRoot()
	}
	roles, err := ManagerRoles()
	if err != nil {
		return nil, err
	}
	if opts.EditRoles != nil {
		opts.EditRoles(roles)
	}
	kubeconfig, err := e.managerKubeconfig(ctx, roles)
	if err != nil {
		return nil, err
	}
	installed, err := e.installedQCPArgs(ctx)
	if err != nil {
		return nil, err
	}
	image, err := e.installMachineImage(binDir, opts.Path)
	if err != nil {
		return nil, err
	}
	machineArg := "--machine-image=" + image
	if image == "" {
		machineArg = "--bin-dir=" + binDir
	}
	// The metrics address is the caller's if given, else the first port.
	metricsAddr := opts.MetricsAddr
	start := func(addrs []string) (*Process, error) {
		if opts.MetricsAddr == "" {
			metricsAddr = addrs[0]
		}
		args := append([]string{
			"--kubeconfig=" + kubeconfig,
			"--machine-root=" + opts.MachineRoot,
			machineArg,
			"--metrics-bind-address=" + metricsAddr,
			"--health-probe-bind-address=" + addrs[1],
			"--leader-elect=false",
			// Loopback addresses unless the caller asks for a network
			// (ExtraArgs come later and win): qcp-manager's default, auto,
			// would give every management cluster a test starts, as root,
			// the same default network and bridge.
			"--machine-network=loopback",
		}, e.qcpWebhookArgs()...)
		args = overrideArgs(installed, append(args, opts.ExtraArgs...))
		return StartProcess("qcp-manager", opts.Path, args, append([]string{"KUBE_FEATURE_WatchListClient=false"}, opts.Env...), e.Dir)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	p, _, err := e.startOnFreePorts(ctx, "qcp-manager", 2, start, func(addrs []string) string { return "http://" + addrs[1] + "/readyz" })
	if err != nil {
		if opts.MayKillItself && p != nil && p.Killed() {
			e.managers = append(e.managers, p)
			return p, nil
		}
		return nil, fmt.Errorf("qcp-manager did not become ready (log: %s/qcp-manager.log): %w", e.Dir, err)
	}
	p.MetricsAddr = metricsAddr
	e.managers = append(e.managers, p)
	if err := e.installQCPWebhooks(ctx, p); err != nil {
		if opts.MayKillItself && p.Killed() {
			return p, nil
		}
		return nil, err
	}
	return p, nil
}

// installMachineImage installs the tree the process machines boot from,
// with images/install.sh, as a cloud's machines boot from their image and
// not from bin/; it runs on every start. The agent is the one next to the
// manager (qcp-manager's own default), else bin/'s. Without either (a
// stand-in manager in a test) there is no image (""), and the manager is
// given bin/.
func (e *Env) installMachineImage(binDir, manager string) (string, error) {
	agent := filepath.Join(filepath.Dir(manager), "qcp-agent")
	if _, err := os.Stat(agent); err != nil {
		agent = filepath.Join(binDir, "qcp-agent")
	}
	if _, err := os.Stat(agent); err != nil {
		return "", nil
	}
	image := filepath.Join(e.Dir, "machine-image")
	if err := images.Install(image, binDir, agent); err != nil {
		return "", err
	}
	e.imageMu.Lock()
	e.imageBinDir, e.imageAgent = binDir, agent
	e.imageMu.Unlock()
	return image, nil
}

// UpdateMachineImage installs the machine image again from the bin
// directory and agent its manager last installed it from, as an image
// rebuilt with another version: the machines created after it can run a
// pinned binary built after the manager started (`make test` builds the
// version upgrades start from beside the tests). The machines that run
// keep their binaries. Without an image (a stand-in manager), nothing.
func (e *Env) UpdateMachineImage() error {
	e.imageMu.Lock()
	binDir, agent := e.imageBinDir, e.imageAgent
	e.imageMu.Unlock()
	if binDir == "" {
		return nil
	}
	return images.Install(filepath.Join(e.Dir, "machine-image"), binDir, agent)
}

// qcpDeployments are the Deployments of QCP's two providers in the release.
var qcpDeployments = [][2]string{
	{"qcp-control-plane-system", "qcp-control-plane-controller-manager"},
	{"qcp-infrastructure-process-system", "qcp-infrastructure-process-controller-manager"},
}

// installedQCPArgs are, with a release installed, the arguments of both
// QCP providers' Deployments, which one qcp-manager process runs here: the
// first of each flag, without --controllers (the process runs both
// providers' controllers unless the caller says otherwise). StartManager
// overrides the host's ports, certificates, kubeconfig, machine root and
// leader election, as for CAPI core (capiManagerArgs). Without a release,
// none.
func (e *Env) installedQCPArgs(ctx context.Context) ([]string, error) {
	if e.opts.Repository == "" {
		return nil, nil
	}
	var args []string
	seen := map[string]bool{"--controllers": true}
	for _, d := range qcpDeployments {
		if d[0] == "qcp-infrastructure-process-system" && e.opts.WithoutProcessProvider {
			continue
		}
		_, container, err := e.installedManager(ctx, d[0], d[1])
		if err != nil {
			return nil, err
		}
		for _, a := range container.Args {
			if !seen[flagName(a)] {
				seen[flagName(a)] = true
				args = append(args, a)
			}
		}
	}
	return args, nil
}
