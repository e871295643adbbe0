package quorum

import (
	"strings"
	"testing"
	"time"
)

// fragmented gives member i a database of size bytes, pct percent of it
// free pages.
func fragmented(s *State, i int, size int64, pct int) {
	s.Members[i].DBSize, s.Members[i].DBSizeInUse = size, size*int64(100-pct)/100
}

// defragStarted opens member i's defragmentation record ago, and makes it
// stop answering, as a member busy defragmenting does.
func defragStarted(s *State, i int, ago time.Duration) {
	s.Machines[i].DefragStartedAt = s.Now.Add(-ago)
	down(s, i, ago)
}

// TestDefragment is issue 36's planner table: when a member is
// defragmented, and when not.
func TestDefragment(t *testing.T) {
	const gib = 1 << 30
	allFragmented := func(s *State) {
		for i := range s.Members {
			fragmented(s, i, gib, 60)
		}
	}
	tests := []struct {
		name   string
		state  State
		kind   Kind
		target string
		reason string
	}{
		{"a fragmented follower is defragmented, the most fragmented first",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); fragmented(s, 2, gib, 80) }),
			Defragment, "3", "80% of its 1024 MiB database is free pages (threshold 45%)"},
		{"followers go before the leader",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); fragmented(s, 0, gib, 90) }),
			Defragment, "2", "defragmenting member m-02"},
		{"a fragmented leader first hands leadership to another member",
			edit(cluster(3, 3), func(s *State) { fragmented(s, 0, gib, 90) }),
			MoveLeader, "2", "before defragmenting m-01"},
		{"no defragmentation while a voter is down (one of three)",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); down(s, 2, time.Minute) }),
			Wait, "", "waiting for member m-03 to become healthy"},
		{"no defragmentation while a voter is down (one of five)",
			edit(cluster(5, 5), func(s *State) { allFragmented(s); down(s, 4, time.Minute) }),
			Wait, "", "waiting for member m-05 to become healthy"},
		{"no defragmentation while a learner joins",
			withLearner(edit(cluster(5, 3), allFragmented), 100, false),
			Wait, "", "waiting for learner m-09 to catch up"},
		{"no defragmentation of a cluster that cannot lose a member",
			edit(cluster(1, 1), allFragmented),
			Wait, "", "with 1 voter etcd cannot lose one while it defragments"},
		{"no second defragmentation while one is in flight",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); defragStarted(s, 1, time.Minute) }),
			Wait, "", "waiting for member m-02 to finish defragmenting (started 1m0s ago; counted as unhealthy after 10m0s)"},
		{"a member defragmenting is not remediated for not answering",
			edit(cluster(3, 3), func(s *State) {
				defragStarted(s, 1, 9*time.Minute)
				s.Tunables.UnhealthyTimeout = time.Minute
			}),
			Wait, "", "waiting for member m-02 to finish defragmenting"},
		{"nor is a voter removed while it defragments",
			edit(cluster(3, 4), func(s *State) { defragStarted(s, 1, time.Minute); s.Machines[3].Deleting = true }),
			Wait, "", "waiting for member m-02 to finish defragmenting (started 1m0s ago; counted as unhealthy after 10m0s) before removing a voter"},
		{"past DefragTimeout a member that does not answer is unhealthy, and remediated",
			edit(cluster(3, 3), func(s *State) { defragStarted(s, 1, 11*time.Minute) }),
			RemoveMember, "2", "has been unhealthy for 11m0s"},
		{"a database below the size floor is left alone",
			edit(cluster(3, 3), func(s *State) { fragmented(s, 1, 50<<20, 90) }),
			Wait, "", "nothing to do"},
		{"a database below the threshold is left alone",
			edit(cluster(3, 3), func(s *State) { fragmented(s, 1, gib, 44) }),
			Wait, "", "nothing to do"},
		{"an unknown in-use size is left alone",
			edit(cluster(3, 3), func(s *State) { s.Members[1].DBSize, s.Members[1].DBSizeInUse = gib, 0 }),
			Wait, "", "nothing to do"},
		{"a member defragmented within the minimum interval (default 1 hour) is left alone",
			edit(cluster(3, 3), func(s *State) {
				fragmented(s, 1, gib, 90)
				s.Machines[1].DefragmentedAt, s.Tunables = s.Now.Add(-59*time.Minute), Tunables{}
			}),
			Wait, "", "nothing to do"},
		{"and defragmented again once it has passed",
			edit(cluster(3, 3), func(s *State) {
				fragmented(s, 1, gib, 90)
				s.Machines[1].DefragmentedAt, s.Tunables = s.Now.Add(-61*time.Minute), Tunables{}
			}),
			Defragment, "2", "90% of its"},
		{"an open record on a member that answers counts as a defragmentation done",
			edit(cluster(3, 3), func(s *State) {
				fragmented(s, 1, gib, 90)
				s.Machines[1].DefragStartedAt, s.Tunables = s.Now.Add(-time.Minute), Tunables{}
			}),
			Wait, "", "nothing to do"},
		{"the threshold, floor and interval are tunable",
			edit(cluster(3, 3), func(s *State) {
				fragmented(s, 1, 20<<20, 30)
				s.Machines[1].DefragmentedAt = s.Now.Add(-2 * time.Minute)
				s.Tunables.DefragThresholdPercent, s.Tunables.DefragMinDBSize, s.Tunables.DefragMinInterval = 25, 10<<20, time.Minute
			}),
			Defragment, "2", "30% of its 20 MiB database is free pages (threshold 25%)"},
		{"defragmentation can be turned off",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); s.Tunables.DefragDisabled = true }),
			Wait, "", "nothing to do"},
		{"membership work comes first: a rollout before defragmentation",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); s.Machines[1].UpToDate = false }),
			CreateMachine, "", "rolling out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Plan(tt.state)
			if d.Kind != tt.kind || !strings.Contains(d.Reason, tt.reason) || !targets(d, tt.target) {
				t.Fatalf("Plan(%s)\n = %s\nwant %s on %q with reason containing %q", tt.state.describe(), d, tt.kind, tt.target, tt.reason)
			}
			if err := checkAlone(tt.state, d); err != nil {
				t.Fatalf("decision breaks an invariant: %v", err)
			}
		})
	}
}

