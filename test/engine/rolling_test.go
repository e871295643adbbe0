package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// rollingFigures are what the rolling replacement measures.
type rollingFigures struct {
	Scenario       string  `json:"scenario"`
	LeaderTransfer bool    `json:"leader_transfer"`
	MaxWriteGapMs  float64 `json:"max_write_gap_ms"`
	FailedWrites   int     `json:"failed_write_attempts"`
	UnknownWrites  int     `json:"unknown_writes"`
	AckedWrites    int     `json:"acknowledged_writes"`
	RolloutSeconds float64 `json:"rollout_seconds"`
	MoveLeaders    int     `json:"move_leader_steps"`
	LeaderRemovals int     `json:"leader_removals"`
}

func (f rollingFigures) json() string {
	b, _ := json.Marshal(f)
	return string(b)
}

func modeName(noTransfer bool) string {
	if noTransfer {
		return "without-leader-transfer"
	}
	return "with-leader-transfer"
}

// rolloutScope runs the cleanups registered during one rollout when the
// rollout ends, so that a benchmark's rollouts do not keep each other's
// etcd members running and skew the later ones.
type rolloutScope struct {
	testing.TB
	cleanups []func()
}

func (s *rolloutScope) Cleanup(f func()) { s.cleanups = append(s.cleanups, f) }

func (s *rolloutScope) close() {
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		s.cleanups[i]()
	}
}

// rollingReplacement bootstraps three members, then marks every machine
// outdated and lets the planner replace them one by one while the writer
// runs. With noTransfer the planner skips MoveLeader (see driverOptions),
// so the leader's member is removed while it leads. Everything the rollout
// started is stopped when it returns.
func rollingReplacement(tb testing.TB, noTransfer bool) rollingFigures {
	t := &rolloutScope{TB: tb}
	defer t.close()
	ctx := context.Background()
	d := newDriver(t, "roll", driverOptions{noLeaderTransfer: noTransfer})
	d.converge(ctx, 3, phaseTimeout)
	original := map[string]bool{}
	for _, mc := range d.machines {
		original[mc.name] = true
	}
	tr := startTraffic(t, d)
	for _, mc := range d.machines {
		mc.upToDate = false
	}
	from := len(d.steps)
	start := time.Now()
	d.converge(ctx, 3, 3*phaseTimeout)
	rollout := time.Since(start)
	r := tr.stop(t, ctx)
	if t.Failed() || testing.Verbose() {
		logSteps(t, d)
	}
	for _, mc := range d.machines {
		if original[mc.name] {
			t.Errorf("machine %s survived the rolling replacement", mc.name)
		}
	}
	moves := 0
	for _, s := range d.steps[from:] {
		if strings.Contains(s, "MoveLeader(") {
			moves++
		}
	}
	switch {
	case !noTransfer && (moves == 0 || d.leaderRemovals > 0):
		t.Errorf("with leader transfer: %d MoveLeader steps and %d members removed while leading; want at least one move and no such removal", moves, d.leaderRemovals)
	case noTransfer && (moves > 0 || d.leaderRemovals == 0):
		t.Errorf("without leader transfer: %d MoveLeader steps and %d members removed while leading; want no move and at least one such removal", moves, d.leaderRemovals)
	}
	return rollingFigures{
		Scenario: "rolling-replacement-3", LeaderTransfer: !noTransfer,
		MaxWriteGapMs: float64(r.MaxWriteGap.Microseconds()) / 1000, FailedWrites: r.FailedAttempts,
		UnknownWrites: r.UnknownWrites, AckedWrites: r.Writes, RolloutSeconds: rollout.Seconds(), MoveLeaders: moves,
		LeaderRemovals: d.leaderRemovals,
	}
}

// BenchmarkRollingReplacement reports the write gap and failed writes of a
// rolling replacement of 3 members, with and without leader transfer. Each
// iteration is a whole rollout; run with -benchtime=Nx.
func BenchmarkRollingReplacement(b *testing.B) {
	for _, noTransfer := range []bool{false, true} {
		b.Run(modeName(noTransfer), func(b *testing.B) {
			var gapSum, gapMax, failed, rollout float64
			for range b.N {
				f := rollingReplacement(b, noTransfer)
				// One JSON line per rollout on stdout, for `make bench`
				// to collect; b.Log output is truncated for benchmarks.
				fmt.Println(f.json())
				gapSum += f.MaxWriteGapMs
				gapMax = max(gapMax, f.MaxWriteGapMs)
				failed += float64(f.FailedWrites)
				rollout += f.RolloutSeconds
			}
			n := float64(b.N)
			b.ReportMetric(gapSum/n, "max-write-gap-ms")
			b.ReportMetric(gapMax, "worst-write-gap-ms")
			b.ReportMetric(failed/n, "failed-writes")
			b.ReportMetric(rollout/n, "rollout-s")
		})
	}
}
