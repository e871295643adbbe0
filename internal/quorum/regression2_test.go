package quorum

import (
	"strings"
	"testing"
	"time"
)

// Regression tests for issue 28, "quorum safety, round 2": each planner
// hole the second review found, in the state the review gave. Each fails on
// the planner before its fix.

// Hole 1: under maxSurge 0 a rollout trades exactly one voter at a time; a
// voter leaving for any other reason waits while the cluster is already a
// voter short, and Check rejects the removal (I8).
func TestMaxSurgeZeroKeepsTheVoterFloor(t *testing.T) {
	// A desired-n rollout at its floor: n-1 voters, the replacement still
	// provisioning, and a user deletes another voter's machine.
	atFloor := func(desired int) State {
		return healthyWorld(desired, desired-1).with(func(w *world) {
			w.strategy = RemoveFirst
			w.nextMachine++
			w.machines = append(w.machines, wMachine{id: w.nextMachine, fd: "fd-c", upToDate: true})
			w.machines[1].deleting = true
		}).state()
	}
	for _, desired := range []int{3, 5} {
		s := atFloor(desired)
		expectDecision(t, s, Wait, "", "waiting for machine m-0"+string(rune('0'+desired))+" to be provisioned")
		leaving := s.Members[1]
		remove := Decision{Kind: RemoveMember, MemberID: leaving.ID, Machine: s.Machines[1].Name}
		if err := checkAlone(s, remove); err == nil || !strings.Contains(err.Error(), "I8 floor") {
			t.Errorf("desired %d: Check(%s) = %v, want an I8 floor violation", desired, remove, err)
		}
	}
	t.Run("the rollout's own trade still goes", func(t *testing.T) {
		s := healthyWorld(3, 3).with(func(w *world) {
			w.strategy = RemoveFirst
			w.machines[0].upToDate, w.machines[0].deleting = false, true
			w.members[0].leader, w.members[1].leader = false, true
		}).state()
		expectDecision(t, s, RemoveMember, "1", "on a departing machine")
	})
	t.Run("a user scaling down", func(t *testing.T) {
		s := edit(cluster(1, 2), func(s *State) { s.Strategy = RemoveFirst; s.Machines[1].Deleting = true })
		expectDecision(t, s, RemoveMember, "2", "on a departing machine")
	})
	t.Run("an operator letting a machine go (hook removed by hand)", func(t *testing.T) {
		s := atFloor(3)
		s.Machines[1].HasHook = false
		if err := checkAlone(s, Decision{Kind: RemoveMember, MemberID: s.Members[1].ID}); err != nil && strings.Contains(err.Error(), "I8") {
			t.Errorf("removing a voter an operator let go is no I8 violation: %v", err)
		}
	})
	t.Run("a CORRUPT member still leaves first", func(t *testing.T) {
		s := atFloor(3)
		s.Members[1].Alarms = []string{"CORRUPT"}
		expectDecision(t, s, RemoveMember, "2", "has alarms [CORRUPT]")
	})
	t.Run("an alarm does not let a healthy voter below the floor", func(t *testing.T) {
		s := atFloor(3)
		s.Members[0].Alarms = []string{"NOSPACE"}
		expectDecision(t, s, Compact, "", "member m-01 has alarms [NOSPACE]") // the recovery, not a removal
		s.Members[0].Alarms = []string{"CORRUPT"}
		expectDecision(t, s, Degraded, "", "member m-01 has alarms [CORRUPT]")
	})
}

// Hole 2: the plan's preconditions name every machine, so one created
// since the plan (a create that committed after its client timed out, or a
// second manager's) stops a second creation.
func TestVerifySeesMachinesCreatedSinceThePlan(t *testing.T) {
	s := cluster(5, 3, threeDomains...)
	d := expectDecision(t, s, CreateMachine, "", "scaling up: 3 of 5")
	fresh := edit(s, func(s *State) {
		s.Machines = append(s.Machines, Machine{Name: "m-09", FailureDomain: "fd-a", UpToDate: true, CreatedAt: s.Now, ResourceVersion: "1"})
	})
	if err := d.Verify(fresh); err == nil || !strings.Contains(err.Error(), "m-09") {
		t.Fatalf("Verify with machine m-09 created since the plan = %v, want a mismatch naming it", err)
	}
	if err := Check(fresh, d, fresh); err == nil || !strings.Contains(err.Error(), "I4") {
		t.Fatalf("acting anyway must be an I4 violation, Check says %v", err)
	}
}

// Hole 3: in the APIServersOnly topology a marked machine that serves (CAPI
// never clears a mark) is not deleted while it is the only one serving.
func TestStaleMarkKeepsTheLastAPIServer(t *testing.T) {
	w := apiWorld{desired: 2, machines: []apiMachine{{name: "a", stage: 2, marked: true, stale: true}, {name: "b", stage: 0, age: 1}}}
	expectDecision(t, w.state(), Wait, "", "waiting for machine b to serve")
	w.machines[0].stale = false // really broken: it serves nothing, so it goes first
	expectDecision(t, w.state(), DeleteMachine, "a", "remediating: a health check marked machine a")
}

// Hole 4: the first machine's hook stays while no member list could be
// read: it may run the only member, bootstrapped but not yet observed.
func TestFirstMachineKeepsItsHookWhileMembershipIsUnknown(t *testing.T) {
	first := State{Desired: 1, MembersUnknown: true, Now: t0, Machines: []Machine{{
		Name: "m-01", PeerURL: "https://10.0.0.1:2380", UpToDate: true, CreatedAt: t0, InfraReadyAt: t0,
		Deleting: true, HasHook: true, ResourceVersion: "1",
	}}}
	expectDecision(t, first, Wait, "", "before releasing the drain of deleting machine m-01: it may host the only member")
	t.Run("a machine that never got an address ran no etcd", func(t *testing.T) {
		s := edit(first, func(s *State) { s.Machines[0].PeerURL = "" })
		expectDecision(t, s, RemoveHook, "m-01", "hosts no etcd member")
	})
}

