package quorum

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// cluster builds a State for table tests: n healthy, up-to-date voters
// under the hook, spread over domains, the first one leading.
func cluster(desired, n int, domains ...string) State {
	return healthyWorld(desired, n).with(func(w *world) { w.domains = domains; spread(w) }).state()
}

func spread(w *world) {
	for i := range w.machines {
		w.machines[i].fd = ""
		if len(w.domains) > 0 {
			w.machines[i].fd = w.domains[i%len(w.domains)]
		}
	}
}

func edit(s State, f func(*State)) State {
	s.Machines = append([]Machine(nil), s.Machines...)
	s.Members = append([]Member(nil), s.Members...)
	f(&s)
	return s
}

// down makes member i unhealthy since since ago, and its machine no longer
// says that it answers there.
func down(s *State, i int, since time.Duration) {
	s.Members[i].Healthy, s.Members[i].Leader = false, false
	s.Members[i].UnhealthySince = s.Now.Add(-since)
	for j := range s.Machines {
		if s.Machines[j].Name == s.Members[i].Name {
			s.Machines[j].EtcdAnswersOnMachine = false
		}
	}
}

func TestPlanDecisions(t *testing.T) {
	abc := []string{"fd-a", "fd-b", "fd-c"}
	runPlanCases(t, []planCase{
		{"fresh cluster creates the first machine in the first domain",
			cluster(3, 0, abc...), CreateMachine, "fd-a", "bootstraps a new etcd cluster"},
		{"a restoring cluster's first machine waits for a snapshot it can use",
			edit(cluster(3, 0, abc...), func(s *State) {
				s.Restore = RestoreState{Requested: true, Problem: "Secret ns/creds does not exist"}
			}), Wait, "", "waiting for a snapshot to restore before creating the first machine: Secret ns/creds does not exist"},
		{"a restoring cluster's first machine restores the checked snapshot",
			edit(cluster(3, 0, abc...), func(s *State) { s.Restore = RestoreState{Requested: true, Snapshot: "ns/x/old/1.db"} }),
			CreateMachine, "fd-a", "it restores etcd from snapshot ns/x/old/1.db"},
		{"first machine bootstraps on its own",
			edit(cluster(3, 0), func(s *State) {
				s.Machines = []Machine{{Name: "m-01", PeerURL: "https://x:2380", CreatedAt: s.Now.Add(-time.Minute)}}
			}), Wait, "", "waiting for machine m-01 to bootstrap"},
		{"first machine that never bootstraps is deleted",
			edit(cluster(3, 0), func(s *State) {
				s.Machines = []Machine{{Name: "m-01", PeerURL: "https://x:2380", CreatedAt: s.Now.Add(-time.Hour), InfraReadyAt: s.Now.Add(-time.Hour)}}
			}), DeleteMachine, "m-01", "has not bootstrapped"},
		{"scale up into the domain with the fewest machines",
			cluster(3, 2, abc...), CreateMachine, "fd-c", "scaling up: 2 of 3"},
		{"scale up reuses domains alphabetically",
			cluster(5, 3, "fd-a", "fd-b"), CreateMachine, "fd-b", "scaling up: 3 of 5"},
		{"new machine is added as a learner",
			edit(cluster(3, 2), func(s *State) {
				s.Machines = append(s.Machines, Machine{Name: "m-09", PeerURL: "https://m9:2380", UpToDate: true, CreatedAt: s.Now})
			}), AddLearner, "m-09", "as a learner"},
		{"no learner is added while a voter is down",
			edit(cluster(5, 4), func(s *State) {
				down(s, 1, time.Minute)
				s.Machines = append(s.Machines, Machine{Name: "m-09", PeerURL: "https://m9:2380", UpToDate: true, CreatedAt: s.Now})
			}), Wait, "", "waiting for member m-02 to become healthy"},
		{"a marked machine whose member is healthy is not replaced while another member is down (seed 000, scenario 3)",
			edit(cluster(3, 3), func(s *State) {
				down(s, 0, 10*time.Second)
				s.Machines[1].Remediate = true
			}), Wait, "", "waiting for member m-01 to become healthy"},
		{"nor is its member removed once the down one is past UnhealthyTimeout: the down one goes first",
			edit(cluster(3, 3), func(s *State) {
				down(s, 0, time.Hour)
				s.Machines[1].Remediate = true
			}), RemoveMember, "1", "has been unhealthy for 1h0m0s"},
		{"a voter only QCP cannot reach is not replaced past UnhealthyTimeout: its machine says it answers (issue 37)",
			edit(cluster(3, 3), func(s *State) {
				down(s, 1, time.Hour)
				s.Machines[1].EtcdAnswersOnMachine = true
			}), Wait, "", "its machine says it answers there, so it is not replaced) before"},
		{"unless a health check marked its machine",
			edit(cluster(3, 3), func(s *State) {
				down(s, 1, time.Hour)
				s.Machines[1].EtcdAnswersOnMachine = true
				s.Machines[1].Remediate = true
			}), RemoveMember, "2", "a health check marked its machine"},
		{"nor is it taken for healthy: no learner is added beside it",
			edit(cluster(5, 4), func(s *State) {
				down(s, 1, time.Minute)
				s.Machines[1].EtcdAnswersOnMachine = true
				s.Machines = append(s.Machines, Machine{Name: "m-09", PeerURL: "https://m9:2380", UpToDate: true, CreatedAt: s.Now})
			}), Wait, "", "waiting for member m-02 to answer QCP"},
		{"a dead voter waiting its turn for remediation does not block the replacement ahead of it (#10125)",
			edit(cluster(5, 4), func(s *State) {
				down(s, 1, time.Minute)
				s.Machines[1].HoldRemediation, s.Machines[1].RemediationQueued = true, true
			}), CreateMachine, "", "scaling up: 4 of 5"},
		{"nor its learner joining",
			edit(cluster(5, 4), func(s *State) {
				down(s, 1, time.Minute)
				s.Machines[1].HoldRemediation, s.Machines[1].RemediationQueued = true, true
				s.Machines = append(s.Machines, Machine{Name: "m-09", PeerURL: "https://m9:2380", UpToDate: true, CreatedAt: s.Now})
			}), AddLearner, "m-09", "as a learner"},
		{"a dead voter whose remediation was refused still blocks growth",
			edit(cluster(5, 4), func(s *State) {
				down(s, 1, time.Minute)
				s.Machines[1].HoldRemediation = true
			}), Wait, "", "waiting for member m-02 to become healthy"},
		{"a queued dead voter is still waited for when nothing else is to do",
			edit(cluster(3, 3), func(s *State) {
				down(s, 1, time.Minute)
				s.Machines[1].HoldRemediation, s.Machines[1].RemediationQueued = true, true
			}), Wait, "", "waiting for member m-02 to become healthy"},
		{"lagging learner is waited for, naming the indexes",
			withLearner(cluster(3, 2), 1200, true), Wait, "", "waiting for learner m-09 to catch up: applied index 1200 of 5000"},
		{"caught-up learner's machine gets the hook first",
			withLearner(cluster(3, 2), 4900, false), AddHook, "m-09", "before its learner is promoted"},
		{"caught-up learner with the hook is promoted",
			withLearner(cluster(3, 2), 4900, true), Promote, "9", "promoting learner m-09"},
		{"unstarted learner past its timeout is removed",
			edit(withLearner(cluster(3, 2), 0, true), func(s *State) {
				l := &s.Members[len(s.Members)-1]
				l.Name, l.Healthy, l.AddedAt = "", false, s.Now.Add(-time.Hour)
			}), RemoveMember, "9", "has not started"},
		{"machine whose member was removed is deleted",
			edit(cluster(3, 3), func(s *State) { s.Members = s.Members[:2] }), DeleteMachine, "m-03", "member was removed"},
		{"failed machine is deleted",
			edit(cluster(3, 2), func(s *State) {
				s.Machines = append(s.Machines, Machine{Name: "m-09", CreationFailed: true, CreatedAt: s.Now})
			}), DeleteMachine, "m-09", "failed to be created"},
		{"voter machine without the hook gets it back",
			edit(cluster(3, 3), func(s *State) { s.Machines[1].HasHook = false }), AddHook, "m-02", "lacks the pre-drain hook"},
		{"deleting machine never gets its hook back (escape hatch)",
			edit(cluster(3, 3), func(s *State) { s.Machines[1].HasHook, s.Machines[1].Deleting = false, true }), CreateMachine, "", "scaling up: 2 of 3"},
		{"deleting machine is replaced first when its member is healthy (maxSurge 1)",
			edit(cluster(3, 3, abc...), func(s *State) { s.Machines[1].Deleting = true }), CreateMachine, "fd-b", "scaling up: 2 of 3"},
		{"deleting machine's voter is removed once its replacement votes",
			edit(cluster(3, 4), func(s *State) { s.Machines[1].Deleting = true }), RemoveMember, "2", "replacement has joined"},
		{"deleting machine's unhealthy voter is removed first",
			edit(cluster(3, 3), func(s *State) { s.Machines[1].Deleting = true; down(s, 1, time.Second) }), RemoveMember, "2", "removing it first"},
		{"deleting machine is released once its member is gone",
			edit(cluster(3, 3), func(s *State) {
				s.Machines = append(s.Machines, Machine{Name: "m-09", Deleting: true, HasHook: true, MemberID: 99})
			}), RemoveHook, "m-09", "no longer hosts a voter"},
		{"leader leaves only after leadership moved to an up-to-date voter",
			edit(cluster(3, 4), func(s *State) { s.Machines[0].Deleting = true; s.Machines[1].UpToDate = false }), MoveLeader, "3", "moving etcd leadership from m-01 to m-03"},
		{"unhealthy voter past its timeout is removed first (etcd FAQ)",
			edit(cluster(3, 3), func(s *State) { down(s, 2, time.Hour) }), RemoveMember, "3", "removing it first, then replacing"},
		{"machine marked by a health check is remediated at once",
			edit(cluster(3, 3), func(s *State) { down(s, 2, time.Second); s.Machines[2].Remediate = true }), RemoveMember, "3", "removing it first"},
		{"recently unhealthy voter is waited for",
			edit(cluster(3, 3), func(s *State) { down(s, 2, time.Second); s.Machines[0].UpToDate = false }), Wait, "", "waiting for member m-03 to become healthy"},
		{"two of three down is degraded (I7)",
			edit(cluster(3, 3), func(s *State) { down(s, 1, time.Hour); down(s, 2, time.Hour) }), Degraded, "", "lost quorum: 2 of 3"},
		{"two of five down is remediated",
			edit(cluster(5, 5), func(s *State) { down(s, 3, time.Hour); down(s, 4, time.Hour) }), RemoveMember, "4", "removing it first"},
		{"alarms stop membership changes",
			edit(cluster(5, 3), func(s *State) { s.Members[1].Alarms = []string{"CORRUPT"} }), Degraded, "", "CORRUPT"},
		{"NOSPACE starts its recovery instead of growth",
			edit(cluster(5, 3), func(s *State) { s.Members[1].Alarms = []string{"NOSPACE"} }), Compact, "", "member m-02 has alarms [NOSPACE]: compacting"},
		{"rollout creates the replacement first (maxSurge 1)",
			edit(cluster(3, 3, abc...), func(s *State) { s.Machines[1].UpToDate = false }), CreateMachine, "fd-b", "rolling out: replacing outdated machine m-02"},
		{"scale down removes the leader only after moving leadership",
			cluster(1, 3), MoveLeader, "2", "before m-01 leaves"},
		{"scale down deletes the oldest machine of the fullest domain",
			edit(cluster(3, 4, abc...), func(s *State) { s.Members[0].Leader, s.Members[2].Leader = false, true }), DeleteMachine, "m-01", "oldest in the fullest"},
		{"scale down prefers outdated and delete-annotated",
			edit(cluster(3, 4), func(s *State) {
				s.Machines[1].DeleteAnnotated = true
				s.Machines[2].DeleteAnnotated, s.Machines[2].UpToDate = true, false
			}), DeleteMachine, "m-03", "outdated and delete-annotated"},
		{"scale down prefers delete-annotated over outdated",
			edit(cluster(3, 4), func(s *State) { s.Machines[1].DeleteAnnotated = true; s.Machines[2].UpToDate = false }), DeleteMachine, "m-02", "(delete-annotated)"},
		{"scale down prefers outdated with unhealthy components",
			edit(cluster(3, 4), func(s *State) {
				s.Machines[1].UpToDate = false
				s.Machines[2].UpToDate, s.Machines[2].ComponentsHealthy = false, false
			}), DeleteMachine, "m-03", "outdated with unhealthy components"},
		{"scale down releases the drain of a machine that left etcd",
			edit(cluster(3, 5), func(s *State) { s.Machines[4].Deleting = true; s.Members[4].Healthy = true; s.Members = s.Members[:4] }),
			RemoveHook, "m-05", "no longer hosts a voter"},
		{"converged cluster waits",
			cluster(3, 3, abc...), Wait, "", "nothing to do"},
		{"scale up waits for every voter machine's components (preflight)",
			edit(cluster(3, 1, abc...), func(s *State) { s.Machines[0].ComponentsHealthy = false }), Wait, "",
			"components on machine m-01 to be healthy before creating a machine"},
		{"scale up waits for a Ready node (preflight)",
			edit(cluster(3, 2, abc...), func(s *State) { s.Machines[1].NodeReady = false }), Wait, "",
			"components on machine m-02 to be healthy before creating a machine"},
		{"a rollout replaces a machine whose own components fail",
			edit(cluster(3, 3, abc...), func(s *State) { s.Machines[1].UpToDate, s.Machines[1].ComponentsHealthy = false, false }),
			CreateMachine, "fd-b", "rolling out: replacing outdated machine m-02"},
		{"scale down waits for the components of the machines that stay (preflight)",
			edit(cluster(3, 4, abc...), func(s *State) {
				s.Members[0].Leader, s.Members[2].Leader = false, true
				s.Machines[1].ComponentsHealthy = false
			}), Wait, "", "components on machine m-02 to be healthy before deleting machine m-01"},
		{"scale down may remove the machine whose components fail",
			edit(cluster(3, 4, abc...), func(s *State) {
				s.Members[0].Leader, s.Members[2].Leader = false, true
				s.Machines[3].UpToDate, s.Machines[3].ComponentsHealthy = false, false
			}), DeleteMachine, "m-04", "outdated with unhealthy components"},
	})
}

