package binaries_test

import (
	"debug/buildinfo"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// TestPinnedBinariesReportTheirVersions runs each pinned binary and checks
// the version it reports, so that a wrong build never passes for the pinned one.
func TestPinnedBinariesReportTheirVersions(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the pinned binaries; not run with -short")
	}
	cases := []struct {
		name, version string
		args          []string
		want          string
	}{
		{"etcd", binaries.EtcdVersion, []string{"--version"}, "etcd Version: " + strings.TrimPrefix(binaries.EtcdVersion, "v")},
		{"kube", binaries.KubeVersion, []string{"kube-apiserver", "--version"}, "Kubernetes " + binaries.KubeVersion},
		{"kube", binaries.KubeVersion, []string{"kube-controller-manager", "--version"}, "Kubernetes " + binaries.KubeVersion},
		{"kube", binaries.KubeVersion, []string{"kube-scheduler", "--version"}, "Kubernetes " + binaries.KubeVersion},
	}
	for _, tc := range cases {
		t.Run(strings.Join(append([]string{tc.name}, tc.args...), " "), func(t *testing.T) {
			out := run(t, tc.name, tc.version, tc.args...)
			if !strings.Contains(out, tc.want) {
				t.Errorf("output %q does not contain %q", out, tc.want)
			}
		})
	}
}

// TestCAPIManagerIsThePinnedVersion reads the CAPI core manager's build
// information: it has no --version flag, so the module it was built from is
// what identifies it here. (The version stamped into it with -ldflags, which
// it logs at start-up, is checked by the localenv tests.)
func TestCAPIManagerIsThePinnedVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the pinned binaries; not run with -short")
	}
	path, err := binaries.Path("capi-manager", binaries.CAPIVersion)
	if err != nil {
		t.Fatal(err)
	}
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Path != "sigs.k8s.io/cluster-api/core" {
		t.Errorf("binary is built from package %q, want sigs.k8s.io/cluster-api/core", info.Path)
	}
	version := ""
	for _, m := range append([]*debug.Module{&info.Main}, info.Deps...) {
		if m.Path == "sigs.k8s.io/cluster-api" {
			version = m.Version
		}
	}
	if version != binaries.CAPIVersion {
		t.Errorf("built from sigs.k8s.io/cluster-api %q, want %s", version, binaries.CAPIVersion)
	}
}

// TestSecondMakeBinariesRebuildsNothing asks make what a second `make
// binaries` would do: nothing for a pinned binary that is already built.
// It asks with -n rather than running make, because other packages' tests
// run these binaries meanwhile and a rebuild would rewrite them under their
// feet.
func TestSecondMakeBinariesRebuildsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make; not run with -short")
	}
	dir, err := binaries.Dir()
	if err != nil {
		t.Fatal(err)
	}
	pinned := []string{
		"etcd-" + binaries.EtcdVersion, "kube-" + binaries.KubeVersion, "capi-manager-" + binaries.CAPIVersion,
	}
	for _, name := range pinned {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("%s missing: run `make binaries` first: %v", name, err)
		}
	}
	cmd := exec.Command("make", "-n", "-C", filepath.Dir(dir), "binaries", "BIN="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n binaries: %v\n%s", err, out)
	}
	for _, builder := range []string{"build-pinned.sh", "controller-gen@"} {
		if strings.Contains(string(out), builder) {
			t.Errorf("a second make binaries would rebuild a pinned binary (%s):\n%s", builder, out)
		}
	}
	// A missing binary must make it build: otherwise the check above
	// cannot fail.
	missing := exec.Command("make", "-n", "-C", filepath.Dir(dir), "binaries", "BIN="+t.TempDir())
	if out, err := missing.CombinedOutput(); err != nil || !strings.Contains(string(out), "build-pinned.sh etcd") {
		t.Errorf("make -n binaries into an empty directory does not build etcd (%v):\n%s", err, out)
	}
}

func run(t *testing.T, name, version string, args ...string) string {
	t.Helper()
	path, err := binaries.Path(name, version)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", path, args, err, out)
	}
	return string(out)
}
