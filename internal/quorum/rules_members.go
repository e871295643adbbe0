package quorum

import "fmt"

// removeStrayLearners removes learners that will never become voters: those
// whose machine is gone or deleting, and those that did not start (or stay
// reachable) within LearnerStartTimeout. Removing a learner never affects
// quorum, so it needs no further check. The stuck learner's machine is then
// "spent" and deleteUnusableMachines replaces it.
func (p planner) removeStrayLearners() (Decision, bool) {
	for _, m := range p.learners() {
		mc, ok := p.machineOf(m)
		switch {
		case !ok:
			return p.removeMember(m, "learner "+p.memberName(m)+" has no machine"), true
		case mc.Deleting:
			return p.removeMember(m, "learner "+p.memberName(m)+" is on deleting machine "+mc.Name), true
		case (!m.Started() || !m.Healthy) && p.learnerAge(m) >= p.tun.LearnerStartTimeout:
			return p.removeMember(m, fmt.Sprintf("learner %s has not started or is unreachable %s after it was added (timeout %s); removing it so machine %s can be replaced",
				p.memberName(m), roundDuration(p.learnerAge(m)), p.tun.LearnerStartTimeout, mc.Name)), true
		case p.stalled(m):
			leader, _ := p.leader()
			return p.removeMember(m, fmt.Sprintf("learner %s has not got closer to the leader for %s (applied index %d of %d, timeout %s); removing it so machine %s can be replaced",
				p.memberName(m), roundDuration(p.since(m.CatchUpProgressAt)), m.AppliedIndex, leader.AppliedIndex, p.tun.LearnerStallTimeout, mc.Name)), true
		}
	}
	return Decision{}, false
}

// stalled reports whether learner m answers but has trailed the leader by
// more than CatchUpMaxLag without getting closer for LearnerStallTimeout.
// It holds etcd's only learner slot, so every rollout, scale-up and
// replacement would wait behind it forever. One catching up steadily keeps
// moving CatchUpProgressAt, and is never stalled.
func (p planner) stalled(m Member) bool {
	leader, ok := p.leader()
	if p.opts.keepStalledLearners || !ok || !m.Started() || !m.Healthy || leader.AppliedIndex <= m.AppliedIndex+p.tun.CatchUpMaxLag {
		return false
	}
	return p.since(m.CatchUpProgressAt) >= p.tun.LearnerStallTimeout
}

// deleteUnusableMachines deletes machines that can never host a member:
// failed creations and spent machines. They host no voter, so deleting them
// is not a quorum decision.
func (p planner) deleteUnusableMachines() (Decision, bool) {
	for _, mc := range p.machines {
		switch p.phase(mc) {
		case phaseFailed:
			return Decision{Kind: DeleteMachine, Machine: mc.Name,
				Reason: "machine " + mc.Name + " failed to be created; deleting it so it can be created again"}, true
		case phaseSpent:
			return Decision{Kind: DeleteMachine, Machine: mc.Name,
				Reason: "machine " + mc.Name + "'s etcd member was removed; deleting it so it can be replaced"}, true
		}
	}
	return Decision{}, false
}