// planCase is one row of a planner table: Plan(state) must take kind on
// target (a machine, a member ID in hex for member steps, or a failure
// domain for CreateMachine) with a reason containing reason, and the
// decision must keep every invariant.
type planCase struct {
	name   string
	state  State
	kind   Kind
	target string
	reason string
}

func runPlanCases(t *testing.T, cases []planCase) {
	t.Helper()
	for _, tt := range cases {
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

// withLearner adds machine m-09 hosting a started learner at applied index.
func withLearner(s State, applied uint64, hook bool) State {
	return edit(s, func(s *State) {
		s.Machines = append(s.Machines, Machine{Name: "m-09", PeerURL: "https://m9:2380", UpToDate: true, HasHook: hook,
			CreatedAt: s.Now, MemberID: 9, NodeReady: true, ComponentsHealthy: true})
		s.Members = append(s.Members, Member{ID: 9, Name: "m-09", PeerURL: "https://m9:2380", Learner: true, Healthy: true,
			AppliedIndex: applied, AddedAt: s.Now})
	})
}

func targets(d Decision, target string) bool {
	switch d.Kind {
	case CreateMachine:
		return target == "" || d.FailureDomain == target
	case Promote, MoveLeader, RemoveMember, Defragment, RestartMember, Snapshot, Recover:
		return idString(d.MemberID) == target
	case Wait, Degraded:
		return target == ""
	case RestoreFromBackup:
		return d.Snapshot == target
	}
	return d.Machine == target
}

// checkAlone checks a decision against the state it was taken in, with no
// "after" effects (they are covered by the exhaustive exploration).
func checkAlone(s State, d Decision) error { return Check(s, d, s) }

// TestPlanIgnoresOrder shows Plan depends on what is observed, not on the
// order the caller lists machines and members in.
func TestPlanIgnoresOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for name, w := range initialWorlds(5) {
		s := w.state()
		want := Plan(s)
		for range 20 {
			shuffled := edit(s, func(s *State) {
				rng.Shuffle(len(s.Machines), func(i, j int) { s.Machines[i], s.Machines[j] = s.Machines[j], s.Machines[i] })
				rng.Shuffle(len(s.Members), func(i, j int) { s.Members[i], s.Members[j] = s.Members[j], s.Members[i] })
			})
			if got := Plan(shuffled); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: Plan depends on order: %s vs %s", name, got, want)
			}
		}
	}
}

