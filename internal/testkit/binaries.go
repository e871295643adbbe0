package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// RequireBinariesEnv, set to 1 (as `make test` does) or CI set to true,
// turns a missing pinned binary into a test failure.
const RequireBinariesEnv = "QCP_REQUIRE_BINARIES"

// pinned are the binaries tests can ask for: a binary and its version.
var pinned = map[string]struct{ binary, version string }{
	"etcd":          {"etcd", binaries.EtcdVersion},
	"kube":          {"kube", binaries.KubeVersion},
	"capi-manager":  {"capi-manager", binaries.CAPIVersion},
	"cabpk-manager": {"cabpk-manager", binaries.CAPIVersion},
	"clusterctl":    {"clusterctl", binaries.CAPIVersion},
	"kube-previous": {"kube", binaries.PreviousKubeVersion},
	"etcd-previous": {"etcd", binaries.PreviousEtcdVersion},
	"versitygw":     {"versitygw", binaries.ObjectStoreVersion},
}

// RequireBinaries skips t when one of the named pinned binaries (etcd,
// kube, capi-manager, cabpk-manager, clusterctl, kube-previous,
// etcd-previous, versitygw) is not built, so a fresh clone can run what needs
// none. Under CI or `make test` it fails t instead: there a skip would let
// a green run hide a path nobody tested.
func RequireBinaries(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		pin, ok := pinned[name]
		if !ok {
			t.Fatalf("no pinned version of %q", name)
		}
		if _, err := binaries.Path(pin.binary, pin.version); err != nil {
			if state, ok := buildState(pin.binary, pin.version); ok {
				err = fmt.Errorf("%w; its build beside the tests: %s", err, state)
			}
			if os.Getenv(RequireBinariesEnv) == "1" || os.Getenv("CI") == "true" {
				t.Fatal(err)
			}
			t.Skip(err)
		}
	}
}

// BinaryBuilding says whether the pinned binary name (as RequireBinaries
// names them) is being built beside the tests: `make test` builds the kube
// version upgrades start from at the lowest CPU priority while the tests
// run, instead of before them, and only the scenarios that need it wait
// for it. While the build runs, <bin>/.<binary>-<version>.building says
// "building <pid>" (hack/build-beside.sh); it is removed once the binary is
// in place, and says why once the build failed. A marker whose process is
// gone (a run that was interrupted) is no build.
func BinaryBuilding(name string) bool {
	pin, ok := pinned[name]
	if !ok {
		return false
	}
	state, ok := buildState(pin.binary, pin.version)
	pid, building := strings.CutPrefix(state, "building ")
	if !ok || !building {
		return false
	}
	_, err := os.Stat("/proc/" + pid)
	return err == nil
}

// buildState reads the marker of a build beside the tests, and false
// without one.
func buildState(binary, version string) (string, bool) {
	dir, err := binaries.Dir()
	if err != nil {
		return "", false
	}
	b, err := os.ReadFile(filepath.Join(dir, "."+binary+"-"+version+".building"))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}
