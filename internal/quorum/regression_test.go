package quorum

import (
	"strings"
	"testing"
	"time"
)

// Regression tests for the holes a review of the planner found (issue 7).
// Each names the item it covers; each state is the one the review gave.

func expectDecision(t *testing.T, s State, kind Kind, target, reason string) Decision {
	t.Helper()
	d := Plan(s)
	if d.Kind != kind || !strings.Contains(d.Reason, reason) || !targets(d, target) {
		t.Fatalf("Plan(%s)\n = %s\nwant %s on %q with reason containing %q", s.describe(), d, kind, target, reason)
	}
	if err := checkAlone(s, d); err != nil {
		t.Fatalf("decision breaks an invariant: %v", err)
	}
	return d
}

// Item 1: an unknown or empty member list is never taken for "no members".
func TestUnknownMembershipIsNotEmpty(t *testing.T) {
	three := cluster(3, 3, threeDomains...)
	t.Run("empty list", func(t *testing.T) {
		s := edit(three, func(s *State) { s.Members = nil })
		expectDecision(t, s, Degraded, "", "no etcd member is listed, but machines m-01, m-02, m-03 have hosted etcd members")
	})
	t.Run("unreadable list", func(t *testing.T) {
		s := edit(three, func(s *State) { s.MembersUnknown = true })
		expectDecision(t, s, Degraded, "", "cannot be read")
	})
	t.Run("a join that started counts as a recorded member", func(t *testing.T) {
		s := edit(three, func(s *State) {
			s.Members = nil
			for i := range s.Machines {
				s.Machines[i].MemberID = 0
			}
			s.Machines[2].JoinStarted = true
		})
		expectDecision(t, s, Degraded, "", "machines m-03 have hosted")
	})
	t.Run("no second cluster once every machine is gone", func(t *testing.T) {
		s := edit(three, func(s *State) { s.Machines, s.Members, s.MembersUnknown = nil, nil, true })
		expectDecision(t, s, Degraded, "", "etcd was bootstrapped before")
	})
	t.Run("a fresh cluster still bootstraps while etcd is unreachable", func(t *testing.T) {
		s := edit(cluster(3, 0, threeDomains...), func(s *State) { s.MembersUnknown = true })
		expectDecision(t, s, CreateMachine, "fd-a", "bootstraps a new etcd cluster")
	})
}

// Item 2: deleting a hookless voter machine is a violation Check sees.
func TestCheckRefusesDeletingHooklessVoterMachine(t *testing.T) {
	s := edit(cluster(3, 3), func(s *State) {
		down(s, 2, time.Minute)
		s.Machines[1].HasHook = false
	})
	err := Check(s, Decision{Kind: DeleteMachine, Machine: "m-02"}, s)
	if err == nil || !strings.Contains(err.Error(), "I5 hooks (and I1)") {
		t.Fatalf("Check(DeleteMachine of hookless voter m-02) = %v, want an I5/I1 violation", err)
	}
}

// Item 3: a healthy departing voter waits while another voter is down.
func TestHealthyDepartingVoterWaitsForDownVoter(t *testing.T) {
	s := edit(cluster(3, 5), func(s *State) {
		s.Machines[1].Deleting = true
		down(s, 3, time.Minute)
	})
	expectDecision(t, s, Wait, "", "member m-04 is unhealthy, and without healthy m-02 etcd could not survive another failure")
	err := Check(s, Decision{Kind: RemoveMember, MemberID: 2}, s)
	if err == nil || !strings.Contains(err.Error(), "I1 quorum: removing healthy voter m-02 while another voter is down") {
		t.Fatalf("Check(RemoveMember(2)) = %v, want the fault-tolerance violation", err)
	}
	// Once m-04 is due for remediation it goes first; then m-02 may leave.
	late := edit(s, func(s *State) { down(s, 3, time.Hour) })
	expectDecision(t, late, RemoveMember, "4", "removing it first")
	// The stale path: all healthy at plan time, m-03 crashes before the act.
	planned := expectDecision(t, edit(cluster(3, 4), func(s *State) { s.Machines[1].Deleting = true }), RemoveMember, "2", "replacement has joined")
	fresh := edit(cluster(3, 4), func(s *State) { s.Machines[1].Deleting = true; down(s, 2, 0) })
	if err := planned.Verify(fresh); err == nil || !strings.Contains(err.Error(), "health changed") {
		t.Fatalf("Verify after m-03 crashed = %v, want a health change", err)
	}
}

