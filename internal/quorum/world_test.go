package quorum

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// world is a pure model of what carrying out decisions does to machines and
// etcd, used to explore the planner. Time is coarse: it only moves when the
// planner waits, by one epoch, which is longer than every timeout. That
// keeps the state space finite while still letting timeouts fire.
type world struct {
	desired     int
	domains     []string
	machines    []wMachine
	members     []wMember
	epoch       int
	nextMachine int
	nextMember  uint64
}

type wMachine struct {
	id        int
	fd        string
	born      int // epoch of creation
	addr      bool
	upToDate  bool
	deleting  bool
	annotated bool
	hook      bool
	failed    bool
	broken    bool // etcd on it never starts
	memberID  uint64
}

type wMember struct {
	id       uint64
	host     int // machine id; the machine may be gone
	learner  bool
	started  bool
	healthy  bool
	caughtUp bool
	leader   bool
	since    int // epoch it was added (learners) or went down (unhealthy)
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const epochLen = 10 * time.Minute

func machineName(id int) string { return fmt.Sprintf("m-%02d", id) }
func peerURL(id int) string     { return fmt.Sprintf("https://10.0.0.%d:2380", id) }

func (w world) clone() world {
	w.machines = slices.Clone(w.machines)
	w.members = slices.Clone(w.members)
	return w
}

// state renders the world as the observation a driver would build.
func (w world) state() State {
	now := t0.Add(time.Duration(w.epoch)*epochLen + 2*time.Minute)
	at := func(epoch int) time.Time { return t0.Add(time.Duration(epoch) * epochLen) }
	s := State{Desired: w.desired, Topology: Stacked, FailureDomains: w.domains, Now: now}
	for _, m := range w.machines {
		mc := Machine{
			Name: machineName(m.id), FailureDomain: m.fd, UpToDate: m.upToDate,
			CreatedAt: at(m.born).Add(time.Duration(m.id) * time.Second),
			Deleting:  m.deleting, DeleteAnnotated: m.annotated, HasHook: m.hook,
			NodeReady: true, ComponentsHealthy: true, CreationFailed: m.failed, MemberID: m.memberID,
		}
		if m.addr {
			mc.PeerURL = peerURL(m.id)
		}
		s.Machines = append(s.Machines, mc)
	}
	for _, m := range w.members {
		mm := Member{ID: m.id, PeerURL: peerURL(m.host), Learner: m.learner, Healthy: m.healthy,
			Leader: m.leader, AppliedIndex: 5000, Revision: 4000}
		if m.started {
			mm.Name = machineName(m.host)
		}
		if !m.caughtUp {
			mm.AppliedIndex = 100
		}
		if m.learner {
			mm.AddedAt = at(m.since)
		}
		if !m.healthy {
			mm.UnhealthySince = at(m.since)
		}
		s.Members = append(s.Members, mm)
	}
	return s
}

func (w *world) machine(name string) *wMachine {
	for i := range w.machines {
		if machineName(w.machines[i].id) == name {
			return &w.machines[i]
		}
	}
	return nil
}

func (w *world) member(id uint64) *wMember {
	for i := range w.members {
		if w.members[i].id == id {
			return &w.members[i]
		}
	}
	return nil
}

// apply carries out d. Steps that take time (provisioning, starting,
// catching up, finishing a deletion) happen in progress, when QCP waits.
func (w world) apply(d Decision) world {
	w = w.clone()
	switch d.Kind {
	case CreateMachine:
		w.nextMachine++
		w.machines = append(w.machines, wMachine{id: w.nextMachine, fd: d.FailureDomain, born: w.epoch, upToDate: true})
	case AddLearner:
		mc := w.machine(d.Machine)
		w.nextMember++
		mc.memberID = w.nextMember
		w.members = append(w.members, wMember{id: w.nextMember, host: mc.id, learner: true, since: w.epoch})
	case Promote:
		w.member(d.MemberID).learner = false
	case MoveLeader:
		for i := range w.members {
			w.members[i].leader = w.members[i].id == d.MemberID
		}
	case RemoveMember:
		w.members = slices.DeleteFunc(w.members, func(m wMember) bool { return m.id == d.MemberID })
		w.elect()
	case AddHook:
		w.machine(d.Machine).hook = true
	case RemoveHook:
		w.machine(d.Machine).hook = false
	case DeleteMachine:
		w.machine(d.Machine).deleting = true
	case Wait, Degraded:
		w.progress()
	}
	return w
}

// progress is what the rest of the world does while QCP waits.
func (w *world) progress() {
	w.epoch++
	for i := range w.members {
		m := &w.members[i]
		mc := w.machine(machineName(m.host))
		switch {
		case mc == nil:
		case !m.started && !mc.broken && !mc.deleting:
			m.started, m.healthy = true, true
		case m.started && m.healthy && !m.caughtUp:
			m.caughtUp = true
		}
	}
	var gone []int
	w.machines = slices.DeleteFunc(w.machines, func(mc wMachine) bool {
		if mc.deleting && !mc.hook {
			gone = append(gone, mc.id)
			return true
		}
		return false
	})
	for i := range w.members {
		if slices.Contains(gone, w.members[i].host) && w.members[i].healthy {
			w.members[i].healthy, w.members[i].leader, w.members[i].since = false, false, w.epoch
		}
	}
	for i := range w.machines {
		mc := &w.machines[i]
		if !mc.failed && !mc.deleting {
			mc.addr = true
		}
	}
	if len(w.members) == 0 {
		w.bootstrap()
	}
	w.elect()
}

// bootstrap starts a new etcd cluster on the only machine, if it can.
func (w *world) bootstrap() {
	if len(w.machines) != 1 {
		return
	}
	mc := &w.machines[0]
	if mc.addr && !mc.broken && !mc.deleting && !mc.failed && mc.memberID == 0 {
		w.nextMember++
		mc.memberID = w.nextMember
		w.members = append(w.members, wMember{id: w.nextMember, host: mc.id, started: true, healthy: true, caughtUp: true, leader: true})
	}
}

// elect gives the cluster a leader when a healthy majority of voters exists:
// the healthy voter with the lowest ID, as a stand-in for raft.
func (w *world) elect() {
	voters, healthy := 0, -1
	for i, m := range w.members {
		if m.learner {
			continue
		}
		voters++
		if m.leader && m.healthy {
			return
		}
		if m.healthy && m.started && healthy < 0 {
			healthy = i
		}
	}
	up := 0
	for _, m := range w.members {
		if !m.learner && m.healthy {
			up++
		}
	}
	for i := range w.members {
		w.members[i].leader = false
	}
	if healthy >= 0 && 2*up > voters {
		w.members[healthy].leader = true
	}
}

// converged is the desired state: desired machines, all up to date, each
// hosting a healthy voter under the hook, and nothing else.
func (w world) converged() bool {
	if len(w.machines) != w.desired || len(w.members) != w.desired {
		return false
	}
	for _, mc := range w.machines {
		m := w.memberOn(mc.id)
		if mc.deleting || mc.failed || !mc.upToDate || !mc.hook || m == nil || m.learner || !m.healthy || !m.caughtUp {
			return false
		}
		if len(w.domains) > 0 && !slices.Contains(w.domains, mc.fd) {
			return false
		}
	}
	return true
}

func (w world) memberOn(machine int) *wMember {
	for i := range w.members {
		if w.members[i].host == machine {
			return &w.members[i]
		}
	}
	return nil
}

// key identifies a world up to what the planner can observe: machines and
// members renumbered by age, epochs reduced to "expired or not".
func (w world) key() string {
	var b strings.Builder
	rank := map[int]int{}
	for i, mc := range w.machines {
		rank[mc.id] = i
	}
	mrank := map[uint64]int{}
	for i, m := range w.members {
		mrank[m.id] = i
	}
	fmt.Fprintf(&b, "d%d|", w.desired)
	for _, mc := range w.machines {
		mid, ok := mrank[mc.memberID]
		if !ok && mc.memberID != 0 {
			mid = -1
		} else if mc.memberID == 0 {
			mid = -2
		}
		fmt.Fprintf(&b, "%s,%v,%t%t%t%t%t%t%t%t,%d;", mc.fd, w.epoch > mc.born, mc.addr, mc.upToDate, mc.deleting,
			mc.annotated, mc.hook, mc.failed, mc.broken, mc.memberID != 0, mid)
	}
	b.WriteString("|")
	for _, m := range w.members {
		host, ok := rank[m.host]
		if !ok {
			host = -1
		}
		fmt.Fprintf(&b, "%d,%t%t%t%t%t,%t;", host, m.learner, m.started, m.healthy, m.caughtUp, m.leader, w.epoch > m.since)
	}
	return b.String()
}
