package quorum

import (
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

var threeDomains = []string{"fd-a", "fd-b", "fd-c"}

// healthyWorld is n up-to-date voters, spread alphabetically over domains,
// each under the hook; the first is the leader.
func healthyWorld(desired, n int) world {
	w := world{desired: desired, domains: threeDomains, epoch: 1}
	for i := 1; i <= n; i++ {
		w.machines = append(w.machines, wMachine{id: i, fd: threeDomains[(i-1)%3], addr: true, upToDate: true, hook: true, memberID: uint64(i)})
		w.members = append(w.members, wMember{id: uint64(i), host: i, started: true, healthy: true, caughtUp: true, leader: i == 1})
	}
	w.nextMachine, w.nextMember, w.bootstrapped = n, uint64(n), n > 0
	return w
}

func (w world) with(f func(*world)) world {
	w = w.clone()
	f(&w)
	return w
}

func crash(ids ...int) func(*world) {
	return func(w *world) {
		for _, id := range ids {
			m := w.member(uint64(id))
			m.healthy, m.leader, m.since = false, false, w.epoch
		}
		w.elect()
	}
}

// fragment makes every member's database mostly free pages.
func fragment(w *world) {
	for i := range w.members {
		w.members[i].fragmented = true
	}
}

// raiseQuota raises the configured quota over the one every member runs
// with.
func raiseQuota(w *world) {
	w.quotaRaised = true
	for i := range w.members {
		w.members[i].oldQuota = true
	}
}

// backupsConfigured turns backups on, with no recent snapshot: risky steps
// take one first.
func backupsConfigured(w *world) { w.backupConfigured = true }

// backupDue has the backup schedule ask for a snapshot.
func backupDue(w *world) { w.backupDue = true }

// certificatesDue has every machine's certificates pass their renewal
// point.
func certificatesDue(w *world) {
	for i := range w.machines {
		w.machines[i].certsDue = true
	}
}

// rotationStage has every machine lack u of an etcd CA rotation's stage.
func rotationStage(u AuthorityUpdate) func(w *world) {
	return func(w *world) {
		for i := range w.machines {
			w.machines[i].authority = u
		}
	}
}

// initialWorlds are the interesting starting points for desired replicas n.
func initialWorlds(n int) map[string]world {
	healthy := healthyWorld(n, n)
	ws := map[string]world{
		"fresh":                 {desired: n, domains: threeDomains, epoch: 1},
		"healthy":               healthy,
		"one member down":       healthy.with(crash(n)),
		"machine being deleted": healthy.with(func(w *world) { w.machines[0].deleting = true }),
		"hook removed by hand on a deleting machine": healthy.with(func(w *world) {
			w.machines[n-1].deleting, w.machines[n-1].hook = true, false
		}),
		"hook removed by hand": healthy.with(func(w *world) { w.machines[0].hook = false }),
		"outdated machines": healthy.with(func(w *world) {
			for i := range w.machines {
				w.machines[i].upToDate = false
			}
		}),
		"delete-annotated outdated machine": healthy.with(func(w *world) {
			w.machines[n-1].upToDate, w.machines[n-1].annotated = false, true
		}),
		"fragmented databases": healthy.with(fragment),
		"NOSPACE on every member": healthy.with(func(w *world) {
			for i := range w.members {
				w.members[i].alarm, w.members[i].overQuota = "NOSPACE", true
			}
		}),
		"NOSPACE with the live data over the quota": healthy.with(func(w *world) {
			for i := range w.members {
				w.members[i].alarm, w.members[i].liveOverQuota = "NOSPACE", true
			}
		}),
		"quota raised":                healthy.with(raiseQuota),
		"backup due":                  healthy.with(backupDue),
		"backup due, one member down": healthy.with(backupDue).with(crash(n)),
		"backup due, outdated machines": healthy.with(backupDue).with(func(w *world) {
			for i := range w.machines {
				w.machines[i].upToDate = false
			}
		}),
		"NOSPACE with the live data over the quota, then the quota raised": healthy.with(func(w *world) {
			for i := range w.members {
				w.members[i].alarm, w.members[i].liveOverQuota = "NOSPACE", true
			}
			raiseQuota(w)
		}),
		"stuck learner": healthy.with(func(w *world) {
			w.machines[0].upToDate = false // a rollout surge whose machine never starts etcd
			w.nextMachine++
			w.nextMember++
			w.machines = append(w.machines, wMachine{id: w.nextMachine, fd: "fd-a", addr: true, upToDate: true, broken: true, memberID: w.nextMember})
			w.members = append(w.members, wMember{id: w.nextMember, host: w.nextMachine, learner: true, since: w.epoch})
		}),
	}
	// An etcd CA rotation's stages: a trust change restarts each member,
	// a leaf move is like a renewal.
	ws["etcd CA rotation: trust"] = healthy.with(rotationStage(AuthorityTrust))
	ws["etcd CA rotation: leaves, a member down"] = healthy.with(rotationStage(AuthorityLeaves)).with(crash(n))
	if n <= 3 {
		// Issue 35: the first machine restores a snapshot, which it may
		// only once the snapshot was found and checked.
		ws["fresh, restoring a snapshot that cannot be used yet"] = world{desired: n, domains: threeDomains, epoch: 1, restore: true, restoreBad: true}
	}
	if n == 1 {
		// Issue 28, hole 4: the first machine bootstrapped etcd, and is
		// being deleted, before QCP ever read the member list (nothing
		// recorded). More replicas only add the scale-up after it.
		ws["unknown membership with a first machine deleting"] = world{desired: n, domains: threeDomains, epoch: 1, nextMachine: 1, nextMember: 1,
			machines: []wMachine{{id: 1, fd: "fd-a", addr: true, upToDate: true, hook: true, deleting: true}},
			members:  []wMember{{id: 1, host: 1, started: true, healthy: true, caughtUp: true, leader: true}}}
	}
	if n != 3 {
		// Renewals come before defragmentations, and each waits for the
		// other's step in flight (3 replicas reach this through the
		// world below, at a fraction of the states).
		ws["certificates due, databases fragmented"] = healthy.with(fragment).with(certificatesDue)
		// Controller hole 2: alarms whose members QCP already removed
		// (3 replicas reach them through removals of alarmed members).
		ws["a removed member's NOSPACE"] = healthy.with(func(w *world) { w.departed = []Alarm{{MemberID: 99, Type: "NOSPACE"}} })
		ws["a removed member's CORRUPT"] = healthy.with(func(w *world) { w.departed = []Alarm{{MemberID: 99, Type: "CORRUPT"}} })
	}
	if n == 3 {
		// Issue 7 item 3: a scale-down victim must wait while another
		// voter is down, or one more failure loses quorum.
		ws["scale down from 5 with a member down"] = healthyWorld(3, 5).with(crash(4)).with(func(w *world) { w.machines[1].deleting = true })
		ws["scale down from 5, backups configured"] = healthyWorld(3, 5).with(backupsConfigured)
		ws["outdated machines, maxSurge 0, backups configured"] = healthy.with(backupsConfigured).with(func(w *world) {
			w.strategy = RemoveFirst
			for i := range w.machines {
				w.machines[i].upToDate = false
			}
		})
	}
	if n >= 3 {
		ws["one failure domain becomes three"] = healthy.with(func(w *world) {
			for i := range w.machines {
				w.machines[i].fd = "fd-a"
			}
		})
		outdated := ws["outdated machines"]
		ws["outdated machines, maxSurge 0"] = outdated.with(func(w *world) { w.strategy = RemoveFirst })
		ws["outdated machines, OnDelete"] = outdated.with(func(w *world) { w.strategy = OnDelete })
		ws["two outdated machines deleted by a user, OnDelete"] = outdated.with(func(w *world) {
			w.strategy = OnDelete
			w.machines[0].deleting, w.machines[1].deleting = true, true
		})
		ws["two members down"] = healthy.with(crash(n-1, n))
		// Issue 35: quorum lost for good. The majority's machines stopped
		// and were confirmed lost, and QCP recovers from a survivor; or
		// they were frozen, not confirmed, and it must not (they may be
		// confirmed later, or come back).
		majority := make([]int, 0, n)
		for id := n/2 + 1; id <= n; id++ {
			majority = append(majority, id)
		}
		lose := func(w *world) {
			for _, id := range majority {
				w.machine(machineName(id)).lost = true
			}
		}
		fromSurvivor := func(w *world) { w.recovery = RecoverFromSurvivor }
		ws["quorum lost, the majority's machines confirmed lost, FromSurvivor"] = healthy.with(crash(majority...)).with(lose).with(fromSurvivor).with(func(w *world) {
			w.members[0].lagging = true // the first survivor trails: QCP keeps the other
		})
		ws["quorum lost, the majority frozen, FromSurvivor"] = healthy.with(crash(majority...)).with(fromSurvivor)
		// Renewals wait for a defragmentation in flight, then for each
		// other, and the leader's defragmentation waits for them.
		ws["certificates due during a defragmentation"] = healthy.with(func(w *world) {
			*w = w.apply(Decision{Kind: Defragment, MemberID: 2, Machine: machineName(2)})
			w.members[0].fragmented = true
			w.machines[0].certsDue, w.machines[n-1].certsDue = true, true
		})
	}
	if n <= 3 {
		// Issue 35: every member lost, FromBackup. With every machine
		// confirmed lost QCP restores the newest verified snapshot onto a
		// new machine; with one only stopped (it may come back) it must
		// not, and a fault may confirm it later.
		all := make([]int, 0, n)
		for id := 1; id <= n; id++ {
			all = append(all, id)
		}
		fromBackup := func(w *world) { w.recovery, w.backupConfigured, w.backupFresh = RecoverFromBackup, true, true }
		ws["every member lost, their machines confirmed lost, FromBackup"] = healthy.with(crash(all...)).with(fromBackup).with(func(w *world) {
			for i := range w.machines {
				w.machines[i].lost = true
			}
		})
		ws["every member stopped, one machine not confirmed lost, FromBackup"] = healthy.with(crash(all...)).with(fromBackup).with(func(w *world) {
			for i := range w.machines[1:] {
				w.machines[i+1].lost = true
			}
		})
	}
	if n == 3 {
		ws["quorum lost, the majority's machines confirmed lost, Manual"] = healthy.with(crash(2, 3)).with(func(w *world) {
			w.machine(machineName(2)).lost, w.machine(machineName(3)).lost = true, true
		})
		ws["quorum lost, the majority's machines confirmed lost, a recovery triggered"] = ws["quorum lost, the majority's machines confirmed lost, Manual"].with(func(w *world) {
			w.triggered = true
		})
	}
	if n <= 3 {
		ws["scale up to "+fmt.Sprint(n+2)] = healthy.with(func(w *world) { w.desired = n + 2 })
	}
	return ws
}

var deep = flag.Bool("deep", false, "explore deeper: minutes instead of seconds")

// budget is how many faults one path of the exploration may take for n
// replicas, and how many of them may be stale (between plan and act, or in
// the observation): enough to find every hole the review found, within a
// minute for the three sizes together in make test. -deep adds a fault for
// 1 and 5 replicas and a second stale fault for 3 (a third fault for 3
// replicas passes 5 million states and 5 GB).
func budget(n int) (faults, stale int) {
	faults, stale = map[int]int{1: 2, 3: 2, 5: 1}[n], 1
	switch {
	case *deep && n == 3:
		stale++
	case *deep:
		faults++
	}
	return faults, stale
}

// exploreAll explores every initial world for n replicas, those named in
// first before the others (a mutant test names where it expects the hole).
func exploreAll(plan func(State) Decision, n, maxErrs int, first ...string) *explorer {
	faults, stale := budget(n)
	e := newExplorer(plan, faults)
	e.maxErrs, e.maxStale = maxErrs, stale
	worlds := initialWorlds(n)
	rest := slices.DeleteFunc(slices.Sorted(maps.Keys(worlds)), func(n string) bool { return slices.Contains(first, n) })
	names := append(slices.Clone(first), rest...)
	for _, name := range names {
		if len(e.errs) < maxErrs {
			e.explore(worlds[name], name)
		}
	}
	return e
}

// TestExhaustive explores, for 1, 3 and 5 replicas, every state reachable
// from the initial worlds under the planner within the fault budget,
// and checks every transition (I1–I9 and the world invariant) and
// convergence once faults stop.
func TestExhaustive(t *testing.T) {
	for _, n := range []int{1, 3, 5} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			t.Parallel()
			if n == 5 && testing.Short() {
				t.Skip("5 replicas explores the most states; skipped with -short")
			}
			start := time.Now()
			e := exploreAll(Plan, n, 5)
			for _, err := range e.errs {
				t.Error(err)
			}
			for _, k := range Kinds {
				if e.kinds[k] == 0 && (k != Recover || n > 1) && (k != RestoreFromBackup || n != 5) { // one voter leaves no survivor to recover from; 5 explore no total loss
					t.Errorf("the exploration never took a %s step", k)
				}
			}
			for name := range waitsFor {
				if e.waits[name] == 0 && n >= 3 {
					t.Errorf("the exploration never waited: %s", name)
				}
			}
			if e.dropped == 0 {
				t.Error("no stale or misobserved step was ever stopped by its preconditions: the exploration does not reach them")
			}
			faults, stale := budget(n)
			t.Logf("replicas=%d, %d faults per path (%d stale): %d states explored, %d stale or misobserved steps stopped by their preconditions, %d degraded runs recovered or left for a human, %s; steps taken: %v; waits: %v",
				n, faults, stale, e.states, e.dropped, e.degr, time.Since(start).Round(time.Millisecond), e.kinds, e.waits)
		})
	}
}

