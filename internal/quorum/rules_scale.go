package quorum

import (
	"fmt"
	"slices"
	"strings"
)

// createMachine creates one machine when fewer machines are kept than
// desired (scale up, or replacing a deleted, spent or failed machine), or
// when all are there but one is outdated (rolling update with maxSurge 1:
// the replacement comes first, the old machine goes once it is a voter).
func (p planner) createMachine() (Decision, bool) {
	keep := p.keep()
	var reason string
	var leaving *Machine
	switch {
	case len(keep) < p.Desired:
		reason = fmt.Sprintf("scaling up: %d of %d machines", len(keep), p.Desired)
	case len(keep) == p.Desired && slices.ContainsFunc(keep, p.outdated):
		victim := p.scaleDownVictim(keep)
		leaving = &victim
		reason = fmt.Sprintf("%s: replacing %s machine %s", why(victim.Remediate, "remediating", "rolling out"),
			why(victim.Remediate, "marked", "outdated"), victim.Name)
		if misplaced := p.misplaced(victim); victim.UpToDate && !victim.Remediate && misplaced != "" {
			reason = fmt.Sprintf("rebalancing: moving machine %s, as %s", victim.Name, misplaced)
		}
		if p.Strategy == RemoveFirst {
			if !victim.Remediate && !slices.ContainsFunc(keep, upToDate) {
				if d, ok := p.backupBeforeRisky("rolling out the first machine"); ok {
					return d, true
				}
			}
			return p.deleteVoterMachine(victim, reason+", deleting it first (maxSurge 0)")
		}
	default:
		return Decision{}, false
	}
	if d, ok := p.waitForMachineBudget(leaving != nil); ok {
		return d, true
	}
	// A rollout's first machine waits for a recent backup; remediation
	// never does (it is urgent, and keeps quorum by itself).
	if leaving != nil && !leaving.Remediate && !slices.ContainsFunc(keep, upToDate) {
		if d, ok := p.backupBeforeRisky("rolling out the first machine"); ok {
			return d, true
		}
	}
	// I4: one creation at a time, and only one learner (etcd's own limit).
	if prov := p.provisioning(); len(prov) > 0 {
		return waitf("waiting for machine %s to %s before creating another", prov[0].Name, p.joinVerb()), true
	}
	if l := p.learners(); len(l) > 0 {
		return waitf("waiting for learner %s to be promoted before creating another machine", p.memberName(l[0])), true
	}
	if len(p.voters()) >= p.Desired+1 {
		return waitf("waiting for a departing voter to be removed before creating a machine (%d voters, at most %d)", len(p.voters()), p.Desired+1), true
	}
	if d, ok := p.waitForHealthyVoters("creating a machine"); ok {
		return d, true
	}
	except := ""
	if leaving != nil {
		except = leaving.Name
	}
	if d, ok := p.waitForHealthyComponents("creating a machine", except); ok {
		return d, true
	}
	fd := p.nextFailureDomain(leaving)
	return Decision{Kind: CreateMachine, FailureDomain: fd, Reason: reason + " in failure domain " + quoteFD(fd)}, true
}

// waitForMachineBudget bounds the machines, deleting ones included, to
// desired + 1 while a machine is replaced surge-first (replacing an
// outdated one, or a deleting machine whose voter stays until its
// replacement has joined), and to desired otherwise (always with
// RemoveFirst). So a rollout's next replacement is created only once the
// machine the previous one replaced is gone, not merely deleting, and a
// remediated machine, whose member was removed first, is gone before its
// replacement is created, as KCP's preflight waits for deleting machines.
func (p planner) waitForMachineBudget(replacingOutdated bool) (Decision, bool) {
	limit := p.Desired
	if p.Strategy != RemoveFirst && (replacingOutdated || p.deletingVoterWaits()) {
		limit++
	}
	if len(p.machines) < limit {
		return Decision{}, false
	}
	for _, mc := range p.machines {
		if mc.Deleting {
			return waitf("waiting for machine %s to be deleted before creating another (at most %d machines, deleting ones included)", mc.Name, limit), true
		}
	}
	return waitf("waiting for a machine to go before creating another: %d machines, at most %d", len(p.machines), limit), true
}

