//go:build chaos

package e2e

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/test/chaos"
)

// TestChaos is the fault campaign of issue 13 (`make chaos`; built only
// with -tags chaos): the regression seeds (chaos.RegressionSeeds), then
// QCP_CHAOS_RUNS runs (3 by default) from a seed of the clock's (logged),
// each outcome one JSON line in $QCP_BIN_DIR/chaos.jsonl. QCP_CHAOS_SEED
// replays: QCP_CHAOS_RUNS runs from that seed, and no others. It kills
// qcp-manager, which every scenario on the shared management cluster
// shares, so run it alone (-run '^TestChaos$').
//
// QCP_CHAOS_FOR (a duration, none by default) bounds the campaign: no run
// starts once it has passed, and the runs going on then finish.
//
// QCP_CHAOS_WORKERS (1 by default) runs that many runs side by side, each
// worker on a management cluster of its own whose machines are network
// hosts (worker n's on 198.18.4<n>.0/24, so that CutPeerTraffic cuts one
// off from its peers), the seeds dealt out in turn: a worker's faults
// strike only its own management cluster and machines.
func TestChaos(t *testing.T) {
	workers := int(max(envNumber(t, "QCP_CHAOS_WORKERS", 1), 1))
	// The workers are parallel subtests, and go test runs at most
	// -parallel of those at once (GOMAXPROCS by default: 2 here); the
	// others would wait, then find the campaign's time up.
	if p, _ := strconv.Atoi(flag.Lookup("test.parallel").Value.String()); p < workers {
		t.Fatalf("QCP_CHAOS_WORKERS=%d, but go test runs only %d parallel subtests at once: add -parallel %d (make chaos does)", workers, p, workers)
	}
	requireShared(t)
	replay := os.Getenv("QCP_CHAOS_SEED") != ""
	runs, first := envNumber(t, "QCP_CHAOS_RUNS", 3), envNumber(t, "QCP_CHAOS_SEED", uint64(time.Now().UnixNano()%1_000_000))
	seeds := chaos.Seeds(first, runs, replay)
	var until time.Time
	if v := os.Getenv("QCP_CHAOS_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("QCP_CHAOS_FOR=%q: %v", v, err)
		}
		until = time.Now().Add(d)
	}
	t.Logf("chaos campaign: seeds %v on %d workers (replay one with QCP_CHAOS_SEED=<seed> QCP_CHAOS_RUNS=1)", seeds, workers)
	out, err := os.OpenFile(filepath.Join(cmp.Or(os.Getenv("QCP_BIN_DIR"), os.TempDir()), "chaos.jsonl"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var mu sync.Mutex
	var outcomes []chaos.Outcome
	t.Run("workers", func(t *testing.T) {
		for w := range workers {
			t.Run(fmt.Sprintf("worker=%d", w), func(t *testing.T) {
				t.Parallel()
				// Each worker on a management cluster of its own whose
				// machines are network hosts, for CutPeerTraffic.
				m := ownNetworkedManagement(t, fmt.Sprintf("198.18.%d.0/24", 40+w), nil)
				var mine []uint64
				for i := w; i < len(seeds); i += workers {
					mine = append(mine, seeds[i])
				}
				got := campaign(t, m, mine, out, until)
				mu.Lock()
				defer mu.Unlock()
				outcomes = append(outcomes, got...)
			})
		}
	})
	if workers > 1 {
		t.Logf("all workers:\n%s", chaos.Summarize(outcomes).Table())
	}
}

func envNumber(t *testing.T, name string, def uint64) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}
