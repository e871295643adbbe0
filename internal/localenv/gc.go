package localenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// gcControllers are the kube-controller-manager controllers the management
// cluster runs. Its API objects rely on the garbage collector, as in kind:
// Secrets owned by a Machine or a QuorumControlPlane go with their owner.
// The namespace controller costs nothing until a namespace is deleted, and
// without it a deleted namespace stays Terminating for ever. The
// ClusterRole aggregation controller fills the aggregated roles a release
// binds its managers to (CAPI core's, CABPK's and QCP's), which stay empty
// without it. Everything else acts on Pods, Nodes and workloads the
// management cluster does not run.
var gcControllers = []string{"garbage-collector-controller", "namespace-controller", "clusterrole-aggregation-controller"}

// startControllerManager starts kube-controller-manager from the pinned kube
// binary with only gcControllers, and returns once it answers /healthz. That
// is before the garbage collector has listed every resource; it collects
// from then on, as in a cluster that just started.
func (e *Env) startControllerManager(ctx context.Context, opts Options) error {
	kubePath, err := binaries.Path("kube", opts.KubeVersion)
	if err != nil {
		return err
	}
	// The multi-call binary picks its component from the name it is run by,
	// which is also the name process listings show.
	link := filepath.Join(e.Dir, "kube-controller-manager")
	_ = os.Remove(link)
	if err := os.Symlink(kubePath, link); err != nil {
		return fmt.Errorf("linking kube-controller-manager: %w", err)
	}
	start := func(addrs []string) (*Process, error) {
		host, port, _ := strings.Cut(addrs[0], ":")
		args := []string{
			"--kubeconfig=" + e.Kubeconfig,
			"--leader-elect=false",
			"--controllers=" + strings.Join(gcControllers, ","),
			// It serves only /healthz to us, on a loopback port of its own
			// rather than the well-known 10257 that another environment or
			// a workload cluster may hold.
			"--bind-address=" + host,
			"--secure-port=" + port,
			// As for the CAPI core manager: against a fresh apiserver the
			// watch-list client only delays the garbage collector's first
			// sync.
			"--feature-gates=WatchListClient=false",
		}
		return StartProcess("kube-controller-manager", link, args, nil, e.Dir)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if e.gc, _, err = e.startOnFreePorts(ctx, "kube-controller-manager", 1, start, func(addrs []string) string { return "https://" + addrs[0] + "/healthz" }); err != nil {
		return fmt.Errorf("kube-controller-manager did not become healthy (log: %s/kube-controller-manager.log): %w", e.Dir, err)
	}
	return nil
}

// ControllerManager returns the kube-controller-manager process that runs
// the garbage collector, or nil if it is not running.
func (e *Env) ControllerManager() *Process { return e.gc }