// deletingVoterWaits reports whether a deleting machine still hosts a
// voter: with maxSurge 1 that voter stays until its replacement joins.
func (p planner) deletingVoterWaits() bool {
	for _, mc := range p.machines {
		if m, ok := p.memberOn(mc.Name); ok && mc.Deleting && !m.Learner {
			return true
		}
	}
	return false
}

// cancelSurplusMachines deletes a machine that does not vote yet when more
// machines are kept than desired (plus the one surge machine of a rollout),
// and any such machine a health check marked: joining it would only grow
// etcd to shrink it again, or join a machine known to be broken.
func (p planner) cancelSurplusMachines() (Decision, bool) {
	keep := p.keep()
	notVoting := filter(keep, func(mc Machine) bool { return p.phase(mc) != phaseVoter })
	for _, mc := range notVoting {
		if mc.Remediate {
			return Decision{Kind: DeleteMachine, Machine: mc.Name,
				Reason: "a health check marked machine " + mc.Name + " before it became a voter; deleting it instead of joining it"}, true
		}
	}
	surge := 0
	if p.Strategy != RemoveFirst && slices.ContainsFunc(keep, func(mc Machine) bool { return p.phase(mc) == phaseVoter && p.outdated(mc) }) {
		surge = 1
	}
	if len(notVoting) == 0 || len(keep) <= p.Desired+surge {
		return Decision{}, false
	}
	mc := notVoting[len(notVoting)-1] // the newest
	return Decision{Kind: DeleteMachine, Machine: mc.Name,
		Reason: fmt.Sprintf("scaling down: %d of %d machines; cancelling machine %s, which does not %s yet", len(keep), p.Desired, mc.Name,
			why(p.Topology == APIServersOnly, "serve", "vote"))}, true
}

// scaleDown deletes one voter machine when more are kept than desired. The
// victim follows the scale-down priority. Its voter is then removed by
// removeDepartingVoter, while the hook holds the machine's drain.
func (p planner) scaleDown() (Decision, bool) {
	keep := p.keep()
	if len(keep) <= p.Desired {
		return Decision{}, false
	}
	victim := p.scaleDownVictim(keep)
	// A scale-down waits for a recent backup; the deletion that ends a
	// rollout's surge (an outdated machine, once a machine is up to date)
	// is the rollout's, which waited before its first machine.
	if !victim.Remediate && (victim.UpToDate || !slices.ContainsFunc(keep, upToDate)) {
		if d, ok := p.backupBeforeRisky("scaling down"); ok {
			return d, true
		}
	}
	return p.deleteVoterMachine(victim, fmt.Sprintf("scaling down: %d of %d machines; deleting %s (%s)", len(keep), p.Desired, victim.Name, p.victimClass(victim)))
}

// deleteVoterMachine deletes a machine that hosts a voter, under its hook:
// one such machine at a time and none while another joins (I4), only with
// every voter healthy, and after leadership has moved away (I6).
func (p planner) deleteVoterMachine(victim Machine, reason string) (Decision, bool) {
	if p.Topology == APIServersOnly {
		return p.deleteServingMachine(victim, reason)
	}
	for _, mc := range p.machines {
		if other, ok := p.memberOn(mc.Name); ok && mc.Deleting {
			return waitf("waiting for member %s on deleting machine %s to be removed before deleting %s", p.memberName(other), mc.Name, victim.Name), true
		}
	}
	if prov := p.provisioning(); len(prov) > 0 {
		return waitf("waiting for machine %s to join before deleting %s", prov[0].Name, victim.Name), true
	}
	if d, ok := p.waitForHealthyVoters("deleting machine " + victim.Name); ok {
		return d, true
	}
	if d, ok := p.waitForHealthyComponents("deleting machine "+victim.Name, victim.Name); ok {
		return d, true
	}
	if m, ok := p.memberOn(victim.Name); ok && m.Voter() {
		if m.Leader && !p.opts.skipLeaderTransfer {
			return p.moveLeaderAway(m)
		}
		if !p.opts.skipQuorumChecks && !quorumAfterRemoval(p.voters(), m.ID) {
			return waitf("not deleting machine %s: the remaining healthy voters would not be a majority", victim.Name), true
		}
	}
	return Decision{Kind: DeleteMachine, Machine: victim.Name, Reason: reason}, true
}