// Item 4: every decision carries preconditions, and Verify enforces them.
func TestDecisionsCarryPreconditions(t *testing.T) {
	t.Run("no hook back on a machine the user deleted after the plan", func(t *testing.T) {
		s := edit(cluster(3, 3), func(s *State) {
			s.Machines[1].HasHook = false
			for i := range s.Machines {
				s.Machines[i].ResourceVersion = "100"
			}
		})
		d := expectDecision(t, s, AddHook, "m-02", "lacks the pre-drain hook")
		if d.Expect.MachineResourceVersion != "100" {
			t.Fatalf("AddHook carries resourceVersion %q, want 100", d.Expect.MachineResourceVersion)
		}
		fresh := edit(s, func(s *State) { s.Machines[1].Deleting, s.Machines[1].ResourceVersion = true, "101" })
		if err := d.Verify(fresh); err == nil || !strings.Contains(err.Error(), "machine m-02 changed") {
			t.Fatalf("Verify after the user deleted m-02 = %v", err)
		}
		if err := d.Verify(s); err != nil {
			t.Fatalf("Verify on the planned state = %v", err)
		}
	})
	t.Run("no promotion of a learner that crashed after the plan", func(t *testing.T) {
		s := withLearner(cluster(3, 2), 4900, true)
		d := expectDecision(t, s, Promote, "9", "promoting learner m-09")
		fresh := edit(s, func(s *State) { s.Members[2].Healthy = false })
		if err := d.Verify(fresh); err == nil {
			t.Fatal("Verify accepted promoting a learner that is no longer healthy")
		}
	})
	t.Run("no step on a member list that changed", func(t *testing.T) {
		s := cluster(3, 2, threeDomains...)
		d := expectDecision(t, s, CreateMachine, "fd-c", "scaling up")
		if err := d.Verify(withLearner(s, 0, false)); err == nil || !strings.Contains(err.Error(), "membership changed") {
			t.Fatalf("Verify with a learner the plan did not see = %v", err)
		}
	})
}

// Item 5: alarms.
func TestAlarms(t *testing.T) {
	t.Run("a CORRUPT member on a deleting machine is removed", func(t *testing.T) {
		s := edit(cluster(3, 3), func(s *State) {
			s.Members[1].Alarms = []string{"CORRUPT"}
			s.Machines[1].Deleting = true
		})
		expectDecision(t, s, RemoveMember, "2", "has alarms [CORRUPT]")
	})
	t.Run("an alarmed member due for remediation is removed", func(t *testing.T) {
		s := edit(cluster(3, 3), func(s *State) {
			s.Members[2].Alarms = []string{"CORRUPT"}
			down(s, 2, time.Hour)
		})
		expectDecision(t, s, RemoveMember, "3", "removing it first")
	})
	t.Run("the message names the alarm even without quorum", func(t *testing.T) {
		s := edit(cluster(3, 3), func(s *State) {
			s.Members[0].Alarms = []string{"NOSPACE"}
			down(s, 1, time.Hour)
			down(s, 2, time.Hour)
		})
		expectDecision(t, s, Degraded, "", "has alarms [NOSPACE]")
	})
	t.Run("a cluster-wide NOSPACE raised by one member blocks growth", func(t *testing.T) {
		s := edit(cluster(3, 2), func(s *State) { s.Members[1].Alarms = []string{"NOSPACE"} })
		expectDecision(t, s, Compact, "", "member m-02 has alarms [NOSPACE]: compacting") // its recovery
	})
}

// Item 6: a MachineHealthCheck mark is acted on whatever the member's health.
func TestHealthCheckMarks(t *testing.T) {
	t.Run("marked machine with a healthy member is replaced first", func(t *testing.T) {
		s := edit(cluster(3, 3, threeDomains...), func(s *State) {
			s.Machines[2].Remediate, s.Machines[2].NodeReady, s.Machines[2].ComponentsHealthy = true, false, false
		})
		expectDecision(t, s, CreateMachine, "fd-c", "remediating: replacing marked machine m-03")
		// Once the replacement votes, the marked machine is the one to go.
		s = edit(cluster(3, 4, threeDomains...), func(s *State) { s.Machines[2].Remediate = true })
		expectDecision(t, s, DeleteMachine, "m-03", "marked for remediation")
	})
	t.Run("marked machine that never got an address is deleted", func(t *testing.T) {
		s := edit(cluster(3, 2), func(s *State) {
			s.Machines = append(s.Machines, Machine{Name: "m-09", CreatedAt: s.Now.Add(-time.Hour), Remediate: true})
		})
		expectDecision(t, s, DeleteMachine, "m-09", "instead of joining it")
	})
	t.Run("marked learner is deleted, not promoted", func(t *testing.T) {
		s := edit(withLearner(cluster(3, 2), 4900, false), func(s *State) { s.Machines[2].Remediate = true })
		expectDecision(t, s, DeleteMachine, "m-09", "instead of joining it")
	})
}

