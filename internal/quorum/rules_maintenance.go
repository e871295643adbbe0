package quorum

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// defragment is etcd maintenance, the last rule before the steady Wait: it
// runs only when no other rule found anything to do, so membership work
// always comes first and never runs beside it. It defragments one member
// whose database is fragmented past the threshold, followers first; a
// fragmented leader first hands its leadership to another member.
//
// A member defragmenting blocks its reads and writes, so it is a disruption
// of the one-at-a-time class (see disrupted): it is started only while the
// cluster can lose a member (at least three voters, every one healthy, no
// learner) and while no other member is disrupted.
func (p planner) defragment() (Decision, bool) {
	if p.tun.DefragDisabled {
		return Decision{}, false
	}
	due := filter(p.voters(), p.dueForDefrag)
	if len(due) == 0 {
		return Decision{}, false
	}
	slices.SortStableFunc(due, func(a, b Member) int {
		return cmp.Or(cmp.Compare(boolInt(a.Leader), boolInt(b.Leader)), -cmp.Compare(fragmentation(a), fragmentation(b)))
	})
	m := due[0]
	if d, ok := p.waitToDisrupt("defragmenting member " + p.memberName(m)); ok && !p.opts.defragFirst {
		return d, true
	}
	if m.Leader && !p.opts.defragLeader {
		d, _ := p.moveLeaderAway(m)
		if d.Kind == MoveLeader {
			d.Reason = fmt.Sprintf("moving etcd leadership from %s to %s before defragmenting %s, the last member due", p.memberName(m), d.Machine, p.memberName(m))
		}
		return d, true
	}
	mc, _ := p.machineOf(m)
	return Decision{Kind: Defragment, MemberID: m.ID, Machine: mc.Name,
		Reason: fmt.Sprintf("defragmenting member %s: %d%% of its %d MiB database is free pages (threshold %d%%)",
			p.memberName(m), fragmentation(m), m.DBSize>>20, p.tun.DefragThresholdPercent)}, true
}

// dueForDefrag reports whether voter m's database is worth defragmenting:
// fragmented past the threshold, above the size floor, on a machine that
// stays, and not defragmented within the minimum interval.
func (p planner) dueForDefrag(m Member) bool {
	mc, ok := p.machineOf(m)
	if !ok || p.phase(mc) != phaseVoter || !m.Healthy || !m.Started() || m.DBSize < p.tun.DefragMinDBSize || m.DBSizeInUse <= 0 {
		return false
	}
	if fragmentation(m) < p.tun.DefragThresholdPercent {
		return false
	}
	last := lastDefrag(mc)
	return last.IsZero() || p.Now.Sub(last) >= p.tun.DefragMinInterval
}

// waitToDisrupt is the preflight of a disruption (what): the cluster must
// be able to lose the member disrupted, so at least three voters, all
// healthy, no learner joining, and no other member disrupted.
func (p planner) waitToDisrupt(what string) (Decision, bool) {
	if d, ok := p.waitForDisrupted(what); ok {
		return d, true
	}
	if l := p.learners(); len(l) > 0 {
		return waitf("waiting for learner %s to be promoted or removed before %s", p.memberName(l[0]), what), true
	}
	if d, ok := p.waitForVoters(what, false); ok {
		return d, true
	}
	if n := len(p.voters()); tolerance(n) < 1 {
		return waitf("not %s: with %d voter%s etcd cannot lose one while it defragments", what, n, why(n == 1, "", "s")), true
	}
	return Decision{}, false
}

// waitForDisrupted waits while a member is disrupted, naming it.
func (p planner) waitForDisrupted(what string) (Decision, bool) {
	if m, ok := p.disrupted(); ok {
		mc, _ := p.machineOf(m)
		return waitf("waiting for member %s to finish defragmenting (started %s ago; counted as unhealthy after %s) before %s",
			p.memberName(m), roundDuration(p.since(mc.DefragStartedAt)), p.tun.DefragTimeout, what), true
	}
	return Decision{}, false
}

// disrupted returns a member whose defragmentation is in flight.
func (v view) disrupted() (Member, bool) {
	for _, m := range v.members {
		if v.defragmenting(m) {
			return m, true
		}
	}
	return Member{}, false
}

// defragmenting reports whether m is busy defragmenting: its machine holds
// an open defragmentation record, started less than DefragTimeout ago, and
// m does not answer. A member that answers again has finished, even if a
// manager restart left the record open.
func (v view) defragmenting(m Member) bool {
	mc, ok := v.machineOf(m)
	return ok && !m.Healthy && !mc.DefragStartedAt.IsZero() && v.since(mc.DefragStartedAt) < v.tun.DefragTimeout
}

// lastDefrag is when mc's member was last defragmented: the later of the
// recorded end and an open record's start (a defragmentation whose end a
// restart kept from being recorded has still happened).
func lastDefrag(mc Machine) time.Time {
	if mc.DefragStartedAt.After(mc.DefragmentedAt) {
		return mc.DefragStartedAt
	}
	return mc.DefragmentedAt
}

// fragmentation is the share of m's database, in percent, that is free
// pages; 0 when unknown.
func fragmentation(m Member) int {
	if m.DBSize <= 0 || m.DBSizeInUse <= 0 || m.DBSizeInUse >= m.DBSize {
		return 0
	}
	return int((m.DBSize - m.DBSizeInUse) * 100 / m.DBSize)
}
