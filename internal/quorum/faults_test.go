package quorum

import "slices"

// fault is something the world or a user does to the cluster on its own.
type fault struct {
	name  string
	apply func(world) []world
}

// faults are the world's faults. Those marked deep only run with -deep: they
// multiply the state space without reaching states the others do not.
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
			if !m.started || m.healthy || mc == nil || mc.lost {
				return false
			}
			m.finishDisruption()
			m.healthy, m.caughtUp = true, true
			w.elect()
			return true
		})},
		{"a down member's machine is confirmed lost (its infrastructure reports it stopped, or a user says so)", eachMachine(func(mc *wMachine, w *world) bool {
			m := w.memberOn(mc.id)
			if w.recovery == RecoverManually && !w.triggered || mc.lost || m == nil || m.healthy || !m.started {
				return false // only where a recovery may come of it, and only of a machine whose member is down
			}
			mc.lost = true
			return true
		})},
		{"QCP is cut off from a member its peers still reach", eachMember(func(m *wMember, w *world) bool {
			if m.learner || !m.started || !m.healthy || m.cut || m.defragmenting || m.restarting {
				return false
			}
			m.cut, m.since = true, w.epoch
			return true
		})},
		{"leader changes without a crash", eachMember(func(m *wMember, w *world) bool {
			if m.learner || !m.started || !m.healthy || m.leader || !w.hasLeader() {
				return false
			}
			for i := range w.members {
				w.members[i].leader = false
			}
			m.leader = true
			return true
		})},
		{"learner stalls: it starts and answers but never catches up", eachMachine(func(mc *wMachine, w *world) bool {
			m := w.memberOn(mc.id)
			if mc.stalled || mc.deleting || m == nil || !m.learner || !m.started || m.caughtUp {
				return false // only a started learner still catching up can stall
			}
			mc.stalled = true
			return true
		})},
		{"learner never starts", eachMachine(func(mc *wMachine, w *world) bool {
			if mc.broken || mc.deleting || (w.memberOn(mc.id) != nil && w.memberOn(mc.id).started) {
				return false
			}
			mc.broken = true
			return true
		})},
		{"machine is slow (provisioning, learner start, catch-up or a certificate renewal)", eachMachine(func(mc *wMachine, w *world) bool {
			if mc.slow || mc.deleting {
				return false
			}
			m := w.memberOn(mc.id)
			if mc.addr && (m == nil || m.caughtUp) && (m == nil || !m.defragmenting) && !mc.renewOpen {
				return false // nothing in progress to slow down
			}
			mc.slow = true
			return true
		})},
		{"infrastructure never becomes ready", eachMachine(func(mc *wMachine, _ *world) bool {
			if mc.addr || mc.noInfra || mc.failed || mc.deleting {
				return false
			}
			mc.noInfra = true
			return true
		})},
		{"machine creation fails", eachMachine(func(mc *wMachine, _ *world) bool {
			if mc.addr || mc.failed || mc.deleting {
				return false
			}
			mc.failed = true
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
		{"health check marks a machine", eachMachine(func(mc *wMachine, _ *world) bool {
			if mc.remediate || mc.deleting {
				return false
			}
			mc.remediate = true
			return true
		})},
		// The members hold the same data, so they reach the quota together.
		{"every member raises NOSPACE", func(w world) []world {
			w = w.clone()
			raised := false
			for i := range w.members {
				if m := &w.members[i]; m.started && m.alarm == "" {
					m.alarm, m.overQuota, raised = "NOSPACE", true, true
				}
			}
			if !raised {
				return nil
			}
			return []world{w}
		}},
		{"member raises CORRUPT", eachMember(func(m *wMember, _ *world) bool {
			if !m.started || m.alarm != "" {
				return false
			}
			m.alarm = "CORRUPT"
			return true
		})},
		{"user changes desired replicas", func(w world) []world {
			var out []world
			for _, d := range []int{w.desired - 2, w.desired + 2} {
				if d >= 1 && d <= 5 {
					c := w.clone()
					c.desired = d
					out = append(out, c)
				}
			}
			return out
		}},
		{"failure domains change", func(w world) []world {
			var out []world
			for _, ds := range [][]string{{"fd-a", "fd-b"}, {"fd-a", "fd-b", "fd-c", "fd-d"}} {
				if !slices.Equal(ds, w.domains) {
					c := w.clone()
					c.domains = ds
					out = append(out, c)
				}
			}
			return out
		}},
		{"manager restarts during a defragmentation, which ends with its end unrecorded", eachMember(func(m *wMember, w *world) bool {
			if !m.defragmenting {
				return false
			}
			m.finishDisruption() // its machine's record stays open
			w.elect()
			return true
		})},
		{"manager restarts and loses its in-memory records", func(w world) []world {
			c := w.clone()
			changed := false
			for i := range c.members {
				m := &c.members[i]
				if m.since != c.epoch {
					m.since, changed = c.epoch, true // recorded anew as "now"
				}
				if mc := c.machine(machineName(m.host)); mc != nil && m.learner && !m.started && mc.memberID != 0 {
					mc.memberID, changed = 0, true // crashed between MemberAdd and recording the ID
				}
			}
			if !changed {
				return nil
			}
			return []world{c}
		}},
	}
}

// staleFaults strike only between plan and act: as faults of their own
// they reach nothing the others do not.
func staleFaults() []fault {
	return []fault{
		{"a machine appears (a create that committed after its client timed out, or a second manager's)", func(w world) []world {
			w = w.clone()
			w.nextMachine++
			w.machines = append(w.machines, wMachine{id: w.nextMachine, fd: "fd-a", born: w.epoch, upToDate: true})
			return []world{w}
		}},
	}
}

func (w world) hasLeader() bool {
	return slices.ContainsFunc(w.members, func(m wMember) bool { return m.leader })
}

// eachMember applies f to each member of a copy of the world, and returns
// the copies f changed. f returns false, and leaves the copy as it was, where
// the fault does not apply: the copy then serves the next member.
func eachMember(f func(*wMember, *world) bool) func(world) []world {
	return func(w world) []world {
		var out []world
		c, fresh := world{}, false
		for i := range w.members {
			if !fresh {
				c, fresh = w.clone(), true
			}
			if f(&c.members[i], &c) {
				out, fresh = append(out, c), false
			}
		}
		return out
	}
}

// eachMachine is eachMember for machines.
func eachMachine(f func(*wMachine, *world) bool) func(world) []world {
	return func(w world) []world {
		var out []world
		c, fresh := world{}, false
		for i := range w.machines {
			if !fresh {
				c, fresh = w.clone(), true
			}
			if f(&c.machines[i], &c) {
				out, fresh = append(out, c), false
			}
		}
		return out
	}
}

// observationFaults are wrong views of a right world: what a reconciler may
// read when etcd is unreachable, a member answers with a stale list, or a
// cache lags. QCP plans on them; the caller acts on the real world, subject
// to the decision's preconditions.
func observationFaults(s State, prev []Member) []namedState {
	out := []namedState{
		{"member list unreadable", edit(s, func(s *State) { s.MembersUnknown = true })},
		{"member list empty", edit(s, func(s *State) { s.Members = nil })},
	}
	for i := range s.Members {
		out = append(out, namedState{"member list lacks " + idString(s.Members[i].ID), edit(s, func(s *State) {
			s.Members = slices.Delete(s.Members, i, i+1)
		})})
	}
	if prev != nil {
		out = append(out, namedState{"stale member list", edit(s, func(s *State) { s.Members = slices.Clone(prev) })})
	}
	return out
}

type namedState struct {
	name string
	s    State
}
