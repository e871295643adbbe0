package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/procfs"

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
// in place, and says why once the build failed.
func BinaryBuilding(name string) bool {
	pin, ok := pinned[name]
	if !ok {
		return false
	}
	_, ok = buildPID(pin.binary, pin.version)
	return ok
}

// BuildTicks returns the CPU the builds beside the tests have used so far,
// in clock ticks (as /proc/stat counts them): every process of each build
// that runs (its marker names the build's first process), with what the
// children they reaped used. test/e2e's scenario queue counts it as CPU to
// spare, as the build runs at the lowest priority and yields it. It falls
// back to 0 once the builds have ended.
func BuildTicks() uint64 {
	roots := map[int]bool{}
	for _, pin := range pinned {
		if pid, ok := buildPID(pin.binary, pin.version); ok {
			roots[pid] = true
		}
	}
	if len(roots) == 0 {
		return 0
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return 0
	}
	stats := map[int]procfs.ProcStat{}
	for _, p := range procs {
		if st, err := p.Stat(); err == nil {
			stats[st.PID] = st
		}
	}
	var ticks uint64
	for pid, st := range stats {
		// A process of a build has the build's first process among its
		// ancestors (or is it).
		for p, seen := pid, 0; p > 1 && seen < len(stats); p, seen = stats[p].PPID, seen+1 {
			if roots[p] {
				ticks += uint64(st.UTime+st.STime) + uint64(st.CUTime+st.CSTime)
				break
			}
			if _, ok := stats[p]; !ok {
				break
			}
		}
	}
	return ticks
}

// buildPID is the first process of the build of binary at version that
// runs beside the tests, and false when none runs: no marker, a failed
// build's, or one whose process is gone (a run that was interrupted).
func buildPID(binary, version string) (int, bool) {
	state, _ := buildState(binary, version)
	pid, ok := strings.CutPrefix(state, "building ")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(pid)
	if err != nil {
		return 0, false
	}
	_, err = os.Stat(fmt.Sprintf("/proc/%d", n))
	return n, err == nil
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
