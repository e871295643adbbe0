package quorum

import (
	"slices"
	"strings"
	"time"
)

// Defaults for zero Tunables.
const (
	DefaultLearnerStartTimeout = 5 * time.Minute
	DefaultUnhealthyTimeout    = 5 * time.Minute
	DefaultCatchUpMaxLag       = 1000
)

// view is a sorted, indexed copy of a State, so that rules can ask questions
// ("which member does this machine host?") without re-deriving the answer,
// and so that Plan is independent of the order the caller listed things in.
type view struct {
	State
	machines []Machine // oldest first, then by name
	members  []Member  // by ID
	tun      Tunables
}

func newView(s State) view {
	v := view{State: s}
	v.machines = slices.Clone(s.Machines)
	slices.SortFunc(v.machines, func(a, b Machine) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	v.members = slices.Clone(s.Members)
	slices.SortFunc(v.members, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	v.tun = s.Tunables.withDefaults()
	return v
}

func (t Tunables) withDefaults() Tunables {
	if t.LearnerStartTimeout <= 0 {
		t.LearnerStartTimeout = DefaultLearnerStartTimeout
	}
	if t.UnhealthyTimeout <= 0 {
		t.UnhealthyTimeout = DefaultUnhealthyTimeout
	}
	if t.CatchUpMaxLag == 0 {
		t.CatchUpMaxLag = DefaultCatchUpMaxLag
	}
	return t
}

// hosts reports whether member m runs on machine mc: by name once started,
// by peer URL before (an unstarted member has no name yet).
func hosts(mc Machine, m Member) bool {
	if m.Name != "" {
		return m.Name == mc.Name
	}
	return m.PeerURL != "" && m.PeerURL == mc.PeerURL
}

func (v view) member(id uint64) (Member, bool) {
	for _, m := range v.members {
		if m.ID == id {
			return m, true
		}
	}
	return Member{}, false
}

func (v view) machine(name string) (Machine, bool) {
	for _, mc := range v.machines {
		if mc.Name == name {
			return mc, true
		}
	}
	return Machine{}, false
}

// memberOn returns the member hosted by the named machine.
func (v view) memberOn(machine string) (Member, bool) {
	mc, ok := v.machine(machine)
	if !ok {
		return Member{}, false
	}
	for _, m := range v.members {
		if hosts(mc, m) {
			return m, true
		}
	}
	return Member{}, false
}

// machineOf returns the machine hosting m.
func (v view) machineOf(m Member) (Machine, bool) {
	for _, mc := range v.machines {
		if hosts(mc, m) {
			return mc, true
		}
	}
	return Machine{}, false
}

func (v view) voters() []Member {
	return filter(v.members, Member.Voter)
}

func (v view) learners() []Member {
	return filter(v.members, func(m Member) bool { return m.Learner })
}

func (v view) leader() (Member, bool) {
	for _, m := range v.members {
		if m.Leader && m.Voter() && m.Healthy {
			return m, true
		}
	}
	return Member{}, false
}

// memberName names a member for humans: its name, or its hosting machine,
// or its ID.
func (v view) memberName(m Member) string {
	if m.Name != "" {
		return m.Name
	}
	if mc, ok := v.machineOf(m); ok {
		return mc.Name
	}
	return idString(m.ID)
}

// componentsOK is the component half of the preflight checks.
func (v view) componentsOK(mc Machine) bool {
	return mc.ComponentsHealthy && (v.Topology == External || mc.NodeReady)
}

func filter[T any](xs []T, keep func(T) bool) []T {
	var out []T
	for _, x := range xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

func names[T any](xs []T, name func(T) string) string {
	var out []string
	for _, x := range xs {
		out = append(out, name(x))
	}
	return strings.Join(out, ", ")
}
