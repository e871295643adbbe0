package quorum

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// apiMachine is one machine of an APIServersOnly world: its lifecycle is
// pending (no address) → starting (address, not serving) → serving.
type apiMachine struct {
	name                       string
	fd                         string
	age                        int // creation order
	stage                      int // 0 pending, 1 starting, 2 serving
	outdated, marked, deleting bool
	failed, hook               bool
	// stale: the machine recovered after a health check marked it, and
	// serves; CAPI's health check never clears a mark (issue 28, hole 3).
	stale bool
	// certsDue: its certificates passed their renewal point; renewing:
	// its agent renews them now (an open record, a minute old).
	certsDue, renewing bool
}

type apiWorld struct {
	desired  int
	strategy Strategy
	domains  []string
	machines []apiMachine
	next     int
	problem  string // ExternalEtcdProblem
}

var apiNow = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (w apiWorld) clone() apiWorld {
	w.machines = slices.Clone(w.machines)
	return w
}

func (w apiWorld) state() State {
	s := State{Desired: w.desired, Topology: APIServersOnly, Strategy: w.strategy, FailureDomains: w.domains, Now: apiNow, ExternalEtcdProblem: w.problem,
		// Members are ignored in this topology, whatever the caller lists.
		Members: []Member{{ID: 1, Name: "stray", Healthy: true}},
		// The controller's: bootstrapped once an API server answered.
		Bootstrapped: slices.ContainsFunc(w.machines, func(m apiMachine) bool { return m.stage == 2 })}
	for _, m := range w.machines {
		pm := Machine{Name: m.name, FailureDomain: m.fd, UpToDate: !m.outdated, CreatedAt: apiNow.Add(time.Duration(m.age) * time.Minute),
			ResourceVersion: "1", Deleting: m.deleting, HasHook: m.hook, CreationFailed: m.failed, Remediate: m.marked}
		if m.stage > 0 {
			pm.PeerURL = "https://" + m.name + ":2380"
		}
		if m.stage == 2 && (!m.marked || m.stale) {
			pm.NodeReady, pm.ComponentsHealthy = true, true
		}
		switch {
		case m.certsDue:
			pm.CertificatesRenewAt = apiNow.Add(-time.Duration(m.age) * time.Minute)
		case m.stage > 0:
			pm.CertificatesRenewAt = apiNow.Add(200 * 24 * time.Hour)
		}
		if m.renewing {
			pm.RenewStartedAt = apiNow.Add(-time.Minute)
		}
		s.Machines = append(s.Machines, pm)
	}
	return s
}

func (w apiWorld) key() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d%s%v|", w.desired, w.strategy, w.domains)
	for _, m := range w.machines {
		fmt.Fprintf(&b, "%s%s%d%d%s;", m.name, m.fd, m.age, m.stage, bits(m.outdated, m.marked, m.deleting, m.failed, m.hook, m.stale, m.certsDue, m.renewing))
	}
	return b.String()
}

func (w *apiWorld) find(name string) int {
	return slices.IndexFunc(w.machines, func(m apiMachine) bool { return m.name == name })
}

// apply carries out d.
func (w apiWorld) apply(d Decision) apiWorld {
	w = w.clone()
	switch d.Kind {
	case CreateMachine:
		w.next++
		w.machines = append(w.machines, apiMachine{name: fmt.Sprintf("n%d", w.next), fd: d.FailureDomain, age: 10 + w.next})
	case DeleteMachine:
		w.machines[w.find(d.Machine)].deleting = true
	case RemoveHook:
		w.machines[w.find(d.Machine)].hook = false
	case RenewCertificates:
		w.machines[w.find(d.Machine)].renewing = true
	}
	return w
}

// progress returns the worlds one step of the world's own progress can
// lead to: one machine advances a stage or finishes renewing its
// certificates, or one deleting machine without the hook goes.
func (w apiWorld) progress() []apiWorld {
	var out []apiWorld
	for i, m := range w.machines {
		switch {
		case m.renewing:
			n := w.clone()
			n.machines[i].renewing, n.machines[i].certsDue = false, false
			out = append(out, n)
		case m.deleting && !m.hook:
			n := w.clone()
			n.machines = slices.Delete(n.machines, i, i+1)
			out = append(out, n)
		case !m.deleting && !m.failed && !m.marked && m.stage < 2:
			n := w.clone()
			n.machines[i].stage++
			out = append(out, n)
		case m.marked && !m.stale && !m.deleting && m.stage == 2:
			n := w.clone() // the marked machine recovers; its mark stays
			n.machines[i].stale = true
			out = append(out, n)
		}
	}
	return out
}

