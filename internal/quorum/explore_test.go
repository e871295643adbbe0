package quorum

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
)

// convergeSteps bounds how many planner steps, once faults stop, the
// planner may take to reach the desired state.
const convergeSteps = 80

// digest stands for a world's key in the explorer's sets: two 64-bit hashes
// with independent seeds. The keys themselves (a few hundred bytes each, for
// millions of states) held most of the explorer's 1.3 GB, and the garbage
// collector's scans of them took most of its CPU. Two distinct keys share a
// digest with a chance of about n²/2¹²⁹: below 10⁻²⁶ for the 2 million
// states of a run.
type digest [2]uint64

var digestSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

func digestOf(key string) digest {
	return digest{maphash.String(digestSeeds[0], key), maphash.String(digestSeeds[1], key)}
}

// spentSet is a set of (faults, stale) pairs, the fault budgets paths to a
// node used, one bit each: both stay below 8.
type spentSet uint64

func spent(faults, stale int) spentSet { return 1 << (8*faults + stale) }

// explorer walks every state reachable from some initial worlds, under the
// planner plan and at most maxFaults faults per path. A fault is a world
// fault (faults), a world fault between plan and act (the caller acts on a
// stale observation), or a wrong observation (observationFaults).
type explorer struct {
	plan      func(State) Decision
	maxFaults int
	maxStale  int                 // how many of a path's faults may be stale ones
	seen      map[digest]spentSet // nodes explored: their world's key, and the budgets spent on the way
	outcome   map[digest]string   // fault-free run from a key: "" converged, else why not
	states    int
	degr      int
	dropped   int          // stale or misobserved steps the preconditions stopped
	kinds     map[Kind]int // decisions taken, to show the exploration covers every step
	// waits counts the Waits of waitsFor, to show the exploration reaches
	// steps that wait for each other.
	waits   map[string]int
	errs    []string
	maxErrs int // stop after this many violations
}

func newExplorer(plan func(State) Decision, maxFaults int) *explorer {
	return &explorer{plan: plan, maxFaults: maxFaults, maxStale: 1, seen: map[digest]spentSet{}, outcome: map[digest]string{}, kinds: map[Kind]int{}, waits: map[string]int{}, maxErrs: 5}
}

type node struct {
	w      world
	faults int
	// stale counts the faults that struck between plan and act or in the
	// observation; the explorer's maxStale bounds them per path.
	stale int
	prev  []Member // the member list one step earlier, for stale observations
	// members is w's member list, filled in when the node is expanded.
	members []Member
	path    *pathStep
	// walked are the steps a convergence walk already planned from w on,
	// along the fault-free path, and checked: explore takes them instead
	// of planning and checking them again.
	walked []Decision
}

// pathStep is one step of the path to a node, linked to the one before: a
// node shares its parent's path instead of copying it.
type pathStep struct {
	prev *pathStep
	step string
}

func (p *pathStep) lines() []string {
	if p == nil {
		return nil
	}
	return append(p.prev.lines(), p.step)
}

// explore runs a breadth-first search and records every violation.
func (e *explorer) explore(start world, name string) {
	queue := []node{{w: start, path: &pathStep{step: name}}}
	worldFaults, staleOnly := faults(), staleFaults()
	for len(queue) > 0 && len(e.errs) < e.maxErrs {
		n := queue[0]
		queue = queue[1:]
		key := n.w.key()
		k, used := digestOf(key), spent(n.faults, n.stale)
		if e.seen[k]&used != 0 {
			continue
		}
		e.seen[k] |= used
		e.states++
		s := n.w.state()
		n.members = s.Members
		walked := len(n.walked) > 0
		var d Decision
		if walked {
			d = n.walked[0]
		} else {
			d = e.plan(s)
		}
		e.kinds[d.Kind]++
		if d.Kind == Wait {
			e.countWait(d.Reason)
		}
		var after world
		var afterState State
		if walked {
			after = n.w.apply(d)
			afterState = after.state()
			if !e.judge(n, n.w, s, d, after, afterState, "") {
				continue
			}
		} else {
			if !n.w.admits(d, s) {
				e.fail(n, "%s: its preconditions do not hold on the world it was planned on: %+v", d, d.Expect)
				continue
			}
			var ok bool
			if after, afterState, ok = e.take(n, n.w, s, d, ""); !ok {
				continue
			}
		}
		why, walk := e.converges(n.w, key, d, after, afterState)
		if why != "" {
			e.fail(n, "does not converge: %s", why)
			continue
		}
		if walked {
			walk = n.walked[1:] // n.w's own walk ended at once: an earlier one went through it
		}
		next := e.successor(n, after, 0, 0, d.String())
		next.walked = walk
		queue = append(queue, next)
		if n.faults == e.maxFaults {
			continue
		}
		stale := n.stale < e.maxStale && d.Kind != Wait && d.Kind != Degraded
		for _, f := range worldFaults {
			for _, w := range f.apply(n.w) {
				queue = append(queue, e.successor(n, w, 1, 0, "FAULT "+f.name))
				if !stale {
					continue
				}
				if after, ok := e.act(n, w, w.state(), d, "FAULT "+f.name+" between plan and act, then "); ok {
					queue = append(queue, e.successor(n, after, 1, 1, "FAULT "+f.name+" between plan and act, then "+d.String()))
				}
			}
		}
		for _, f := range staleOnly {
			for _, w := range f.apply(n.w) {
				if !stale {
					continue
				}
				if after, ok := e.act(n, w, w.state(), d, "FAULT "+f.name+" between plan and act, then "); ok {
					queue = append(queue, e.successor(n, after, 1, 1, "FAULT "+f.name+" between plan and act, then "+d.String()))
				}
			}
		}
		if n.stale >= e.maxStale {
			continue
		}
		for _, o := range observationFaults(s, n.prev) {
			d := e.plan(o.s)
			if d.Kind == Wait || d.Kind == Degraded {
				continue // acting on a wait is the same as on the true view
			}
			e.kinds[d.Kind]++
			if after, ok := e.act(n, n.w, s, d, "FAULT "+o.name+", planned "); ok {
				queue = append(queue, e.successor(n, after, 1, 1, "FAULT "+o.name+", planned "+d.String()))
			}
		}
	}
}