func TestPlanRefusesBadDesired(t *testing.T) {
	if d := Plan(State{}); d.Kind != Degraded || !strings.Contains(d.Reason, "at least 1") {
		t.Fatalf("Plan(desired=0) = %s", d)
	}
}

// lostWorld is n voters whose last n/2+1 went down in epoch 1; the clock
// is `later` epochs on. confirmed marks their machines confirmed lost.
func lostWorld(n, later int, confirmed bool, f func(*world)) State {
	w := healthyWorld(n, n)
	for id := n/2 + 1; id <= n; id++ {
		crash(id)(&w)
		w.machine(machineName(id)).lost = confirmed
	}
	w.epoch += later
	if f != nil {
		f(&w)
	}
	return w.state()
}

func TestPlanRecovery(t *testing.T) {
	fromSurvivor := func(w *world) { w.recovery = RecoverFromSurvivor }
	runPlanCases(t, []planCase{
		{"quorum lost past the policy's wait, lost machines confirmed: recover from the survivor with the highest applied index",
			lostWorld(5, 1, true, func(w *world) { fromSurvivor(w); w.members[0].lagging = true }),
			Recover, "2", "recovering from survivor m-02, the highest applied index (5000), as a new cluster of one that keeps revision 4000"},
		{"the same survivors, none lagging: the lowest ID",
			lostWorld(5, 1, true, fromSurvivor), Recover, "1", "voters m-03, m-04, m-05 of 5 do not answer"},
		{"quorum lost for less than the policy's wait",
			lostWorld(3, 0, true, fromSurvivor), Wait, "", "recovering from survivor m-01 (applied index 5000) at 2026-01-01T00:15:00Z, after the loss has lasted 5m0s, unless they answer again"},
		{"a trigger recovers at once",
			lostWorld(3, 0, true, func(w *world) { w.triggered = true }), Recover, "1", "recovering from survivor m-01"},
		{"lost machines not confirmed lost (frozen, or behind a partition): no recovery, whatever the policy",
			lostWorld(3, 1, false, func(w *world) { w.triggered = true }), Degraded, "",
			"recovering from survivor m-01 waits until machines m-02, m-03 are confirmed lost"},
		{"one lost machine confirmed, the other not",
			lostWorld(3, 1, true, func(w *world) { fromSurvivor(w); w.machine(machineName(3)).lost = false }), Degraded, "", "until machines m-03 are confirmed lost"},
		{"Manual: the loss is reported, nothing recovered",
			lostWorld(3, 1, true, nil), Degraded, "", "etcd has lost quorum"},
		{"survivors that disagree on the membership",
			edit(lostWorld(5, 1, true, fromSurvivor), func(s *State) {
				s.Survivors = append([]Survivor(nil), s.Survivors...)
				s.Survivors[1].View = s.Survivors[1].View[:4]
			}), Degraded, "", "the members that answer disagree on the membership"},
		{"a majority answers, but the list cannot be read: no recovery",
			edit(lostWorld(3, 1, true, fromSurvivor), func(s *State) {
				s.Survivors = append(s.Survivors, Survivor{Member: Member{ID: 2, Name: "m-02", AppliedIndex: 5000}, View: s.Survivors[0].View})
			}), Degraded, "", "the etcd member list cannot be read"},
		{"a survivor whose machine is deleting is not kept",
			lostWorld(3, 1, true, func(w *world) { fromSurvivor(w); w.machines[0].deleting = true }), Degraded, "",
			"no voter that answers runs on a machine that stays"},
	})
}

