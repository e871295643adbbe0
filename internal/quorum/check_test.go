package quorum

import (
	"strings"
	"testing"
	"time"
)

// TestCheckCatches feeds Check one bad step per invariant.
func TestCheckCatches(t *testing.T) {
	three := cluster(3, 3)
	promoted := func(s State, id uint64) State {
		return edit(s, func(s *State) {
			for i := range s.Members {
				if s.Members[i].ID == id {
					s.Members[i].Learner = false
				}
			}
		})
	}
	tests := []struct {
		name   string
		before State
		d      Decision
		after  State
		want   string
	}{
		{"I1: removing a healthy voter with another down",
			edit(three, func(s *State) { down(s, 2, time.Hour) }),
			Decision{Kind: RemoveMember, MemberID: 2}, three, "I1 quorum"},
		{"I2: promoting past desired+1",
			withLearner(cluster(3, 4), 5000, true), Decision{Kind: Promote, MemberID: 9},
			promoted(withLearner(cluster(3, 4), 5000, true), 9), "I2 bounded"},
		{"I3: a member joins as a voter",
			three, Decision{Kind: Wait}, promoted(withLearner(three, 5000, true), 9), "I3 learners first"},
		{"I3: promoting a lagging learner",
			withLearner(cluster(3, 2), 10, true), Decision{Kind: Promote, MemberID: 9}, three, "has not caught up"},
		{"I4: creating while a machine is provisioning",
			edit(three, func(s *State) { s.Machines = append(s.Machines, Machine{Name: "m-09", CreatedAt: s.Now}) }),
			Decision{Kind: CreateMachine}, three, "I4 one at a time"},
		{"I4: adding a second learner",
			withLearner(cluster(3, 2), 10, true), Decision{Kind: AddLearner, Machine: "m-01"}, three, "I4 one at a time"},
		{"I5: promoting without the hook",
			withLearner(cluster(3, 2), 5000, false), Decision{Kind: Promote, MemberID: 9}, three, "I5 hooks"},
		{"I5: removing the hook from a voter machine",
			three, Decision{Kind: RemoveHook, Machine: "m-02"}, three, "I5 hooks"},
		{"I5: adding the hook back to a deleting machine",
			edit(three, func(s *State) { s.Machines[1].Deleting, s.Machines[1].HasHook = true, false }),
			Decision{Kind: AddHook, Machine: "m-02"}, three, "I5 hooks"},
		{"I6: removing the leader",
			cluster(3, 4), Decision{Kind: RemoveMember, MemberID: 1}, three, "I6 leader"},
		{"I6: deleting the leader's machine",
			cluster(3, 4), Decision{Kind: DeleteMachine, Machine: "m-01"}, three, "I6 leader"},
		{"I6: moving leadership to an outdated voter",
			edit(cluster(3, 3), func(s *State) { s.Machines[1].UpToDate = false }),
			Decision{Kind: MoveLeader, MemberID: 2}, three, "outdated"},
		{"I6: moving leadership to an unhealthy voter",
			edit(three, func(s *State) { down(s, 1, 0) }), Decision{Kind: MoveLeader, MemberID: 2}, three, "I6 leader"},
		{"I7: destructive step without quorum",
			edit(three, func(s *State) { down(s, 1, time.Hour); down(s, 2, time.Hour) }),
			Decision{Kind: DeleteMachine, Machine: "m-02"}, three, "I7 no heroics"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.before, tt.d, tt.after)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestCheckMembers(t *testing.T) {
	members := cluster(3, 5).Members
	if err := CheckMembers(3, members); err == nil || !strings.Contains(err.Error(), "I2") {
		t.Fatalf("5 voters for desired 3: %v", err)
	}
	if err := CheckMembers(3, members[:4]); err != nil {
		t.Fatalf("4 voters for desired 3: %v", err)
	}
	two := append(members[:3:3], Member{ID: 8, Learner: true}, Member{ID: 9, Learner: true})
	if err := CheckMembers(3, two); err == nil {
		t.Fatal("two learners not caught")
	}
}

func TestCheckMembershipChange(t *testing.T) {
	before := cluster(3, 3).Members
	before[2].Healthy = false
	if err := CheckMembershipChange(before, before[1:]); err == nil || !strings.Contains(err.Error(), "I1") {
		t.Fatalf("removing a healthy voter next to a dead one: %v", err)
	}
	if err := CheckMembershipChange(before, before[:2]); err != nil {
		t.Fatalf("removing the dead voter: %v", err)
	}
	joined := append(cluster(3, 3).Members, Member{ID: 9})
	if err := CheckMembershipChange(cluster(3, 3).Members, joined); err == nil || !strings.Contains(err.Error(), "I3") {
		t.Fatalf("voter joining directly: %v", err)
	}
	if err := CheckMembershipChange(nil, cluster(1, 1).Members); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
}

// FuzzPlan builds arbitrary states from bytes; Plan must never panic, must
// always explain itself, and its decision must pass Check.
func FuzzPlan(f *testing.F) {
	f.Add([]byte{3, 3, 0, 0, 0})
	f.Add([]byte{5, 4, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{1, 2, 255, 17, 33, 65, 129})
	f.Add([]byte{195, 3, 10, 26, 90})
	f.Add([]byte{67, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := stateFromBytes(data)
		d := Plan(s)
		if d.Reason == "" || d.Kind == "" {
			t.Fatalf("Plan(%s) = %#v: no reason", s.describe(), d)
		}
		if err := checkAlone(s, d); err != nil {
			t.Fatalf("Plan(%s) = %s: %v", s.describe(), d, err)
		}
		if err := d.Verify(s); err != nil {
			t.Fatalf("Plan(%s) = %s, whose preconditions fail on the state it was planned on: %v", s.describe(), d, err)
		}
	})
}

// stateFromBytes decodes a fuzzer's bytes into a plausible State: desired,
// machine count, then one flag byte per machine.
func stateFromBytes(data []byte) State {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	head := next()
	desired := int(head%7) + 1
	n := int(next() % 8)
	s := cluster(desired, 0, "fd-a", "fd-b")
	s.MembersUnknown, s.Bootstrapped = head&64 != 0, head&128 != 0
	leader := false
	for i := 1; i <= n; i++ {
		f := next()
		name := machineName(i)
		mc := Machine{Name: name, FailureDomain: []string{"fd-a", "fd-b", "fd-z"}[int(f>>6)%3], PeerURL: peerURL(i),
			UpToDate: f&1 == 0, CreatedAt: s.Now.Add(-time.Duration(n-i) * time.Hour), Deleting: f&2 != 0,
			HasHook: f&4 != 0, DeleteAnnotated: f&8 != 0, NodeReady: true, ComponentsHealthy: f&16 == 0, MemberID: uint64(i),
			Remediate: f&16 != 0 && f&8 != 0, JoinStarted: f&32 != 0, InfraReadyAt: s.Now.Add(-time.Duration(f) * time.Minute)}
		s.Machines = append(s.Machines, mc)
		if f&32 != 0 && i > 1 {
			continue // no member
		}
		m := Member{ID: uint64(i), Name: name, PeerURL: peerURL(i), Healthy: f&16 == 0 || f&128 == 0, AppliedIndex: 5000}
		if f&64 != 0 && i == n && n > 1 {
			m.Learner, m.AppliedIndex, m.AddedAt = true, uint64(f)*20, s.Now.Add(-time.Duration(f)*time.Minute)
			if f&128 != 0 {
				m.Name = ""
			}
		}
		if !m.Healthy {
			m.UnhealthySince = s.Now.Add(-time.Duration(f) * time.Minute)
		}
		if f&(8|2) == 8|2 {
			m.Alarms = []string{[]string{"NOSPACE", "CORRUPT"}[i%2]}
		}
		if !leader && m.Healthy && !m.Learner {
			m.Leader, leader = true, true
		}
		s.Members = append(s.Members, m)
	}
	return s
}

// TestOnlyI6: removing the leader without a transfer breaks I6 alone; a
// step that also breaks another invariant, or none, is not OnlyI6.
func TestOnlyI6(t *testing.T) {
	leaderGone := Check(cluster(3, 4), Decision{Kind: RemoveMember, MemberID: 1}, cluster(3, 3))
	if !OnlyI6(leaderGone) {
		t.Errorf("%v: want I6 alone", leaderGone)
	}
	twoDown := edit(cluster(3, 3), func(s *State) { down(s, 1, time.Hour); down(s, 2, time.Hour) })
	both := Check(twoDown, Decision{Kind: RemoveMember, MemberID: 1}, cluster(3, 3))
	if both == nil || OnlyI6(both) {
		t.Errorf("%v: want I6 and others", both)
	}
	if OnlyI6(nil) || OnlyI6(Check(cluster(3, 3), Decision{Kind: Wait}, cluster(3, 3))) {
		t.Error("no violation is not I6 alone")
	}
}
