package localenv

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// ManagerOptions configures a qcp-manager child process.
type ManagerOptions struct {
	// Path of the qcp-manager binary; default bin/qcp-manager.
	Path string
	// MachineRoot holds the process machines; default <Dir>/machines.
	MachineRoot string
	// MetricsAddr is where the manager serves Prometheus metrics; default a
	// free loopback port.
	MetricsAddr string
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
}

// StartManager starts qcp-manager against this management cluster, waits
// until it is ready, and then installs QCP's admission webhooks, served by
// it, and waits until the API server calls them. From then on every write of
// a QuorumControlPlane needs a running qcp-manager, as in a real deployment.
// The caller stops it with Stop; a test can stop and start it again to check
// that machines outlive the manager. One qcp-manager runs at a time: each
// serves the webhooks on the same port.
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
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	if opts.MetricsAddr == "" {
		opts.MetricsAddr = addrs[0]
	}
	args := append([]string{
		"--kubeconfig=" + e.Kubeconfig,
		"--machine-root=" + opts.MachineRoot,
		"--bin-dir=" + binDir,
		"--metrics-bind-address=" + opts.MetricsAddr,
		"--health-probe-bind-address=" + addrs[1],
	}, e.qcpWebhookArgs()...)
	args = append(args, opts.ExtraArgs...)
	p, err := StartProcess("qcp-manager", opts.Path, args, []string{"KUBE_FEATURE_WatchListClient=false"}, e.Dir)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	e.managers = append(e.managers, p) // Stop ends it even if it never gets ready
	if err := p.WaitHTTP(ctx, "http://"+addrs[1]+"/readyz"); err != nil {
		return nil, fmt.Errorf("qcp-manager did not become ready (log: %s/qcp-manager.log): %w", e.Dir, err)
	}
	if err := e.installQCPWebhooks(ctx); err != nil {
		return nil, err
	}
	return p, nil
}
