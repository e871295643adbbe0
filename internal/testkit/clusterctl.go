package testkit

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// Clusterctl runs the pinned clusterctl with args and env added to the
// test's environment, with a home of its own (clusterctl keeps state there)
// and without its version check (it would reach for GitHub), and returns its
// standard output. It fails t with clusterctl's standard error.
func Clusterctl(t testing.TB, env []string, args ...string) []byte {
	t.Helper()
	RequireBinaries(t, "clusterctl")
	path, err := binaries.Path("clusterctl", binaries.CAPIVersion)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), append([]string{"HOME=" + t.TempDir(), "CLUSTERCTL_DISABLE_VERSIONCHECK=true"}, env...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("clusterctl %v: %v\n%s", args, err, stderr.String())
	}
	return out
}