func (w apiWorld) serving(except string) int {
	n := 0
	for _, m := range w.machines {
		if m.name != except && !m.deleting && !m.failed && (!m.marked || m.stale) && m.stage == 2 {
			n++
		}
	}
	return n
}

// apiInvariant is what a step of the APIServersOnly planner must never do,
// besides I1–I9 (Check): create while a kept machine starts (I4) or beyond
// the machine budget (I2: desired, and desired + 1 only to replace a kept
// machine surge-first), delete a serving machine while another machine
// is deleting or starting, or leave fewer serving machines than desired
// (one fewer with RemoveFirst, whose maxSurge is 0).
func apiInvariant(w apiWorld, s State, d Decision) string {
	if err := Check(s, d, s); err != nil {
		return err.Error()
	}
	// desired + 1 only to replace a kept machine surge-first: a
	// replacement for one that went waits until it is gone.
	kept := 0
	for _, m := range w.machines {
		if !m.deleting {
			kept++
		}
	}
	limit := w.desired
	if kept >= w.desired && (w.strategy != RemoveFirst || w.desired < minRemoveFirst) {
		limit++
	}
	switch d.Kind {
	case CreateMachine:
		if len(w.machines)+1 > limit {
			return fmt.Sprintf("created a machine beyond the budget of %d", limit)
		}
		for _, m := range w.machines {
			if !m.deleting && !m.failed && !m.marked && m.stage < 2 {
				return "created a machine while " + m.name + " starts"
			}
		}
	case DeleteMachine:
		victim := w.machines[w.find(d.Machine)]
		if victim.deleting {
			return "deleted a deleting machine"
		}
		if victim.stage < 2 || (victim.marked && !victim.stale) || victim.failed {
			return "" // it serves nothing: deleting it loses nothing
		}
		for _, m := range w.machines {
			if m.name != victim.name && (m.deleting || (!m.failed && !m.marked && m.stage < 2)) {
				return "deleted serving machine " + victim.name + " while " + m.name + " is deleting or starting"
			}
		}
		floor := w.desired
		if w.strategy == RemoveFirst && w.desired >= minRemoveFirst {
			floor--
		}
		if w.serving(victim.name) < floor {
			return fmt.Sprintf("deleted serving machine %s, leaving %d serving, fewer than %d", victim.name, w.serving(victim.name), floor)
		}
	}
	return ""
}

// converged: desired machines, all serving and up to date (but OnDelete
// keeps outdated ones), spread evenly, nothing deleting, and Plan content.
func (w apiWorld) converged(d Decision) bool {
	if len(w.machines) != w.desired || w.serving("") != w.desired || d.Kind != Wait || !strings.HasPrefix(d.Reason, "nothing to do") {
		return false
	}
	if slices.ContainsFunc(w.machines, func(m apiMachine) bool { return m.certsDue || m.renewing }) {
		return false
	}
	return w.strategy == OnDelete || !slices.ContainsFunc(w.machines, func(m apiMachine) bool { return m.outdated })
}

// apiStarts are the initial worlds: every combination of up to three
// machines in assorted stages and conditions, for 1 to 3 desired replicas,
// each strategy, with and without failure domains.
func apiStarts() []apiWorld {
	kinds := []apiMachine{
		{stage: 2}, {stage: 2, outdated: true}, {stage: 0}, {stage: 1}, {stage: 2, marked: true}, {stage: 2, marked: true, stale: true},
		{stage: 2, deleting: true, hook: true}, {failed: true}, {stage: 2, hook: true}, {stage: 2, certsDue: true},
	}
	var out []apiWorld
	var grow func(ms []apiMachine, from int)
	grow = func(ms []apiMachine, from int) {
		for desired := 1; desired <= 3; desired++ {
			for _, st := range []Strategy{SurgeFirst, RemoveFirst, OnDelete} {
				for _, domains := range [][]string{nil, {"fd-a", "fd-b"}} {
					w := apiWorld{desired: desired, strategy: st, domains: domains, machines: slices.Clone(ms)}
					for i := range w.machines {
						w.machines[i].name, w.machines[i].age = fmt.Sprintf("m%d", i), i
						if len(domains) > 0 {
							w.machines[i].fd = domains[i%len(domains)]
						}
					}
					out = append(out, w)
				}
			}
		}
		if len(ms) == 3 {
			return
		}
		for k := from; k < len(kinds); k++ {
			grow(append(slices.Clone(ms), kinds[k]), k)
		}
	}
	grow(nil, 0)
	return out
}

