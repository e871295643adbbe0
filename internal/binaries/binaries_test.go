package binaries_test

import (
	"debug/buildinfo"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// TestPinnedBinariesReportTheirVersions runs each pinned binary and checks
// the version it reports, so that a wrong build never passes for the pinned one.
func TestPinnedBinariesReportTheirVersions(t *testing.T) {
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

// TestSecondMakeBinariesRebuildsNothing runs `make binaries` again and checks
// that no pinned binary was rewritten.
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
	before := map[string]time.Time{}
	for _, name := range pinned {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%s missing: run `make binaries` first: %v", name, err)
		}
		before[name] = st.ModTime()
	}
	cmd := exec.Command("make", "-C", filepath.Dir(dir), "binaries")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make binaries: %v\n%s", err, out)
	}
	t.Logf("second `make binaries` took %s", time.Since(start).Round(time.Millisecond))
	if strings.Contains(string(out), ">> building") {
		t.Errorf("make binaries rebuilt a pinned binary:\n%s", out)
	}
	for _, name := range pinned {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !st.ModTime().Equal(before[name]) {
			t.Errorf("%s was rewritten", name)
		}
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
