package quorum

import (
	"testing"
	"time"
)

// TestWaitReasonsStayTheSameRoundToRound plans each wait that lasts while
// its situation stands twice, seconds apart, and wants the same reason: a
// reason that counted the seconds rewrote the owner's status every round
// (a status patch each round of a long wait, 31 of 177 control plane updates
// in one run of TestCreateAndScale), and restarted lastOperation.startTime
// with it, so that "since" always said a second or two.
func TestWaitReasonsStayTheSameRoundToRound(t *testing.T) {
	for _, c := range []struct {
		name string
		s    State
		want string
	}{
		{"a learner that has not started",
			edit(withLearner(cluster(3, 2), 0, false), func(s *State) {
				l := &s.Members[2]
				l.Name, l.Healthy, l.AddedAt = "", false, s.Now.Add(-time.Minute)
			}), "waiting for learner m-09 to start (added at 2026-01-01T00:11:00Z; replaced at 2026-01-01T00:16:00Z)"},
		{"a learner added at a time not recorded",
			edit(withLearner(cluster(3, 2), 0, false), func(s *State) {
				l := &s.Members[2]
				l.Name, l.Healthy, l.AddedAt = "", false, time.Time{}
			}), "(added at a time not recorded; replaced 5m0s after that is recorded)"},
		{"an unhealthy voter",
			edit(cluster(3, 3), func(s *State) { down(s, 2, time.Second); s.Machines[0].UpToDate = false }),
			"waiting for member m-03 to become healthy (unhealthy since 2026-01-01T00:11:59Z; replaced at 2026-01-01T00:16:59Z)"},
		{"a member defragmenting",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 2, time.Hour); defragStarted(s, 1, time.Minute) }),
			"(started at 2026-01-01T00:11:00Z; counted as unhealthy at 2026-01-01T00:21:00Z)"},
		{"a machine renewing its certificates",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 2, time.Hour); renewStarted(s, 1, time.Minute) }),
			"(started at 2026-01-01T00:11:00Z; counted as finished at 2026-01-01T00:16:00Z)"},
		{"a backup that cannot be taken",
			edit(cluster(3, 3), func(s *State) {
				s.Backup.Configured, s.Backup.MaxAgeBeforeRisky = true, time.Hour
				s.Backup.LastVerified, s.Backup.Problem = s.Now.Add(-2*time.Hour), "the store refuses the credentials"
				for i := range s.Machines {
					s.Machines[i].UpToDate = false
				}
			}), "the newest was verified at 2025-12-31T22:12:00Z, more than maxAgeBeforeRiskyChangeSeconds (1h0m0s) ago"},
	} {
		t.Run(c.name, func(t *testing.T) {
			first := expectDecision(t, c.s, Wait, "", c.want)
			later := c.s
			later.Now = c.s.Now.Add(7 * time.Second)
			if again := Plan(later); again.Kind != Wait || again.Reason != first.Reason {
				t.Errorf("7 s later the planner says %s\nwhere it said %s", again, first)
			}
		})
	}
}
