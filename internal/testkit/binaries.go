package testkit

import (
	"os"
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
			if os.Getenv(RequireBinariesEnv) == "1" || os.Getenv("CI") == "true" {
				t.Fatal(err)
			}
			t.Skip(err)
		}
	}
}