// Hole 5: a learner that answers but does not get closer to the leader is
// given up after LearnerStallTimeout; one catching up steadily is not.
func TestStalledLearnerIsGivenUp(t *testing.T) {
	stalled := func(progressAgo time.Duration) State {
		s := withLearner(edit(cluster(3, 3), func(s *State) { s.Machines[0].UpToDate = false }), 100, true)
		l := &s.Members[len(s.Members)-1]
		l.AddedAt = s.Now.Add(-time.Hour)
		l.CatchUpProgressAt = s.Now.Add(-progressAgo)
		return s
	}
	d := expectDecision(t, stalled(6*time.Minute), RemoveMember, "9", "has not got closer to the leader for 6m0s (applied index 100 of 5000")
	if !strings.Contains(d.Reason, "machine m-09 can be replaced") {
		t.Errorf("the reason must say what happens next: %s", d.Reason)
	}
	expectDecision(t, stalled(time.Minute), Wait, "", "waiting for learner m-09 to catch up: applied index 100 of 5000")
	s := stalled(0)
	s.Members[len(s.Members)-1].CatchUpProgressAt = time.Time{} // unknown counts as now
	expectDecision(t, s, Wait, "", "waiting for learner m-09 to catch up")
}

// Controller hole 2, the planner's half: alarms of members no longer listed.
func TestDepartedAlarms(t *testing.T) {
	healthy := cluster(3, 3)
	for i := range healthy.Members {
		healthy.Members[i].DBSize = 1 << 20
	}
	healthy.QuotaBackendBytes = 2 << 30
	t.Run("a departed NOSPACE is disarmed once every member is below the quota", func(t *testing.T) {
		s := edit(healthy, func(s *State) { s.DepartedAlarms = []Alarm{{MemberID: 0x99, Type: "NOSPACE"}} })
		d := expectDecision(t, s, DisarmAlarm, "", "disarming NOSPACE raised by member 99, since removed")
		if d.MemberID != 0x99 || d.Alarm != "NOSPACE" {
			t.Fatalf("disarms %x %s", d.MemberID, d.Alarm)
		}
	})
	t.Run("not while a member's size is unknown or over the quota", func(t *testing.T) {
		// Compacted and defragmented already: only the disarm is left.
		recovered := edit(healthy, func(s *State) {
			s.DepartedAlarms = []Alarm{{MemberID: 0x99, Type: "NOSPACE"}}
			s.CompactedRevision, s.CompactedAt = 3000, s.Now.Add(-time.Hour)
			for i := range s.Machines {
				s.Machines[i].DefragmentedAt = s.Now.Add(-time.Minute)
			}
		})
		s := edit(recovered, func(s *State) { s.Members[2].DBSize = 0 })
		expectDecision(t, s, Wait, "", "member 99, since removed, raised NOSPACE, which etcd keeps until it is disarmed; waiting to read the database size and quota of member m-03")
		s = edit(recovered, func(s *State) {
			s.QuotaBackendBytes = 0
			for i := range s.Members {
				s.Members[i].DBSizeQuota = 0 // etcd 3.5
			}
		})
		expectDecision(t, s, Wait, "", "waiting to read the database size and quota of member m-01")
	})
	t.Run("a departed CORRUPT is never disarmed and stops growth", func(t *testing.T) {
		s := edit(cluster(5, 3), func(s *State) { s.DepartedAlarms = []Alarm{{MemberID: 0x99, Type: "CORRUPT"}} })
		expectDecision(t, s, Degraded, "", "member 99, since removed, raised CORRUPT")
	})
	t.Run("removals QCP would make anyway still go", func(t *testing.T) {
		s := edit(cluster(3, 4), func(s *State) {
			s.DepartedAlarms = []Alarm{{MemberID: 0x99, Type: "CORRUPT"}}
			s.Machines[3].Deleting = true
			down(s, 3, time.Minute)
		})
		expectDecision(t, s, RemoveMember, "4", "while member 99, since removed, raised CORRUPT")
	})
}

// Controller hole 7, the planner's half: an unstarted member is mapped by
// peer URL only to a single machine without a recorded member; two at one
// address are ambiguous, and neither hosts it.
func TestAmbiguousPeerURLMatchesNoMachine(t *testing.T) {
	s := edit(cluster(3, 3), func(s *State) {
		for _, name := range []string{"m-08", "m-09"} {
			s.Machines = append(s.Machines, Machine{Name: name, PeerURL: "https://10.0.0.9:2380", UpToDate: true, CreatedAt: s.Now, ResourceVersion: "1"})
		}
		s.Members = append(s.Members, Member{ID: 9, PeerURL: "https://10.0.0.9:2380", Learner: true, AddedAt: s.Now})
	})
	v := newView(s)
	for _, name := range []string{"m-08", "m-09"} {
		if m, ok := v.memberOn(name); ok {
			t.Errorf("machine %s is taken to host member %s, though another machine has its address", name, idString(m.ID))
		}
	}
	if mc, ok := v.machineOf(s.Members[3]); ok {
		t.Errorf("learner 9 is taken to run on %s", mc.Name)
	}
	one := edit(s, func(s *State) { s.Machines = s.Machines[:4] })
	if m, ok := newView(one).memberOn("m-08"); !ok || m.ID != 9 {
		t.Errorf("a single machine at the learner's address must host it")
	}
}