// waitsFor are Waits of one step for another's in flight, which the
// exploration must reach: a renewal for a renewal or a disruption, and a
// disruption for a renewal; and a wait on a member only QCP cannot reach.
var waitsFor = map[string][2]string{
	"renewal for a renewal":       {"to finish renewing its certificates", "before renewing the certificates"},
	"renewal for a disruption":    {"to finish defragmenting", "before renewing the certificates"},
	"defragmentation for renewal": {"to finish renewing its certificates", "before defragmenting"},
	// Not a step in flight: a member only QCP cannot reach, which it
	// must neither replace nor act around.
	"a member its machine vouches for, for QCP to reach it": {"to answer QCP", "its machine says it answers there"},
}

func (e *explorer) countWait(reason string) {
	for name, w := range waitsFor {
		if strings.Contains(reason, w[0]) && strings.Contains(reason, w[1]) {
			e.waits[name]++
		}
	}
}

// successor is the node after a step. A fault costs one of the path's
// budget; a stale one (between plan and act, or in the observation) also
// uses up the path's one stale fault.
func (e *explorer) successor(n node, w world, fault, stale int, step string) node {
	return node{w: w, faults: n.faults + fault, stale: n.stale + stale, prev: n.members, path: &pathStep{prev: n.path, step: step}}
}

// act carries out d in w, as a caller that enforces d's preconditions
// would; before is w.state(). A step whose preconditions fail is dropped;
// the caller plans again.
func (e *explorer) act(n node, w world, before State, d Decision, how string) (world, bool) {
	if !w.admits(d, before) {
		e.dropped++
		return w, false
	}
	after, _, ok := e.take(n, w, before, d, how)
	return after, ok
}

// take carries out d, whose preconditions hold in w, and checks the
// transition: the invariants I1–I9 (Check, against the world as it really
// was), then the rest (judge). before is w.state(); it returns the world
// after the step and its state.
func (e *explorer) take(n node, w world, before State, d Decision, how string) (world, State, bool) {
	after := w.apply(d)
	afterState := after.state()
	if err := Check(before, d, afterState); err != nil {
		e.fail(n, how+"%v", err)
		return world{}, State{}, false
	}
	return after, afterState, e.judge(n, w, before, d, after, afterState, how)
}

// judge checks what Check does not of the step d from w to after: the
// member bound, and the world invariant.
func (e *explorer) judge(n node, w world, before State, d Decision, after world, afterState State, how string) bool {
	// The user lowering desired is not a violation; QCP growing past it is.
	bound := max(w.desired, newView(before).voterCount()-1)
	if err := CheckMembers(bound, afterState.Members); err != nil {
		e.fail(n, how+"after %s: %v", d, err)
		return false
	}
	if why := worldInvariant(w, d, after); why != "" {
		e.fail(n, how+"%s", why)
		return false
	}
	return true
}

