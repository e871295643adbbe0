package localenv

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/machinehost"
)

// StartForTest starts a local management cluster for t and stops it when t
// ends, whether it passed or not.
func StartForTest(t testing.TB, opts Options) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a management cluster; not run with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting the local management cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the local management cluster: %v", err)
		}
	})
	return env
}

// BuildForTest builds the named commands of this module (e.g. "qcp-manager")
// into a temporary directory and returns it, so that a test runs the code it
// was compiled with rather than whatever bin/ holds.
func BuildForTest(t testing.TB, cmds ...string) string {
	t.Helper()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("finding the module root: %v", err)
	}
	dir := t.TempDir()
	args := []string{"build", "-o", dir + "/"}
	for _, cmd := range cmds {
		args = append(args, "./cmd/"+cmd)
	}
	build := exec.Command("go", args...)
	build.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %v: %v\n%s", cmds, err, out)
	}
	return dir
}

// processNames are the names of the processes a running environment with a
// qcp-manager has.
var processNames = []string{"etcd", "kube-apiserver", "kube-controller-manager", "capi-manager", "qcp-manager"}

// MissingProcesses names the environment's processes (etcd, kube-apiserver,
// kube-controller-manager, CAPI core, qcp-manager) that procs lack, so a
// test that checks what Stop or `qcpctl down` ended can first check it saw
// them start.
func MissingProcesses(procs []machinehost.Proc) []string {
	var missing []string
	for _, name := range processNames {
		// /proc cuts command names to 15 characters; a binary's own name
		// may go on with its version (capi-manager-v1.14.2).
		comm := name[:min(len(name), 15)]
		if !slices.ContainsFunc(procs, func(p machinehost.Proc) bool { return strings.HasPrefix(p.Comm, comm) }) {
			missing = append(missing, name)
		}
	}
	return missing
}
