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
	m := followersFirst(due)
	if d, ok := p.waitToDisrupt("defragmenting member "+p.memberName(m), 1); ok && !p.opts.defragFirst {
		return d, true
	}
	return p.defragmentMember(m, fmt.Sprintf("%d%% of its %d MiB database is free pages (threshold %d%%)",
		fragmentation(m), m.DBSize>>20, p.tun.DefragThresholdPercent))
}

// followersFirst returns the member of due to defragment first: a
// follower before the leader, the most fragmented first.
func followersFirst(due []Member) Member {
	slices.SortStableFunc(due, func(a, b Member) int {
		return cmp.Or(cmp.Compare(boolInt(a.Leader), boolInt(b.Leader)), -cmp.Compare(fragmentation(a), fragmentation(b)))
	})
	return due[0]
}

// defragmentMember defragments m, or first moves leadership off it.
func (p planner) defragmentMember(m Member, why string) (Decision, bool) {
	if m.Leader && len(p.voters()) > 1 && !p.opts.defragLeader {
		d, _ := p.moveLeaderAway(m)
		if d.Kind == MoveLeader {
			d.Reason = fmt.Sprintf("moving etcd leadership from %s to %s before defragmenting %s, the last member due", p.memberName(m), d.Machine, p.memberName(m))
		}
		return d, true
	}
	mc, _ := p.machineOf(m)
	return Decision{Kind: Defragment, MemberID: m.ID, Machine: mc.Name,
		Reason: fmt.Sprintf("defragmenting member %s: %s", p.memberName(m), why)}, true
}

// recoverFromNoSpace brings a cluster whose only alarms are NOSPACE back
// to writable: compact the history (once per recovery), defragment every
// member once after the compaction, one at a time, then disarm the
// alarms once every member's database is below its quota. If one is
// still over it after all that, the live data does not fit: it says so,
// naming the setting to raise, and takes no second pass. what names the
// alarm, for messages.
func (p planner) recoverFromNoSpace(what string) (Decision, bool) {
	leader, ok := p.leader()
	switch {
	case !ok:
		return waitf("%s; waiting for etcd to elect a leader before recovering from it", what), true
	case leader.Revision <= 0:
		return waitf("%s; waiting to read the leader's revision before recovering from it", what), true
	}
	if target := leader.Revision - p.tun.CompactionRetention; target > p.CompactedRevision || (p.opts.compactAgain && target > 0) {
		return Decision{Kind: Compact, Revision: target,
			Reason: fmt.Sprintf("%s: compacting etcd's history to revision %d (the current %d, less a retention of %d revisions), so that defragmentation can give the space back",
				what, target, leader.Revision, p.tun.CompactionRetention)}, true
	}
	due := filter(p.voters(), func(m Member) bool {
		mc, ok := p.machineOf(m)
		return ok && m.Started() && lastDefrag(mc).Before(p.CompactedAt)
	})
	if len(due) > 0 {
		if l := p.learners(); len(l) > 0 {
			// A join cannot finish under the alarm (no promotion), and
			// defragmentation waits for no learner: the join goes, and
			// its machine is replaced once etcd takes writes again.
			return p.removeMember(l[0], fmt.Sprintf("%s: removing learner %s, whose join cannot finish under the alarm, before defragmenting; its machine is replaced after the recovery",
				what, p.memberName(l[0]))), true
		}
		m := followersFirst(due)
		// The cluster refuses writes already: one or two voters may
		// recover too, every one of them healthy.
		if d, ok := p.waitToDisrupt("defragmenting member "+p.memberName(m)+" to recover from NOSPACE", 0); ok {
			return d, true
		}
		return p.defragmentMember(m, fmt.Sprintf("%s; its %d MiB database holds %d MiB of data after the compaction to revision %d",
			what, m.DBSize>>20, m.DBSizeInUse>>20, p.CompactedRevision))
	}
	if over := p.overQuota(); len(over) > 0 {
		m := over[0]
		if m.DBSize <= 0 || p.quotaOf(m) <= 0 {
			return waitf("%s; waiting to read the database size and quota of member %s before disarming it", what, p.memberName(m)), true
		}
		return degradedf("%s, and member %s's database is %d MiB after compaction and defragmentation, not below its quota of %d MiB: the data itself does not fit; raise etcd's quota (quota-backend-bytes in extraArgs), or delete data",
			what, p.memberName(m), m.DBSize>>20, p.quotaOf(m)>>20), true
	}
	for _, m := range p.members {
		if slices.Contains(m.Alarms, "NOSPACE") {
			return Decision{Kind: DisarmAlarm, MemberID: m.ID, Alarm: "NOSPACE", Machine: p.memberName(m),
				Reason: fmt.Sprintf("disarming NOSPACE raised by member %s: after compaction and defragmentation every member's database is below its quota", p.memberName(m))}, true
		}
	}
	return Decision{}, false // departed alarms only: disarmDepartedNoSpace decides
}

// noSpaceOnly reports whether NOSPACE is the only alarm raised, by listed
// members or departed ones.
func (p planner) noSpaceOnly() bool {
	for _, m := range p.members {
		for _, a := range m.Alarms {
			if a != "NOSPACE" {
				return false
			}
		}
	}
	for _, a := range p.DepartedAlarms {
		if a.Type != "NOSPACE" {
			return false
		}
	}
	return true
}

// overQuota returns the members whose database is not known to be below
// their quota.
func (p planner) overQuota() []Member {
	return filter(p.members, func(m Member) bool { return m.DBSize <= 0 || p.quotaOf(m) <= 0 || m.DBSize >= p.quotaOf(m) })
}

// quotaOf is the backend quota member m runs with: the one it reports
// (etcd 3.6), else the configured one.
func (p planner) quotaOf(m Member) int64 {
	if m.DBSizeQuota > 0 {
		return m.DBSizeQuota
	}
	return p.QuotaBackendBytes
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

// waitToDisrupt is the preflight of a disruption (what): every voter
// healthy, no learner joining, no other member disrupted, and etcd
// tolerating at least minTolerance failures (1: it can lose the member
// disrupted).
func (p planner) waitToDisrupt(what string, minTolerance int) (Decision, bool) {
	if d, ok := p.waitForDisrupted(what); ok {
		return d, true
	}
	if l := p.learners(); len(l) > 0 {
		return waitf("waiting for learner %s to be promoted or removed before %s", p.memberName(l[0]), what), true
	}
	if d, ok := p.waitForVoters(what, false); ok {
		return d, true
	}
	if n := len(p.voters()); tolerance(n) < minTolerance {
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