// TestExhaustiveCatchesBrokenPlanners proves the exploration has teeth:
// each deliberately broken planner must be caught, for the right reason.
func TestExhaustiveCatchesBrokenPlanners(t *testing.T) {
	tests := []struct {
		name  string
		opts  options
		want  []string // any of these in the first error
		world string   // the initial world where the hole is expected
	}{
		{"without quorum checks", options{skipQuorumChecks: true}, []string{"I1", "I7"}, "two members down"},
		{"without leader transfer", options{skipLeaderTransfer: true}, []string{"I6"}, "outdated machines"},
		{"with protectVoters run last", options{protectVotersLast: true}, []string{"I5", "world"}, "hook removed by hand"},
		{"removing a healthy voter while another is down", options{removeHealthyWithOtherDown: true}, []string{"I1 quorum: removing healthy voter"},
			"scale down from 5 with a member down"},
		// Issue 28's planner holes, one mutant each.
		{"letting a voter leave a maxSurge 0 rollout already a voter short", options{noVoterFloor: true}, []string{"I8"}, "outdated machines, maxSurge 0"},
		{"whose preconditions ignore machines created since the plan", options{verifyIgnoresMachines: true}, []string{"I4", "at most"}, "scale up to 5"},
		{"releasing a first machine's hook while the member list is unreadable", options{releaseHookUnknown: true}, []string{"I5"},
			"unknown membership with a first machine deleting"},
		// Issue 37: QCP's view alone does not condemn a member.
		{"remediating a member only QCP cannot reach", options{ignoreMachinesWord: true}, []string{"which only QCP cannot reach"}, "healthy"},
		{"waiting forever for a stalled learner", options{keepStalledLearners: true}, []string{"does not converge"}, "outdated machines"},
		// Issue 36: a defragmentation is a disruption of its own.
		{"defragmenting before every other rule, without its preflight", options{defragFirst: true}, []string{"I4 one at a time"}, "fragmented databases"},
		{"defragmenting the leader in place", options{defragLeader: true}, []string{"I6 leader: Defragment of leader"}, "fragmented databases"},
		{"compacting again on every NOSPACE round", options{compactAgain: true}, []string{"does not converge"}, "NOSPACE with the live data over the quota"},
		{"restarting for a new quota without a disruption's preflight", options{restartUnchecked: true}, []string{"I4 one at a time"}, "quota raised"},
		{"renewing certificates beside a renewal or a disruption in flight", options{renewUnchecked: true}, []string{"I4 one at a time: renewing the certificates"},
			"certificates due during a defragmentation"},
		// Issue 35: a snapshot spares the leader.
		{"taking snapshots from the leader", options{snapshotFromLeader: true}, []string{"snapshot source: member"}, "backup due"},
		{"creating the first machine from a snapshot that cannot be used", options{restoreUnchecked: true}, []string{"restore source"},
			"fresh, restoring a snapshot that cannot be used yet"},
		{"recovering from a survivor while lost machines may still run", options{recoverUnfenced: true}, []string{"I9 one cluster", "could serve beside"},
			"quorum lost, the majority frozen, FromSurvivor"},
		{"restoring from a backup while a stopped machine may still run", options{recoverUnfenced: true}, []string{"I9 one cluster", "could serve beside"},
			"every member stopped, one machine not confirmed lost, FromBackup"},
	}
	t.Run("deleting a marked API server first while it serves again", func(t *testing.T) {
		t.Parallel()
		states, _, err := exploreAPIServers(func(s State) Decision { return planWith(s, options{deleteServingMarked: true}) })
		if !strings.Contains(err, "deleted serving machine") {
			t.Fatalf("the APIServersOnly exploration did not catch it (%d states): %q", states, err)
		}
		t.Logf("caught: %s", err)
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			broken := func(s State) Decision { return planWith(s, tt.opts) }
			replicas := 3
			if _, ok := initialWorlds(3)[tt.world]; !ok {
				replicas = 1 // a world only one replica explores
			}
			e := exploreAll(broken, replicas, 1, tt.world)
			if len(e.errs) == 0 {
				t.Fatalf("the exploration did not catch a planner %s (%d states)", tt.name, e.states)
			}
			first := strings.SplitN(e.errs[0], "\n", 2)[0]
			if !slices.ContainsFunc(tt.want, func(w string) bool { return strings.Contains(e.errs[0], w) }) {
				t.Fatalf("caught, but not for %v: %s", tt.want, e.errs[0])
			}
			t.Logf("caught: %s", first)
		})
	}
}