// TestCheckOneDisruption shows that Check refuses a second disruption: a
// defragmentation or membership change while a member defragments, and a
// defragmentation the cluster cannot afford.
func TestCheckOneDisruption(t *testing.T) {
	busy := edit(cluster(3, 3), func(s *State) { defragStarted(s, 1, time.Minute) })
	tests := []struct {
		name  string
		state State
		d     Decision
		want  string
	}{
		{"a second defragmentation", busy, Decision{Kind: Defragment, MemberID: 3, Machine: "m-03"}, "I4 one at a time: Defragment while member m-02 is defragmenting"},
		{"a voter removed", busy, Decision{Kind: RemoveMember, MemberID: 3, Machine: "m-03"}, "I4 one at a time: RemoveMember of a voter while member m-02 is defragmenting"},
		{"a learner added", withLearner(busy, 5000, false), Decision{Kind: AddLearner, Machine: "m-09"}, "I4 one at a time: AddLearner while member m-02 is defragmenting"},
		{"a defragmentation with a voter down", edit(cluster(3, 3), func(s *State) { down(s, 1, time.Minute) }),
			Decision{Kind: Defragment, MemberID: 3, Machine: "m-03"}, "I4 one at a time: defragmenting m-03 while voter m-02 is unhealthy"},
		{"a defragmentation of one of two voters", cluster(2, 2), Decision{Kind: Defragment, MemberID: 2, Machine: "m-02"}, "the cluster cannot lose it"},
		{"a defragmentation of the leader", cluster(3, 3), Decision{Kind: Defragment, MemberID: 1, Machine: "m-01"}, "I6 leader: defragmenting leader m-01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkAlone(tt.state, tt.d)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check(%s, %s) = %v, want an error containing %q", tt.state.describe(), tt.d, err, tt.want)
			}
		})
	}
	if err := checkAlone(cluster(3, 3), Decision{Kind: Defragment, MemberID: 2, Machine: "m-02"}); err != nil {
		t.Fatalf("a follower's defragmentation in a healthy cluster of three: %v", err)
	}
}