// Item 7: timeouts count from the start of their phase, not from creation.
func TestTimeoutsCountFromTheirPhase(t *testing.T) {
	first := func(created, ready time.Duration, addr string) State {
		return edit(cluster(3, 0), func(s *State) {
			mc := Machine{Name: "m-01", PeerURL: addr, CreatedAt: s.Now.Add(-created)}
			if ready > 0 {
				mc.InfraReadyAt = s.Now.Add(-ready)
			}
			s.Machines = []Machine{mc}
		})
	}
	expectDecision(t, first(6*time.Minute, 0, ""), Wait, "", "waiting for machine m-01 to be provisioned")
	expectDecision(t, first(20*time.Minute, time.Minute, "https://x:2380"), Wait, "", "waiting for machine m-01 to bootstrap")
	expectDecision(t, first(20*time.Minute, 0, "https://x:2380"), Wait, "", "waiting for machine m-01 to bootstrap")
	learner := edit(withLearner(cluster(3, 2), 0, false), func(s *State) {
		s.Machines[2].CreatedAt = s.Now.Add(-20 * time.Minute)
		l := &s.Members[2]
		l.Name, l.Healthy, l.AddedAt = "", false, time.Time{}
	})
	expectDecision(t, learner, Wait, "", "waiting for learner m-09 to start (added at a time not recorded; replaced 5m0s after that is recorded)")
}

// Item 8: a missing caller record never changes behaviour silently.
func TestMissingRecords(t *testing.T) {
	t.Run("a machine whose join started is never joined again", func(t *testing.T) {
		s := edit(cluster(3, 2), func(s *State) {
			s.Machines = append(s.Machines, Machine{Name: "m-09", PeerURL: "https://m9:2380", UpToDate: true, CreatedAt: s.Now, JoinStarted: true})
		})
		expectDecision(t, s, DeleteMachine, "m-09", "etcd member was removed")
	})
	t.Run("an unknown unhealthy-since is not 'nothing to do'", func(t *testing.T) {
		s := edit(cluster(3, 3), func(s *State) { down(s, 2, 0); s.Members[2].UnhealthySince = time.Time{} })
		expectDecision(t, s, Wait, "", "waiting for member m-03 to become healthy")
	})
}

// Item 9: lowering desired while a machine joins cancels the machine.
func TestLoweringDesiredCancelsJoiningMachine(t *testing.T) {
	joining := func(mc Machine) State {
		return edit(cluster(3, 3), func(s *State) { mc.CreatedAt = s.Now; s.Machines = append(s.Machines, mc) })
	}
	expectDecision(t, joining(Machine{Name: "m-09", PeerURL: "https://m9:2380", UpToDate: true}), DeleteMachine, "m-09", "cancelling machine m-09")
	expectDecision(t, joining(Machine{Name: "m-09", UpToDate: true}), DeleteMachine, "m-09", "cancelling machine m-09")
	expectDecision(t, withLearner(cluster(3, 3), 4900, true), DeleteMachine, "m-09", "cancelling machine m-09")
	// A rollout's surge machine is not surplus.
	surge := edit(joining(Machine{Name: "m-09", PeerURL: "https://m9:2380", UpToDate: true}), func(s *State) { s.Machines[0].UpToDate = false })
	expectDecision(t, surge, AddLearner, "m-09", "as a learner")
}

// Item 10: scale up goes to the domain with the fewest machines that remain.
func TestScaleUpCountsEveryRemainingMachine(t *testing.T) {
	s := edit(cluster(5, 4, threeDomains...), func(s *State) {
		for i, fd := range []string{"fd-a", "fd-a", "fd-b", "fd-c"} {
			s.Machines[i].FailureDomain = fd
			s.Machines[i].UpToDate = i >= 2
		}
	})
	expectDecision(t, s, CreateMachine, "fd-b", "scaling up: 4 of 5")
}