// allLostWorld is a world of n machines none of whose members answers, the
// machines of those in lost confirmed lost, later epochs after the loss,
// with f applied.
func allLostWorld(n, later int, lost []int, f func(*world)) world {
	w := healthyWorld(n, n)
	for id := 1; id <= n; id++ {
		crash(id)(&w)
		w.machine(machineName(id)).lost = slices.Contains(lost, id)
	}
	w.epoch += later
	if f != nil {
		f(&w)
	}
	return w
}

func TestPlanRestoreFromBackup(t *testing.T) {
	fromBackup := func(w *world) { w.recovery, w.backupConfigured = RecoverFromBackup, true }
	restoring := allLostWorld(3, 1, []int{1, 2, 3}, fromBackup).apply(Decision{Kind: RestoreFromBackup, Snapshot: worldSnapshot})
	restoringState := restoring.state()
	runPlanCases(t, []planCase{
		{"every member lost past the wait, every machine confirmed lost: restore the newest snapshot",
			allLostWorld(3, 1, []int{1, 2, 3}, fromBackup).state(), RestoreFromBackup, worldSnapshot,
			"no member answers (machines m-01, m-02, m-03 hosted them), and their machines are confirmed lost; restoring etcd from snapshot"},
		{"a single machine lost", allLostWorld(1, 1, []int{1}, fromBackup).state(), RestoreFromBackup, worldSnapshot, "machines m-01 hosted them"},
		{"before the policy's wait", allLostWorld(1, 0, []int{1}, fromBackup).state(), Wait, "", "onto a new machine at 2026-01-01T00:15:00Z"},
		{"a machine not confirmed lost: no restore",
			allLostWorld(3, 1, []int{2, 3}, fromBackup).state(), Degraded, "", "restoring etcd from a backup waits until machines m-01 are confirmed lost"},
		{"no snapshot that can be restored",
			allLostWorld(1, 1, []int{1}, func(w *world) { fromBackup(w); w.restoreBad = true }).state(), Degraded, "",
			"no verified snapshot can be restored: snapshot read back is not what its manifest says"},
		{"a survivor answers: FromBackup recovers from it, which holds newer data",
			lostWorld(3, 1, true, fromBackup), Recover, "1", "recovering from survivor m-01"},
		{"Manual: no restore", allLostWorld(1, 1, []int{1}, func(w *world) { w.backupConfigured = true }).state(), Degraded, "", "etcd has lost quorum"},
		{"restoring: the lost machines are deleted first", restoringState, DeleteMachine, "m-01", "hosted a member of the lost cluster"},
		{"restoring: the next lost machine is deleted without waiting for the first to go",
			edit(restoringState, func(s *State) { s.Machines[0].Deleting = true }), DeleteMachine, "m-02", "hosted a member of the lost cluster"},
		{"restoring: the drains released once every lost machine is deleting",
			edit(restoringState, func(s *State) {
				for i := range s.Machines {
					s.Machines[i].Deleting = true
				}
				s.Machines[0].HasHook = false
			}), RemoveHook, "m-02", "its member went with the lost cluster"},
		{"restoring: then a wait naming every lost machine left",
			edit(restoringState, func(s *State) {
				for i := range s.Machines {
					s.Machines[i].Deleting, s.Machines[i].HasHook = true, false
				}
			}), Wait, "", "waiting for machines m-01, m-02, m-03 of the lost cluster to finish deleting"},
		{"restoring: their drains released",
			edit(restoringState, func(s *State) {
				for i := range s.Machines {
					s.Machines[i].Deleting = true
				}
			}), RemoveHook, "m-01", "its member went with the lost cluster"},
		{"restoring: once they are gone, the first machine restores the snapshot",
			edit(restoringState, func(s *State) { s.Machines = nil }), CreateMachine, "", "it restores etcd from snapshot " + worldSnapshot},
	})
	if got := Plan(edit(restoringState, func(s *State) { s.Machines = nil; s.Recovery.Restoring = false })); got.Kind != Degraded {
		t.Errorf("a first machine for a cluster that had members, outside a recovery from a backup: %s", got)
	}
	outside := Decision{Kind: CreateMachine, Reason: "a first machine"}
	if err := checkAlone(edit(restoringState, func(s *State) { s.Recovery.Restoring = false }), outside); err == nil || !strings.Contains(err.Error(), "I9") {
		t.Errorf("Check let a first machine be created for a bootstrapped cluster outside a restore: %v", err)
	}
	if err := checkAlone(restoringState, outside); err == nil || !strings.Contains(err.Error(), "machines m-01, m-02, m-03 of the lost cluster remain") {
		t.Errorf("Check let the restored cluster's first machine be created beside the lost machines: %v", err)
	}
}