// removeDepartingVoter removes the voter of a machine that is being deleted
// (by QCP or a user) or is gone. A healthy one stays until its replacement
// is a voter (maxSurge 1), except with RemoveFirst (maxSurge 0), where the
// replacement comes after when removing it first is safe; an unhealthy one
// goes first (etcd FAQ). Unhealthy
// ones are tried first and the leader last: while another departing voter
// can go, leadership need not move to a machine that is leaving too.
func (p planner) removeDepartingVoter() (Decision, bool) {
	voters := p.voters()
	candidates := make([]Member, 0, len(voters))
	for _, class := range []func(Member) bool{
		func(m Member) bool { return !m.Healthy },
		func(m Member) bool { return m.Healthy && !m.Leader },
		func(m Member) bool { return m.Healthy && m.Leader },
	} {
		for _, m := range voters {
			if class(m) {
				candidates = append(candidates, m)
			}
		}
	}
	var blocked []Member
	for _, m := range candidates {
		if !p.departing(m) {
			continue
		}
		if m.Healthy && len(voters) <= p.Desired && (p.Strategy != RemoveFirst || !p.removalSafe(m) || !p.keepsFloor(m)) {
			continue // wait for the replacement to be promoted
		}
		if !p.removalSafe(m) {
			blocked = append(blocked, m) // another voter is down: let remediation go first
			continue
		}
		if d, blocked := p.membershipBusy(); blocked {
			return d, true
		}
		return p.removeVoter(m, fmt.Sprintf("member %s is on a departing machine and %s", p.memberName(m),
			why(m.Healthy, "its replacement has joined", "is unhealthy: removing it first")))
	}
	if len(blocked) == 0 {
		return Decision{}, false
	}
	if d, ok := p.remediateUnhealthyVoter(); ok {
		return d, true
	}
	return waitf("not removing member %s: %s", p.memberName(blocked[0]), p.unsafeRemoval(blocked[0])), true
}

// remediateUnhealthyVoter removes a voter, on a machine meant to stay, that
// has been unhealthy past UnhealthyTimeout or whose machine a health check
// marked. Removing the member first and only then replacing the machine
// keeps quorum steady (the etcd FAQ); the spent machine is deleted next.
func (p planner) remediateUnhealthyVoter() (Decision, bool) {
	for _, m := range p.voters() {
		if p.departing(m) || !p.dueForRemediation(m) {
			continue
		}
		if d, blocked := p.membershipBusy(); blocked {
			return d, true
		}
		return p.removeVoter(m, fmt.Sprintf("member %s has been unhealthy for %s%s; removing it first, then replacing its machine",
			p.memberName(m), roundDuration(p.unhealthyFor(m)), p.markedSuffix(m)))
	}
	return Decision{}, false
}

func (p planner) markedSuffix(m Member) string {
	if mc, ok := p.machineOf(m); ok && mc.Remediate {
		return " and a health check marked its machine"
	}
	return ""
}

// removalSafe reports whether voter m may be removed now: the remaining
// healthy voters are a majority (I1), and fault tolerance does not drop
// (keepsTolerance).
func (p planner) removalSafe(m Member) bool {
	if p.opts.skipQuorumChecks {
		return true
	}
	voters := p.atRiskVoters()
	return quorumAfterRemoval(voters, m.ID) && (p.opts.removeHealthyWithOtherDown || keepsTolerance(voters, m.ID))
}

// membershipBusy is I4 for voter removals: an unstarted learner is a
// membership change still in flight, so wait for it to start or time out,
// and a member defragmenting or restarting is a disruption in flight, so
// wait for it to finish.
func (p planner) membershipBusy() (Decision, bool) {
	if d, ok := p.waitForDisrupted("removing a voter"); ok {
		return d, true
	}
	for _, l := range p.learners() {
		if !l.Started() {
			return waitf("waiting for learner %s to start before removing a voter", p.memberName(l)), true
		}
	}
	return Decision{}, false
}

// removeVoter removes voter m if that is quorum-safe (I1) and leadership
// has moved away from it (I6).
func (p planner) removeVoter(m Member, reason string) (Decision, bool) {
	if m.Leader && m.Healthy && !p.opts.skipLeaderTransfer {
		return p.moveLeaderAway(m)
	}
	if m.Leader && !m.Healthy {
		return waitf("waiting for etcd to elect a new leader before removing unhealthy leader %s", p.memberName(m)), true
	}
	if !p.removalSafe(m) {
		return waitf("not removing member %s: %s", p.memberName(m), p.unsafeRemoval(m)), true
	}
	return p.removeMember(m, reason), true
}

// unsafeRemoval says why removing voter m now is not safe.
func (p planner) unsafeRemoval(m Member) string {
	if !quorumAfterRemoval(p.atRiskVoters(), m.ID) {
		return "the remaining healthy voters would not be a majority"
	}
	down := filter(p.atRiskVoters(), func(o Member) bool { return !o.Healthy })
	return fmt.Sprintf("member %s is unhealthy, and without healthy %s etcd could not survive another failure; waiting for %s to recover or be replaced",
		names(down, p.memberName), p.memberName(m), names(down, p.memberName))
}

