package testkit

import (
	"os"
	"testing"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// RequireBinariesEnv, set to 1 (as `make test` does) or CI set to true,
// turns a missing pinned binary into a test failure.
const RequireBinariesEnv = "QCP_REQUIRE_BINARIES"

// pinned are the default versions of the binaries tests can ask for.
var pinned = map[string]string{
	"etcd":         binaries.EtcdVersion,
	"kube":         binaries.KubeVersion,
	"capi-manager": binaries.CAPIVersion,
}

// RequireBinaries skips t when one of the named pinned binaries (etcd,
// kube, capi-manager) is not built, so a fresh clone can run what needs
// none. Under CI or `make test` it fails t instead: there a skip would let
// a green run hide a path nobody tested.
func RequireBinaries(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		version, ok := pinned[name]
		if !ok {
			t.Fatalf("no pinned version of %q", name)
		}
		if _, err := binaries.Path(name, version); err != nil {
			if os.Getenv(RequireBinariesEnv) == "1" || os.Getenv("CI") == "true" {
				t.Fatal(err)
			}
			t.Skip(err)
		}
	}
}
