package localenv

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
