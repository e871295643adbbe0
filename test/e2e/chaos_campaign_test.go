//go:build chaos

package e2e

import (
	"cmp"
	"os"
	"path/filepath"
	"strconv"
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
func TestChaos(t *testing.T) {
	mgmt := requireShared(t)
	replay := os.Getenv("QCP_CHAOS_SEED") != ""
	runs, first := envNumber(t, "QCP_CHAOS_RUNS", 3), envNumber(t, "QCP_CHAOS_SEED", uint64(time.Now().UnixNano()%1_000_000))
	seeds := chaos.Seeds(first, runs, replay)
	t.Logf("chaos campaign: seeds %v (replay one with QCP_CHAOS_SEED=<seed> QCP_CHAOS_RUNS=1)", seeds)
	out, err := os.OpenFile(filepath.Join(cmp.Or(os.Getenv("QCP_BIN_DIR"), os.TempDir()), "chaos.jsonl"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	campaign(t, mgmt, seeds, out)
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