// TestAPIServersOnlyExhaustive walks every state reachable from apiStarts,
// the world advancing any one machine between steps, and checks every
// step against I1–I9 and apiInvariant; from every state, the planner left
// alone with a progressing world must converge.
func TestAPIServersOnlyExhaustive(t *testing.T) {
	states, kinds, err := exploreAPIServers(Plan)
	if err != "" {
		t.Fatal(err)
	}
	t.Logf("%d states; decisions %v", states, kinds)
	taken := []Kind{CreateMachine, DeleteMachine, RemoveHook, RenewCertificates, Wait}
	for _, k := range taken {
		if kinds[k] == 0 {
			t.Errorf("the exploration never took a %s step", k)
		}
	}
	for k := range kinds {
		if !slices.Contains(taken, k) {
			t.Errorf("the APIServersOnly planner took a %s step, which needs an etcd member", k)
		}
	}
}

// exploreAPIServers explores the APIServersOnly world under plan and
// returns the first violation, or "".
func exploreAPIServers(plan func(State) Decision) (states int, kinds map[Kind]int, violation string) {
	seen := map[string]bool{}
	kinds = map[Kind]int{}
	queue := apiStarts()
	for len(queue) > 0 {
		w := queue[0]
		queue = queue[1:]
		if seen[w.key()] || len(w.machines) > 5 {
			continue
		}
		seen[w.key()] = true
		s := w.state()
		d := plan(s)
		kinds[d.Kind]++
		if err := d.Verify(s); err != nil {
			return len(seen), kinds, fmt.Sprintf("%s: %s does not verify on the state it was planned on: %v", s.describe(), d, err)
		}
		if bad := apiInvariant(w, s, d); bad != "" {
			return len(seen), kinds, fmt.Sprintf("%s: %s: %s", s.describe(), d, bad)
		}
		if d.Kind == Degraded {
			return len(seen), kinds, fmt.Sprintf("%s: degraded: %s", s.describe(), d.Reason)
		}
		if why := apiConverges(w, plan); why != "" {
			return len(seen), kinds, fmt.Sprintf("from %s: %s", s.describe(), why)
		}
		after := w.apply(d)
		queue = append(queue, after)
		queue = append(queue, after.progress()...)
	}
	return len(seen), kinds, ""
}

// apiConverges runs the planner on w with the world progressing in order
// (every machine advancing at once) and reports why it does not converge.
func apiConverges(w apiWorld, plan func(State) Decision) string {
	var trail []string
	for range 40 {
		s := w.state()
		d := plan(s)
		trail = append(trail, d.String())
		if w.converged(d) {
			return ""
		}
		if bad := apiInvariant(w, s, d); bad != "" {
			return bad + " after " + strings.Join(trail, " → ")
		}
		w = w.apply(d).advanceAll()
	}
	return "did not converge in 40 steps: " + strings.Join(trail[len(trail)-5:], " → ")
}

// advanceAll moves every machine one stage on and lets every deleting
// machine without the hook go.
func (w apiWorld) advanceAll() apiWorld {
	w = w.clone()
	var kept []apiMachine
	for _, m := range w.machines {
		if m.deleting && !m.hook {
			continue
		}
		if !m.deleting && !m.failed && !m.marked && m.stage < 2 {
			m.stage++
		}
		if m.renewing {
			m.renewing, m.certsDue = false, false
		}
		kept = append(kept, m)
	}
	w.machines = kept
	return w
}