// worldInvariant judges QCP's step d by what it does to the world, not by
// the rules Check knows: no step may turn a cluster that survives one more
// failure into one without quorum, and no voter's machine may be drained
// before its member is removed, unless a human had already let it go.
func worldInvariant(before world, d Decision, after world) string {
	if d.Kind == Wait || d.Kind == Degraded {
		return ""
	}
	// What the world does next anyway (drains a machine whose hook a user
	// removed, say) is not QCP's doing: compare with QCP having waited.
	baseline, probe := before.clone(), after.clone()
	baseline.progress()
	probe.progress()
	if before.margin() >= 1 && baseline.margin() >= 0 && probe.margin() < 0 {
		return fmt.Sprintf("world: %s turned a cluster that survives one more failure into one without quorum", d)
	}
	if d.Kind == Recover {
		// I9 by what it does: the old members that may still run, the
		// survivor that became the new cluster apart, must never again be
		// a majority of the old voters.
		voters, alive := 0, 0
		for _, m := range before.members {
			if m.learner {
				continue
			}
			voters++
			if mc := before.machine(machineName(m.host)); m.id != d.MemberID && mc != nil && !mc.lost {
				alive++
			}
		}
		if 2*alive > voters {
			return fmt.Sprintf("world: %s leaves %d of the old cluster's %d voters that may still run: it could serve beside the recovered one", d, alive, voters)
		}
	}
	if d.Kind == RestoreFromBackup {
		// I9 by what it does: no member of the old cluster may ever run
		// again beside the restored one.
		for _, m := range before.members {
			if mc := before.machine(machineName(m.host)); mc != nil && !mc.lost {
				return fmt.Sprintf("world: %s while member %d's machine %s may still run: it could serve beside the restored cluster", d, m.id, machineName(mc.id))
			}
		}
	}
	if why := strategyInvariant(before, d); why != "" {
		return "world: " + why
	}
	if why := peersReachInvariant(before, d); why != "" {
		return "world: " + why
	}
	for _, mc := range after.machines {
		m := after.memberOn(mc.id)
		if probe.machine(machineName(mc.id)) != nil || m == nil || m.learner {
			continue
		}
		if was := before.machine(machineName(mc.id)); was == nil || !was.deleting || was.hook {
			return fmt.Sprintf("world: %s let voter machine %s drain before its member was removed", d, machineName(mc.id))
		}
	}
	return ""
}

// peersReachInvariant: QCP never removes a voter only because it cannot
// reach it while its peers do (a partition between the manager and one
// machine, KCP's #8465), unless something else asks for the removal: a
// health check marked its machine, the machine is deleting or outdated,
// or the cluster has more voters than desired.
func peersReachInvariant(before world, d Decision) string {
	if d.Kind != RemoveMember {
		return ""
	}
	m := before.member(d.MemberID)
	if m == nil || m.learner || !m.cut || !m.healthy {
		return ""
	}
	voters := 0
	for _, o := range before.members {
		if !o.learner {
			voters++
		}
	}
	mc := before.machine(machineName(m.host))
	if mc == nil || mc.remediate || mc.deleting || !mc.upToDate || voters > before.desired {
		return ""
	}
	return fmt.Sprintf("%s removes member %d, which only QCP cannot reach: its peers do", d, m.id)
}

// strategyInvariant is what the rollout strategies promise: no machine is
// created beyond desired + 1 (only to replace a kept machine, or while a
// deleting machine's voter waits for its replacement), or desired with
// maxSurge 0 or otherwise (deleting ones count), and OnDelete replaces nothing of its own accord: it creates a
// machine only below desired or for one a health check marked, and deletes
// a voter's machine only above desired or when marked.
func strategyInvariant(before world, d Decision) string {
	kept, marked := 0, false
	for _, o := range before.machines {
		if !o.deleting {
			kept++
			marked = marked || o.remediate
		}
	}
	// desired + 1 only to replace a kept machine surge-first, or while a
	// deleting machine's voter waits for its replacement; a replacement for
	// a machine whose member is gone waits until that machine is gone.
	deletingVoter := false
	for _, o := range before.machines {
		if m := before.memberOn(o.id); o.deleting && m != nil && !m.learner {
			deletingVoter = true
		}
	}
	limit := before.desired
	if (kept >= before.desired || deletingVoter) && (before.strategy != RemoveFirst || before.desired < minRemoveFirst) {
		limit++
	}
	switch {
	case d.Kind == CreateMachine && len(before.machines) >= limit:
		return fmt.Sprintf("%s with %d machines (deleting ones included) and %d desired: at most %d allowed", d, len(before.machines), before.desired, limit)
	case before.strategy == OnDelete && d.Kind == CreateMachine && kept >= before.desired && !marked:
		return fmt.Sprintf("%s under OnDelete with %d of %d machines and none marked", d, kept, before.desired)
	case before.strategy == OnDelete && d.Kind == DeleteMachine:
		mc := before.machine(d.Machine)
		if mc == nil {
			return ""
		}
		if m := before.memberOn(mc.id); m != nil && !m.learner && !mc.remediate && kept <= before.desired {
			return fmt.Sprintf("%s under OnDelete: nobody deleted voter machine %s and it was not marked", d, d.Machine)
		}
	}
	return ""
}

