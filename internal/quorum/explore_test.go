package quorum

import (
	"fmt"
	"strings"
)

// maxFaults bounds the faults injected along any one path of the
// exploration; it keeps the state space small enough to explore fully.
const maxFaults = 2

// convergeSteps bounds how many planner steps, once faults stop, the
// planner may take to reach the desired state.
const convergeSteps = 80

// fault is something the world or a user does to the cluster on its own.
type fault struct {
	name  string
	apply func(world) []world
}

func faults() []fault {
	return []fault{
		{"member crashes", eachMember(func(m *wMember, w *world) bool {
			if !m.started || !m.healthy {
				return false
			}
			m.healthy, m.leader, m.since = false, false, w.epoch
			w.elect()
			return true
		})},
		{"member recovers", eachMember(func(m *wMember, w *world) bool {
			mc := w.machine(machineName(m.host))
			if !m.started || m.healthy || mc == nil {
				return false
			}
			m.healthy, m.caughtUp = true, true
			w.elect()
			return true
		})},
		{"learner never starts", eachMachine(func(mc *wMachine, w *world) bool {
			if mc.broken || mc.deleting || (w.memberOn(mc.id) != nil && w.memberOn(mc.id).started) {
				return false
			}
			mc.broken = true
			return true
		})},
		{"user deletes a machine", eachMachine(func(mc *wMachine, _ *world) bool {
			if mc.deleting {
				return false
			}
			mc.deleting = true
			return true
		})},
		{"user removes a hook", eachMachine(func(mc *wMachine, _ *world) bool {
			if !mc.hook {
				return false
			}
			mc.hook = false
			return true
		})},
		{"machine creation fails", eachMachine(func(mc *wMachine, _ *world) bool {
			if mc.addr || mc.failed || mc.deleting {
				return false
			}
			mc.failed = true
			return true
		})},
	}
}

func eachMember(f func(*wMember, *world) bool) func(world) []world {
	return func(w world) []world {
		var out []world
		for i := range w.members {
			c := w.clone()
			if f(&c.members[i], &c) {
				out = append(out, c)
			}
		}
		return out
	}
}

func eachMachine(f func(*wMachine, *world) bool) func(world) []world {
	return func(w world) []world {
		var out []world
		for i := range w.machines {
			c := w.clone()
			if f(&c.machines[i], &c) {
				out = append(out, c)
			}
		}
		return out
	}
}

// explorer walks every state reachable from some initial worlds, under the
// planner plan and at most maxFaults faults per path.
type explorer struct {
	plan    func(State) Decision
	seen    map[string]bool
	outcome map[string]string // fault-free run from a key: "" converged, else why not
	states  int
	degr    int
	kinds   map[Kind]int // decisions taken, to show the exploration covers every step
	errs    []string
}

func newExplorer(plan func(State) Decision) *explorer {
	return &explorer{plan: plan, seen: map[string]bool{}, outcome: map[string]string{}, kinds: map[Kind]int{}}
}

type node struct {
	w      world
	faults int
	path   []string
}

// explore runs a breadth-first search and records every violation.
func (e *explorer) explore(start world, name string) {
	queue := []node{{w: start, path: []string{name}}}
	for len(queue) > 0 && len(e.errs) < 5 {
		n := queue[0]
		queue = queue[1:]
		k := fmt.Sprintf("%d|%s", n.faults, n.w.key())
		if e.seen[k] {
			continue
		}
		e.seen[k] = true
		e.states++
		next, ok := e.step(n)
		if !ok {
			continue
		}
		queue = append(queue, next)
		if n.faults == maxFaults {
			continue
		}
		for _, f := range faults() {
			for _, w := range f.apply(n.w) {
				queue = append(queue, node{w: w, faults: n.faults + 1, path: appendPath(n.path, "FAULT "+f.name)})
			}
		}
	}
}

// step takes the planner's decision in n, checks the transition and the
// liveness of the state, and returns the successor.
func (e *explorer) step(n node) (node, bool) {
	before := n.w.state()
	d := e.plan(before)
	e.kinds[d.Kind]++
	after := n.w.apply(d)
	if err := Check(before, d, after.state()); err != nil {
		e.fail(n, "%v", err)
		return node{}, false
	}
	// The user lowering desired is not a violation; QCP growing past it is.
	bound := max(n.w.desired, len(newView(before).voters())-1)
	if err := CheckMembers(bound, after.state().Members); err != nil {
		e.fail(n, "after %s: %v", d, err)
		return node{}, false
	}
	if why := e.converges(n.w); why != "" {
		e.fail(n, "does not converge: %s", why)
		return node{}, false
	}
	return node{w: after, faults: n.faults, path: appendPath(n.path, d.String())}, true
}

// converges follows the planner without faults. If it stops in Degraded,
// that must be I7 and the crashed members coming back must fix it, unless
// members whose machines are gone are needed for quorum: then only a
// restore from backup can help, and Degraded is the right answer.
func (e *explorer) converges(w world) string {
	var visited []string
	result := func(r string) string {
		for _, k := range visited {
			e.outcome[k] = r
		}
		return r
	}
	for range convergeSteps {
		k := w.key()
		if r, ok := e.outcome[k]; ok {
			return result(r)
		}
		visited = append(visited, k)
		if w.converged() {
			return result("")
		}
		s := w.state()
		d := e.plan(s)
		if err := Check(s, d, w.apply(d).state()); err != nil {
			return result(fmt.Sprintf("fault-free step breaks invariants in %s: %v", s.describe(), err))
		}
		if d.Kind == Degraded {
			e.degr++
			r := recoverAll(w)
			if r.key() != k {
				w = r
				continue
			}
			if !needsRestore(w) {
				return result(fmt.Sprintf("degraded with nothing to recover in %s: %s", s.describe(), d.Reason))
			}
			return result("") // only a restore from backup helps; Degraded is right
		}
		w = w.apply(d)
	}
	return result(fmt.Sprintf("no convergence in %d steps; stuck at %s: %s", convergeSteps, w.state().describe(), e.plan(w.state())))
}

// needsRestore reports whether quorum is lost for good: the healthy voters
// are not a majority even counting every member whose machine still exists.
func needsRestore(w world) bool {
	voters, alive := 0, 0
	for _, m := range w.members {
		if m.learner {
			continue
		}
		voters++
		if m.healthy || w.machine(machineName(m.host)) != nil {
			alive++
		}
	}
	return 2*alive <= voters
}

// recoverAll is the human bringing back every crashed member whose machine
// still exists.
func recoverAll(w world) world {
	w = w.clone()
	for i := range w.members {
		m := &w.members[i]
		if m.started && !m.healthy && w.machine(machineName(m.host)) != nil {
			m.healthy, m.caughtUp = true, true
		}
	}
	w.elect()
	return w
}

func (e *explorer) fail(n node, format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...)+"\n  state: "+n.w.state().describe()+
		"\n  path:\n    "+strings.Join(n.path, "\n    "))
}

func appendPath(p []string, s string) []string {
	out := make([]string, len(p), len(p)+1)
	copy(out, p)
	return append(out, s)
}