func TestAPIServersOnlyDecisions(t *testing.T) {
	serving := func(name, fd string, age int) apiMachine { return apiMachine{name: name, fd: fd, age: age, stage: 2} }
	abc := []string{"fd-a", "fd-b", "fd-c"}
	tests := []struct {
		name   string
		w      apiWorld
		kind   Kind
		target string
		reason string
	}{
		{"an empty control plane creates its first machine, and bootstraps no etcd",
			apiWorld{desired: 2, domains: abc}, CreateMachine, "fd-a", "scaling up: 0 of 2 machines in failure domain fd-a"},
		{"a starting machine is waited for before the next",
			apiWorld{desired: 2, machines: []apiMachine{{name: "a", stage: 1}}}, Wait, "", "waiting for machine a to serve before creating another"},
		{"scale up spreads over the domains",
			apiWorld{desired: 3, domains: abc, machines: []apiMachine{serving("a", "fd-a", 0), serving("b", "fd-b", 1)}}, CreateMachine, "fd-c", "scaling up: 2 of 3"},
		{"a rollout creates the replacement first",
			apiWorld{desired: 2, machines: []apiMachine{serving("a", "", 0), {name: "b", stage: 2, outdated: true, age: 1}}}, CreateMachine, "", "rolling out: replacing outdated machine b"},
		{"the outdated machine goes once its replacement serves",
			apiWorld{desired: 2, machines: []apiMachine{serving("a", "", 0), {name: "b", stage: 2, outdated: true, age: 1}, serving("c", "", 2)}},
			DeleteMachine, "b", "scaling down: 3 of 2 machines; deleting b (outdated)"},
		{"not while the replacement starts",
			apiWorld{desired: 2, machines: []apiMachine{serving("a", "", 0), {name: "b", stage: 2, outdated: true, age: 1}, {name: "c", stage: 1, age: 2}}},
			Wait, "", "waiting for machine c to serve"},
		{"RemoveFirst deletes the outdated machine first",
			apiWorld{desired: 3, strategy: RemoveFirst, machines: []apiMachine{serving("a", "", 0), serving("b", "", 1), {name: "c", stage: 2, outdated: true, age: 2}}},
			DeleteMachine, "c", "deleting it first (maxSurge 0)"},
		{"a marked machine that serves again is replaced first: it may be the last API server",
			apiWorld{desired: 2, machines: []apiMachine{{name: "a", stage: 2, marked: true, stale: true}, {name: "b", stage: 1, age: 1}}},
			Wait, "", "waiting for machine b to serve"},
		{"a marked machine that serves again goes once its replacement serves",
			apiWorld{desired: 2, machines: []apiMachine{{name: "a", stage: 2, marked: true, stale: true}, serving("b", "", 1), serving("c", "", 2)}},
			DeleteMachine, "a", "deleting a (marked for remediation)"},
		{"a marked machine is deleted first, then replaced",
			apiWorld{desired: 2, machines: []apiMachine{serving("a", "", 0), {name: "b", stage: 2, marked: true, age: 1}}},
			DeleteMachine, "b", "remediating: a health check marked machine b"},
		{"one remediation at a time",
			apiWorld{desired: 3, machines: []apiMachine{serving("a", "", 0), {name: "b", stage: 2, marked: true, age: 1}, {name: "c", stage: 2, deleting: true, age: 2}}},
			Wait, "", "waiting for machine c to be deleted before remediating machine b"},
		{"a hook left on a machine is released",
			apiWorld{desired: 1, machines: []apiMachine{{name: "a", stage: 2, hook: true}}}, RemoveHook, "a", "hosts no etcd member"},
		{"scale down cancels a machine that does not serve yet",
			apiWorld{desired: 1, machines: []apiMachine{serving("a", "", 0), {name: "b", stage: 1, age: 1}}}, DeleteMachine, "b", "which does not serve yet"},
		{"scale down waits for the others to serve",
			apiWorld{desired: 1, machines: []apiMachine{serving("a", "", 0), serving("b", "", 1), {name: "c", stage: 1, age: 2}}},
			DeleteMachine, "c", "cancelling machine c"},
		{"nothing changes while the external etcd cannot be used, not even remediation",
			apiWorld{desired: 2, problem: "EtcdCluster \"e\" is not available", machines: []apiMachine{serving("a", "", 0), {name: "b", stage: 2, marked: true, age: 1}}},
			Wait, "", `waiting for the external etcd before changing any machine: EtcdCluster "e" is not available`},
		{"steady",
			apiWorld{desired: 2, machines: []apiMachine{serving("a", "", 0), serving("b", "", 1)}}, Wait, "", "nothing to do: 2 serving, up-to-date machines as desired"},
		{"a serving machine whose certificates are due is renewed in place, the earliest first",
			apiWorld{desired: 2, machines: []apiMachine{{name: "a", stage: 2, certsDue: true, age: 1}, {name: "b", stage: 2, certsDue: true, age: 2}}},
			RenewCertificates, "b", "machine b: its certificates are due for renewal since 2025-12-31T23:58:00Z; renewing in place, no machine is replaced"},
		{"one at a time",
			apiWorld{desired: 2, machines: []apiMachine{{name: "a", stage: 2, certsDue: true}, {name: "b", stage: 2, renewing: true, age: 1}}},
			Wait, "", "waiting for machine b to finish renewing its certificates (started at 2025-12-31T23:59:00Z; counted as finished at 2026-01-01T00:04:00Z) before renewing the certificates of machine a"},
		{"a machine that does not serve yet is not renewed",
			apiWorld{desired: 2, machines: []apiMachine{serving("a", "", 0), {name: "b", stage: 1, certsDue: true, age: 1}}},
			Wait, "", "waiting for machine b to serve"},
		{"a scale-up comes before a renewal",
			apiWorld{desired: 3, machines: []apiMachine{{name: "a", stage: 2, certsDue: true}, serving("b", "", 1)}}, CreateMachine, "", "scaling up"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Plan(tt.w.state())
			target := d.Machine
			if d.Kind == CreateMachine {
				target = d.FailureDomain
			}
			if d.Kind != tt.kind || target != tt.target || !strings.Contains(d.Reason, tt.reason) {
				t.Fatalf("got %s %q (%s), want %s %q with %q", d.Kind, target, d.Reason, tt.kind, tt.target, tt.reason)
			}
		})
	}
}
