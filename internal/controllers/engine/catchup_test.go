package engine

import (
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/quorum"
)

// TestCatchUpTellsStalledFromSteady: a learner's progress time moves only
// when its lag reaches a new low, so a learner catching up keeps it fresh
// and one that does not (however far its own index moves) keeps the old one.
func TestCatchUpTellsStalledFromSteady(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewCatchUp()
	look := func(at time.Duration, leaderIndex, learnerIndex uint64) quorum.Member {
		ms := c.Observe([]quorum.Member{
			{ID: 1, Name: "a", Healthy: true, Leader: true, AppliedIndex: leaderIndex},
			{ID: 2, Name: "b", Learner: true, Healthy: true, AppliedIndex: learnerIndex},
		}, t0.Add(at))
		return ms[1]
	}
	if got := look(0, 5000, 100).CatchUpProgressAt; !got.Equal(t0) {
		t.Fatalf("first look: progress at %v, want %v", got, t0)
	}
	if got := look(time.Minute, 5100, 300).CatchUpProgressAt; !got.Equal(t0.Add(time.Minute)) {
		t.Fatalf("lag 4900 → 4800 is progress: %v", got)
	}
	// Its own index moves, but the leader runs ahead faster: no closer.
	if got := look(2*time.Minute, 6000, 1000).CatchUpProgressAt; !got.Equal(t0.Add(time.Minute)) {
		t.Fatalf("lag 4800 → 5000 is no progress: %v", got)
	}
	// Not answering tells nothing: the last progress time stays.
	ms := c.Observe([]quorum.Member{{ID: 1, Name: "a", Healthy: true, Leader: true, AppliedIndex: 7000}, {ID: 2, Learner: true}}, t0.Add(3*time.Minute))
	if got := ms[1].CatchUpProgressAt; !got.Equal(t0.Add(time.Minute)) {
		t.Fatalf("an unanswering learner keeps its progress time: %v", got)
	}
	// Promoted: its record goes.
	c.Observe([]quorum.Member{{ID: 2, Name: "b", Healthy: true}}, t0.Add(4*time.Minute))
	if _, ok := c.best[2]; ok {
		t.Fatal("a promoted member's record stays")
	}
}
