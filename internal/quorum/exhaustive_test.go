package quorum

import (
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
	w.nextMachine, w.nextMember = n, uint64(n)
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
		"stuck learner": healthy.with(func(w *world) {
			w.machines[0].upToDate = false // a rollout surge whose machine never starts etcd
			w.nextMachine++
			w.nextMember++
			w.machines = append(w.machines, wMachine{id: w.nextMachine, fd: "fd-a", addr: true, upToDate: true, broken: true, memberID: w.nextMember})
			w.members = append(w.members, wMember{id: w.nextMember, host: w.nextMachine, learner: true, since: w.epoch})
		}),
	}
	if n >= 3 {
		ws["two members down"] = healthy.with(crash(n-1, n))
		ws["scale down to "+fmt.Sprint(n-2)] = healthy.with(func(w *world) { w.desired = n - 2 })
	}
	if n <= 3 {
		ws["scale up to "+fmt.Sprint(n+2)] = healthy.with(func(w *world) { w.desired = n + 2 })
	}
	return ws
}

// TestExhaustive explores, for 1, 3 and 5 replicas, every state reachable
// from the initial worlds under the planner and up to maxFaults faults, and
// checks every transition (I1–I7) and convergence once faults stop.
func TestExhaustive(t *testing.T) {
	for _, n := range []int{1, 3, 5} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			if n == 5 && testing.Short() {
				t.Skip("5 replicas explores the most states; skipped with -short")
			}
			start := time.Now()
			e := newExplorer(Plan)
			for _, name := range slices.Sorted(maps.Keys(initialWorlds(n))) {
				e.explore(initialWorlds(n)[name], name)
			}
			for _, err := range e.errs {
				t.Error(err)
			}
			for _, k := range []Kind{CreateMachine, AddLearner, Promote, MoveLeader, RemoveMember, AddHook, RemoveHook, DeleteMachine, Wait, Degraded} {
				if e.kinds[k] == 0 {
					t.Errorf("the exploration never took a %s step", k)
				}
			}
			t.Logf("replicas=%d: %d states explored, %d degraded runs recovered or left for a human, %s; steps taken: %v",
				n, e.states, e.degr, time.Since(start).Round(time.Millisecond), e.kinds)
		})
	}
}

// TestExhaustiveCatchesPlannerWithoutQuorumChecks proves the exploration
// has teeth: a planner without its I1/I7 guards must be caught.
func TestExhaustiveCatchesPlannerWithoutQuorumChecks(t *testing.T) {
	broken := func(s State) Decision { return planWith(s, options{skipQuorumChecks: true}) }
	e := newExplorer(broken)
	for _, name := range slices.Sorted(maps.Keys(initialWorlds(3))) {
		e.explore(initialWorlds(3)[name], name)
	}
	if len(e.errs) == 0 {
		t.Fatalf("the exploration did not catch a planner without quorum checks (%d states)", e.states)
	}
	if !strings.Contains(strings.Join(e.errs, "\n"), "I7") && !strings.Contains(strings.Join(e.errs, "\n"), "I1") {
		t.Fatalf("caught, but not for quorum: %s", e.errs[0])
	}
	t.Logf("caught: %s", strings.SplitN(e.errs[0], "\n", 2)[0])
}

// TestExhaustiveCatchesPlannerWithoutLeaderTransfer: the measurement option
// that skips MoveLeader must show up as an I6 violation.
func TestExhaustiveCatchesPlannerWithoutLeaderTransfer(t *testing.T) {
	noTransfer := func(s State) Decision { return PlanWithOptions(s, Options{SkipLeaderTransfer: true}) }
	e := newExplorer(noTransfer)
	for _, name := range slices.Sorted(maps.Keys(initialWorlds(3))) {
		e.explore(initialWorlds(3)[name], name)
	}
	if len(e.errs) == 0 || !strings.Contains(strings.Join(e.errs, "\n"), "I6") {
		t.Fatalf("the exploration did not catch a planner without leader transfer (%d states, errors: %v)", e.states, e.errs)
	}
}