func TestRestoreFromBackupVerify(t *testing.T) {
	s := allLostWorld(3, 1, []int{1, 2, 3}, func(w *world) { w.recovery, w.backupConfigured = RecoverFromBackup, true }).state()
	d := Plan(s)
	if d.Kind != RestoreFromBackup {
		t.Fatalf("planned %s", d)
	}
	if err := d.Verify(s); err != nil {
		t.Fatalf("Verify on the same state: %v", err)
	}
	for name, f := range map[string]func(*State){
		"a member answers again":             func(s *State) { s.Survivors = []Survivor{{Member: Member{ID: 1, Name: "m-01"}}} },
		"a machine no longer confirmed lost": func(s *State) { s.Machines[0].ConfirmedLost = false },
		"another snapshot is the newest":     func(s *State) { s.Restore.Snapshot = "another" },
		"the snapshot cannot be read":        func(s *State) { s.Restore.Problem = "gone" },
		"the policy changed to Manual":       func(s *State) { s.Recovery.Policy = RecoverManually },
	} {
		if err := d.Verify(edit(s, f)); err == nil {
			t.Errorf("%s: Verify passed", name)
		}
	}
}

func TestRecoverVerify(t *testing.T) {
	s := lostWorld(5, 1, true, func(w *world) { w.recovery = RecoverFromSurvivor })
	d := Plan(s)
	if d.Kind != Recover {
		t.Fatalf("planned %s", d)
	}
	if err := d.Verify(s); err != nil {
		t.Fatalf("Verify on the same state: %v", err)
	}
	for name, f := range map[string]func(*State){
		"a lost member answers again": func(s *State) {
			s.Survivors = append(s.Survivors, Survivor{Member: Member{ID: 3, Name: "m-03", AppliedIndex: 5000}, View: s.Survivors[0].View})
		},
		"a lost machine is no longer confirmed lost": func(s *State) { s.Machines[4].ConfirmedLost = false },
		"the list can be read again":                 func(s *State) { s.MembersUnknown = false },
		"the kept survivor stopped answering":        func(s *State) { s.Survivors = s.Survivors[1:] },
	} {
		fresh := edit(s, f)
		if err := d.Verify(fresh); err == nil {
			t.Errorf("%s: Verify passed", name)
		}
	}
}