func (p planner) removeMember(m Member, reason string) Decision {
	d := Decision{Kind: RemoveMember, MemberID: m.ID, Reason: reason}
	if mc, ok := p.machineOf(m); ok {
		d.Machine = mc.Name
	}
	return d
}

// moveLeaderAway hands leadership from leader to the best healthy voter on
// a machine that stays, preferring up-to-date machines so it need not move
// again, then the most caught-up member.
func (p planner) moveLeaderAway(leader Member) (Decision, bool) {
	best, ok := p.leaderTarget(leader.ID)
	if !ok {
		return waitf("waiting for a healthy voter to take over leadership from %s", p.memberName(leader)), true
	}
	mc, _ := p.machineOf(best)
	return Decision{Kind: MoveLeader, MemberID: best.ID, Machine: mc.Name,
		Reason: fmt.Sprintf("moving etcd leadership from %s to %s before %s leaves", p.memberName(leader), p.memberName(best), p.memberName(leader))}, true
}

// leaderTarget picks a healthy voter, other than except, on a kept machine;
// failing that, on a machine that is leaving too (when every machine is
// leaving, leadership still must not go down with the member removed first).
func (p view) leaderTarget(except uint64) (Member, bool) {
	var best Member
	var bestMC Machine
	found := false
	for _, kept := range []bool{true, false} {
		for _, m := range p.voters() {
			mc, ok := p.machineOf(m)
			if m.ID == except || !m.Healthy || !m.Started() || !ok || (kept && p.phase(mc) != phaseVoter) {
				continue
			}
			if !found || betterTarget(p.outdated(mc), m, p.outdated(bestMC), best) {
				best, bestMC, found = m, mc, true
			}
		}
		if found {
			break
		}
	}
	return best, found
}

func betterTarget(aOutdated bool, a Member, bOutdated bool, b Member) bool {
	if aOutdated != bOutdated {
		return !aOutdated
	}
	return a.AppliedIndex > b.AppliedIndex
}

// finishJoining drives the one machine being created until it hosts a
// voter: wait for infrastructure, add the learner, wait for it to start and
// catch up, add the hook, promote. When the voter bound (I2) blocks the next
// step, it steps aside so scaleDown can make room or cancel the machine.
func (p planner) finishJoining() (Decision, bool) {
	for _, mc := range p.machines {
		switch p.phase(mc) {
		case phasePending:
			return waitf("waiting for machine %s to be provisioned (no address yet)", mc.Name), true
		case phaseUnjoined:
			return p.addLearner(mc)
		case phaseJoining:
			m, _ := p.memberOn(mc.Name)
			return waitf("waiting for learner %s to start (added at %s; replaced %s)",
				mc.Name, stamp(m.AddedAt), due(m.AddedAt, p.tun.LearnerStartTimeout)), true
		case phaseLearner:
			m, _ := p.memberOn(mc.Name)
			return p.promote(mc, m)
		}
	}
	return Decision{}, false
}

func (p planner) addLearner(mc Machine) (Decision, bool) {
	if len(p.learners()) > 0 {
		return waitf("waiting for learner %s before adding machine %s", p.memberName(p.learners()[0]), mc.Name), true
	}
	if len(p.voters()) >= p.Desired+1 {
		return Decision{}, false
	}
	if d, ok := p.waitForHealthyVoters("adding machine " + mc.Name + " as a learner"); ok {
		return d, true
	}
	return Decision{Kind: AddLearner, Machine: mc.Name, PeerURL: mc.PeerURL,
		Reason: "adding machine " + mc.Name + " to etcd as a learner"}, true
}

