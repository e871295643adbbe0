// Package process holds the process infrastructure provider's controllers:
// ProcessCluster (failure domains and a load balancer process) and
// ProcessMachine (a qcp-agent process tree per machine).
package process

import (
	"fmt"
	"net/netip"
	"path/filepath"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/hostcgroup"
	"github.com/qcp-dev/qcp/internal/hostnet"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// Options configures the process provider.
type Options struct {
	// MachineRoot holds one directory per machine and load balancer.
	MachineRoot string
	// BinDir holds the pinned binaries the machines run.
	BinDir string
	// AgentPath is the qcp-agent binary.
	AgentPath string
	// AddressRange is where machine and load balancer addresses come from:
	// loopback addresses, or with Network its range.
	AddressRange netip.Prefix
	// Network, when set, makes each machine and load balancer a network
	// host of its own: a network namespace on Network's bridge, where
	// partitions can be made (machinehost.Isolate). Its range is
	// the addresses'.
	Network *hostnet.Network
	// LoopbackReason says why the machines run on loopback addresses when
	// Network is nil (a flag, or no root), for their OwnNetwork condition.
	LoopbackReason string
	// WatchFilter limits the controllers to the objects it admits.
	WatchFilter engine.WatchFilter
}

// DefaultAddressRange keeps process machines clear of 127.0.0.1 and of the
// ranges tests use for bare etcd clusters.
var DefaultAddressRange = netip.MustParsePrefix("127.20.0.0/16")

// Setup registers the process provider's controllers with mgr.
func Setup(mgr ctrl.Manager, opts Options) error {
	if !opts.AddressRange.IsValid() {
		opts.AddressRange = DefaultAddressRange
	}
	host := &machinehost.Host{Root: opts.MachineRoot, BinDir: opts.BinDir, AgentPath: opts.AgentPath}
	// Cgroups wherever they can be made: a freeze then stops a machine whole,
	// and spec.memory can size it. Without them (no root) a freeze falls
	// back to SIGSTOP, and a machine with spec.memory does not start.
	if err := hostcgroup.Available(); err == nil {
		host.Cgroups = true
	} else {
		ctrl.Log.WithName("process").Info("process machines get no cgroups of their own: a freeze stops them by SIGSTOP, and spec.memory cannot be applied", "why", err.Error())
	}
	if opts.Network != nil {
		if err := opts.Network.Ensure(); err != nil {
			return fmt.Errorf("creating the machines' network (bridge %s, %s): %w", opts.Network.Bridge, opts.Network.Prefix, err)
		}
		host.Network, opts.AddressRange = opts.Network, opts.Network.Prefix
	}
	addrs := &Addresses{Dir: filepath.Join(opts.MachineRoot, ".addresses"), Prefix: opts.AddressRange}
	m := newProviderMetrics().register()
	if err := (&ClusterReconciler{Client: mgr.GetClient(), Host: host, Addresses: addrs, metrics: m, WatchFilter: opts.WatchFilter,
		Recorder: mgr.GetEventRecorderFor("processcluster-controller")}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ProcessCluster controller: %w", err)
	}
	if err := (&MachineReconciler{Client: mgr.GetClient(), Host: host, Addresses: addrs, metrics: m, WatchFilter: opts.WatchFilter, LoopbackReason: opts.LoopbackReason,
		Recorder: mgr.GetEventRecorderFor("processmachine-controller")}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ProcessMachine controller: %w", err)
	}
	return nil
}