// scaleDownPriority lists the victim classes, most preferred first.
func (p planner) scaleDownPriority() []struct {
	name string
	in   func(Machine) bool
} {
	return []struct {
		name string
		in   func(Machine) bool
	}{
		{"marked for remediation", func(mc Machine) bool { return mc.Remediate }},
		{"outdated and delete-annotated", func(mc Machine) bool { return p.specOutdated(mc) && mc.DeleteAnnotated }},
		{"delete-annotated", func(mc Machine) bool { return mc.DeleteAnnotated }},
		{"outdated with unhealthy components", func(mc Machine) bool { return p.specOutdated(mc) && !p.componentsOK(mc) }},
		{"outdated", p.specOutdated},
		// A machine in an overfull domain lands here: the fullest domain's.
		{"oldest in the fullest failure domain", func(Machine) bool { return true }},
	}
}

// scaleDownVictim picks the first non-empty priority class, then within it
// the failure domain with the most kept machines (alphabetical on ties),
// then the oldest machine there.
func (p planner) scaleDownVictim(keep []Machine) Machine {
	for _, class := range p.scaleDownPriority() {
		candidates := filter(keep, class.in)
		if len(candidates) == 0 {
			continue
		}
		count := countByDomain(keep, func(Machine) bool { return true })
		fd := candidates[0].FailureDomain
		for _, mc := range candidates {
			if count[mc.FailureDomain] > count[fd] || (count[mc.FailureDomain] == count[fd] && mc.FailureDomain < fd) {
				fd = mc.FailureDomain
			}
		}
		for _, mc := range candidates { // oldest first: p.machines is sorted by age
			if mc.FailureDomain == fd {
				return mc
			}
		}
	}
	return keep[0]
}

func (p planner) victimClass(mc Machine) string {
	for _, class := range p.scaleDownPriority() {
		if class.in(mc) {
			return class.name
		}
	}
	return ""
}

// nextFailureDomain is where the next machine goes: the domain with the
// fewest machines that will remain (every kept machine but leaving, the one
// a rollout replaces), then the alphabetically first. Alphabetical ties give
// alphabetical reuse when there are more machines than domains; leaving out
// the machine being replaced puts its replacement where it was.
func (p planner) nextFailureDomain(leaving *Machine) string {
	domains := slices.Clone(p.FailureDomains)
	if len(domains) == 0 {
		return ""
	}
	slices.Sort(domains)
	remain := countByDomain(p.keep(), func(mc Machine) bool { return leaving == nil || mc.Name != leaving.Name })
	best := domains[0]
	for _, fd := range domains[1:] {
		if remain[fd] < remain[best] {
			best = fd
		}
	}
	return best
}

func countByDomain(machines []Machine, counted func(Machine) bool) map[string]int {
	count := map[string]int{}
	for _, mc := range machines {
		if counted(mc) {
			count[mc.FailureDomain]++
		}
	}
	return count
}

// describe summarises a state in one line, for test failures and logs.
func (s State) describe() string {
	v := newView(s)
	var b strings.Builder
	fmt.Fprintf(&b, "desired=%d machines=[", s.Desired)
	for i, mc := range v.machines {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s@%s%s", mc.Name, quoteFD(mc.FailureDomain), flags(map[string]bool{
			"del": mc.Deleting, "hook": mc.HasHook, "old": !mc.UpToDate, "ann": mc.DeleteAnnotated,
			"fail": mc.CreationFailed, "noaddr": mc.PeerURL == "", "rem": mc.Remediate,
			"certsdue": v.certificatesDue(mc), "renewing": !mc.RenewStartedAt.IsZero() && v.since(mc.RenewStartedAt) < v.tun.RenewTimeout,
		}))
	}
	b.WriteString("] members=[")
	for i, m := range v.members {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s/%s%s", idString(m.ID), v.memberName(m), flags(map[string]bool{
			"learner": m.Learner, "unstarted": !m.Started(), "down": !m.Healthy, "leader": m.Leader,
		}))
	}
	b.WriteString("]")
	return b.String()
}

func flags(f map[string]bool) string {
	var on []string
	for k, v := range f {
		if v {
			on = append(on, k)
		}
	}
	if len(on) == 0 {
		return ""
	}
	slices.Sort(on)
	return "(" + strings.Join(on, ",") + ")"
}

// upToDate reports whether mc's spec is current and no health check marked
// it: a rollout has begun once one kept machine is.
func upToDate(mc Machine) bool { return mc.UpToDate && !mc.Remediate }