func (p planner) promote(mc Machine, m Member) (Decision, bool) {
	leader, ok := p.leader()
	switch {
	case !m.Healthy:
		return waitf("waiting for learner %s to become reachable", mc.Name), true
	case !ok:
		return waitf("waiting for etcd to elect a leader before promoting learner %s", mc.Name), true
	case leader.AppliedIndex > m.AppliedIndex+p.tun.CatchUpMaxLag:
		return waitf("waiting for learner %s to catch up: applied index %d of %d", mc.Name, m.AppliedIndex, leader.AppliedIndex), true
	case !mc.HasHook:
		return Decision{Kind: AddHook, Machine: mc.Name,
			Reason: "protecting machine " + mc.Name + " with the pre-drain hook before its learner is promoted"}, true
	case len(p.voters()) >= p.Desired+1:
		return Decision{}, false
	}
	if d, ok := p.waitForDisrupted("promoting learner " + mc.Name); ok {
		return d, true
	}
	voters := p.voterCount()
	healthy := countOf(p.members, func(v Member) bool { return v.Voter() && v.Healthy })
	if 2*(healthy+1) <= voters+1 {
		return waitf("waiting for voters to recover before promoting learner %s: %d of %d healthy", mc.Name, healthy, voters), true
	}
	return Decision{Kind: Promote, MemberID: m.ID, Machine: mc.Name,
		Reason: fmt.Sprintf("promoting learner %s: applied index %d of leader's %d", mc.Name, m.AppliedIndex, leader.AppliedIndex)}, true
}

// waitForHealthyVoters is the preflight for growing the cluster: never add
// to a cluster with an unhealthy voter (it raises the quorum without adding
// tolerance). An unhealthy voter is remediated once it is due. A voter
// whose machine waits its turn for remediation does not count while
// growing: the machine being added is the replacement the remediation
// ahead of it waits for.
func (p planner) waitForHealthyVoters(what string) (Decision, bool) {
	return p.waitForVoters(what, true)
}

func (p planner) waitForVoters(what string, skipQueued bool) (Decision, bool) {
	for _, m := range p.voters() {
		if mc, ok := p.machineOf(m); skipQueued && ok && mc.RemediationQueued {
			continue
		}
		if p.disrupting(m) != "" {
			return p.waitForDisrupted(what)
		}
		if p.cutOffFromQCP(m) {
			return waitf("waiting for member %s to answer QCP (unanswered since %s; its machine says it answers there, so it is not replaced) before %s",
				p.memberName(m), stamp(m.UnhealthySince), what), true
		}
		if !m.Healthy {
			return waitf("waiting for member %s to become healthy (unhealthy since %s; replaced %s) before %s",
				p.memberName(m), stamp(m.UnhealthySince), due(m.UnhealthySince, p.tun.UnhealthyTimeout), what), true
		}
	}
	return Decision{}, false
}

// waitForHealthyComponents is the component half of the preflight checks
// before a machine is created or a voter's machine deleted: the API server,
// controller manager, scheduler and etcd must be healthy on every machine
// that hosts a voter, except the one the step replaces or removes, and
// machines a health check marked, remediated now or waiting their turn
// (remediation must be able to fix them).
// Without it QCP would grow or shrink a control plane whose components it
// has not seen work, as when no API server has answered yet.
func (p planner) waitForHealthyComponents(what string, except string) (Decision, bool) {
	for _, mc := range p.machines {
		if mc.Name == except || mc.Remediate || mc.RemediationQueued || mc.Deleting {
			continue
		}
		if m, ok := p.memberOn(mc.Name); ok && m.Voter() && !p.componentsOK(mc) {
			return waitf("waiting for the control plane components on machine %s to be healthy before %s (preflight)", mc.Name, what), true
		}
	}
	return Decision{}, false
}

// waitForUnhealthyVoters is the last rule: with nothing else to do, a
// voter that is down but not yet due for remediation is still something
// the control plane waits for, never "nothing to do".
func (p planner) waitForUnhealthyVoters() (Decision, bool) {
	return p.waitForVoters("the control plane is steady", false)
}

func why(cond bool, yes, no string) string {
	if cond {
		return yes
	}
	return no
}