// converges follows the planner without faults from w, whose key is key.
// Its first step, d to next (whose state is nextState), is the one the
// explorer planned and checked.
// If it stops in Degraded, that must be I7 and the crashed members coming
// back must fix it, unless members whose machines are gone are needed for
// quorum: then only a restore from backup can help, and Degraded is the
// right answer. It also returns the steps it planned and checked from next
// on, while it followed the path the explorer takes (as node.walked).
func (e *explorer) converges(w world, key string, d Decision, next world, nextState State) (string, []Decision) {
	var visited []digest
	var walked []Decision
	onPath := true // w is where the explorer's fault-free successors lead
	result := func(r string) (string, []Decision) {
		for _, k := range visited {
			e.outcome[k] = r
		}
		return r, walked
	}
	var s State // w's state, from the second step on
	for i := range convergeSteps {
		if i > 0 {
			key = w.key()
		}
		k := digestOf(key)
		if r, ok := e.outcome[k]; ok {
			return result(r)
		}
		visited = append(visited, k)
		if w.converged() {
			return result("")
		}
		if i > 0 {
			d = e.plan(s)
			next = w.apply(d)
			nextState = next.state()
			if err := Check(s, d, nextState); err != nil {
				return result(fmt.Sprintf("fault-free step breaks invariants in %s: %v", s.describe(), err))
			}
			if !w.admits(d, s) {
				return result(fmt.Sprintf("fault-free step's preconditions do not hold in %s: %s", s.describe(), d))
			}
			if onPath {
				walked = append(walked, d)
			}
		}
		if d.Kind == Degraded {
			e.degr++
			r := recoverAll(next) // the world moves on while QCP waits for a human
			if r.key() != key {
				w, s, onPath = r, r.state(), false
				continue
			}
			if !needsRestore(w) {
				return result(fmt.Sprintf("degraded with nothing to recover in %s: %s", w.state().describe(), d.Reason))
			}
			if restorable(w) {
				return result(fmt.Sprintf("degraded although the policy FromBackup can restore a verified snapshot in %s: %s", w.state().describe(), d.Reason))
			}
			return result("") // only a restore from backup helps; Degraded is right
		}
		w, s = next, nextState
	}
	return result(fmt.Sprintf("no convergence in %d steps; stuck at %s: %s", convergeSteps, w.state().describe(), e.plan(w.state())))
}

// restorable reports whether QCP itself must restore w from a backup: its
// policy is FromBackup, a verified snapshot can be read, and no member
// answers, each on a machine confirmed lost.
func restorable(w world) bool {
	if w.recovery != RecoverFromBackup || !w.backupConfigured || w.restoreBad || len(w.members) == 0 {
		return false
	}
	for _, m := range w.members {
		if mc := w.machine(machineName(m.host)); m.healthy || mc == nil || !mc.lost {
			return false
		}
	}
	return true
}

// needsRestore reports whether quorum is lost for good: the healthy voters
// are not a majority even counting every member whose machine still exists,
// or the only voter is CORRUPT.
func needsRestore(w world) bool {
	var voters []wMember
	for _, m := range w.members {
		if !m.learner {
			voters = append(voters, m)
		}
	}
	if len(voters) == 1 && voters[0].alarm == "CORRUPT" {
		return true
	}
	alive := 0
	for _, m := range voters {
		if mc := w.machine(machineName(m.host)); m.healthy || mc != nil && !mc.lost {
			alive++
		}
	}
	return 2*alive <= len(voters)
}

// recoverAll is the human answering Degraded: bringing back every crashed
// member whose machine still exists, defragmenting and disarming NOSPACE,
// and deleting the machine of a CORRUPT member so QCP replaces it.
func recoverAll(w world) world {
	w = w.clone()
	for i := range w.members {
		m := &w.members[i]
		mc := w.machine(machineName(m.host))
		if m.started && !m.healthy && mc != nil && !mc.lost {
			m.finishDisruption()
			m.healthy, m.caughtUp = true, true
		}
		switch {
		case m.alarm == "NOSPACE":
			m.alarm, m.overQuota, m.liveOverQuota = "", false, false // quota raised, or data deleted
		case m.alarm == "CORRUPT" && mc != nil:
			mc.deleting = true
		case m.alarm == "CORRUPT":
			m.alarm = "" // its machine is gone: disarm what is left
		}
	}
	// A departed member's CORRUPT waits for a person, who checks the data
	// and disarms it; QCP disarms a departed NOSPACE itself.
	w.departed = slices.DeleteFunc(w.departed, func(a Alarm) bool { return a.Type == "CORRUPT" })
	w.elect()
	return w
}

func (e *explorer) fail(n node, format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...)+"\n  state: "+n.w.state().describe()+
		"\n  path:\n    "+strings.Join(n.path.lines(), "\n    "))
}
