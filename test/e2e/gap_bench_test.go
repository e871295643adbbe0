package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// withoutLeaderTransfer is qcp-manager's measurement flag: leaders are
// removed without moving leadership first.
const withoutLeaderTransfer = "--measure-without-leader-transfer"

// BenchmarkRolloutWriteGap measures, on the shared management cluster, the
// longest time without an acknowledged write and the failed write attempts
// while the real controller replaces all 3 machines of a control plane
// (rollout.after), through CAPI core: once as QCP runs, moving leadership
// before it removes a leader, and once with qcp-manager started again with
// --measure-without-leader-transfer. It also reports the rollout's wall
// time over the sum of the new machines' start-up times.
//
// Both rollouts must keep the history linearizable and lose no write; the
// one with leader transfer must remove no member while it leads, and the
// other must have removed at least one, or it measured nothing. (The
// election that follows such a removal holds the monitor's member list
// requests, so it usually sees the leader gone across a sample gap, which
// it cannot judge: both count here.)
func BenchmarkRolloutWriteGap(b *testing.B) {
	if shared == nil {
		b.Skip("needs the shared management cluster (not with -short)")
	}
	b.Cleanup(func() { setLeaderTransfer(b, shared, true) })
	for i := range b.N {
		for _, transfer := range []bool{true, false} {
			mode := "transfer"
			if !transfer {
				mode = "no-transfer"
			}
			setLeaderTransfer(b, shared, transfer)
			s := newScenario(b, shared, fmt.Sprintf("gap-%s-%d", mode, i), 3)
			s.waitAvailable(convergeTimeout, 3)
			s.writerPause = 20 * time.Millisecond // gaps measured to tens of milliseconds
			s.startTraffic(3)
			before := s.machineNames()
			start := time.Now()
			s.rollOut(func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Rollout.After = metav1.Now() }, nil)
			wall := time.Since(start)

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			wr, mr := s.stopTraffic(ctx)
			cancel()
			s.logGapSteps(wr)
			b.Logf("%s: leaders removed while leading %v, and gone across a sample gap %v", mode, mr.LeadersRemoved, mr.LeadersGoneInGaps)
			switch {
			case transfer && len(mr.LeadersRemoved) > 0:
				b.Errorf("with leader transfer, members were removed while they led: %v", mr.LeadersRemoved)
			case !transfer && len(mr.LeadersRemoved)+len(mr.LeadersGoneInGaps) == 0:
				b.Errorf("without leader transfer no leader was seen removed: the rollout measured nothing")
			}
			b.ReportMetric(float64(wr.MaxWriteGap)/float64(time.Millisecond), "max-gap-ms-"+mode)
			b.ReportMetric(float64(wr.FailedAttempts), "failed-writes-"+mode)
			b.ReportMetric(float64(len(mr.LeadersRemoved)), "leaders-removed-"+mode)
			b.ReportMetric(float64(len(mr.LeadersGoneInGaps)), "leaders-gone-in-gaps-"+mode)
			if transfer {
				b.ReportMetric(wall.Seconds(), "rollout-s")
				b.ReportMetric(wall.Seconds()/s.startupSum(before).Seconds(), "rollout-ratio")
			}
			s.finish()
			s.deleteCluster()
		}
	}
}

// setLeaderTransfer starts qcp-manager again, with or without the
// measurement flag, unless it already runs that way.
func setLeaderTransfer(tb testing.TB, m *management, transfer bool) {
	tb.Helper()
	args := slices.DeleteFunc(slices.Clone(m.managerArgs), func(a string) bool { return a == withoutLeaderTransfer })
	if !transfer {
		args = append(args, withoutLeaderTransfer)
	}
	if slices.Equal(args, m.managerArgs) {
		return
	}
	if err := m.manager.Stop(); err != nil {
		tb.Fatal(err)
	}
	m.managerArgs = args
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := m.startManager(ctx, ""); err != nil {
		tb.Fatal(err)
	}
}
