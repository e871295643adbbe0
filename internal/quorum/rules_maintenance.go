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

// takeSnapshot takes a scheduled backup once nothing but maintenance is
// left to do. It reads from a healthy follower, so that the leader, which
// serves every write, is spared the stream; a one-member cluster's only
// member serves it. A snapshot disrupts nothing, but it waits for a
// defragmentation or restart in flight: that member's database is busy,
// and its answers would be late.
func (p planner) takeSnapshot() (Decision, bool) {
	if !p.Backup.Due {
		return Decision{}, false
	}
	if d, ok := p.waitForDisrupted("taking a scheduled backup"); ok {
		return d, true
	}
	m, ok := p.snapshotSource()
	if l, isLeader := p.leader(); isLeader && p.opts.snapshotFromLeader {
		m, ok = l, true
	}
	if !ok {
		return waitf("a scheduled backup is due; waiting for a healthy follower to take it from (the leader is spared the stream while a follower can serve it)"), true
	}
	mc, _ := p.machineOf(m)
	role := "a follower"
	if m.Leader {
		role = "the only member"
	}
	return Decision{Kind: Snapshot, MemberID: m.ID, Machine: mc.Name,
		Reason: fmt.Sprintf("taking a scheduled backup from member %s (%s)", p.memberName(m), role)}, true
}

// backupBeforeRisky holds a risky step (what) until a verified snapshot
// younger than Backup.MaxAgeBeforeRisky exists, and takes one if none
// does. It returns false, letting the step go, when backups are not
// configured or the snapshot is recent enough.
func (p planner) backupBeforeRisky(what string) (Decision, bool) {
	b := p.Backup
	if !b.Configured || (!b.LastVerified.IsZero() && p.since(b.LastVerified) < b.MaxAgeBeforeRisky) {
		return Decision{}, false
	}
	age := "there is none"
	if !b.LastVerified.IsZero() {
		age = fmt.Sprintf("the newest was verified at %s, more than maxAgeBeforeRiskyChangeSeconds (%s) ago", stamp(b.LastVerified), b.MaxAgeBeforeRisky)
	}
	switch {
	case b.Problem != "":
		return waitf("waiting for a backup before %s (%s), and none can be taken: %s", what, age, b.Problem), true
	case p.Now.Before(b.RetryAt):
		return waitf("waiting for a backup before %s (%s); the last attempt failed, the next is at %s", what, age, stamp(b.RetryAt)), true
	}
	if d, ok := p.waitForDisrupted("taking a backup before " + what); ok {
		return d, true
	}
	m, ok := p.snapshotSource()
	if !ok {
		return waitf("waiting for a healthy follower to take a backup from before %s (%s)", what, age), true
	}
	mc, _ := p.machineOf(m)
	return Decision{Kind: Snapshot, MemberID: m.ID, Machine: mc.Name,
		Reason: fmt.Sprintf("taking a backup from member %s before %s: %s", p.memberName(m), what, age)}, true
}

// snapshotSource is the member a snapshot is taken from: a healthy,
// started follower on a machine (the first by name), or the only voter.
func (v view) snapshotSource() (Member, bool) {
	voters := v.voters()
	sources := filter(voters, func(m Member) bool {
		mc, ok := v.machineOf(m)
		return ok && !mc.Deleting && m.Healthy && m.Started() && (!m.Leader || len(voters) == 1)
	})
	if len(sources) == 0 {
		return Member{}, false
	}
	return slices.MinFunc(sources, func(a, b Member) int { return cmp.Compare(v.memberName(a), v.memberName(b)) }), true
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
	return p.disruptMember(m, Decision{Kind: Defragment}, "defragmenting", why)
}

// disruptMember takes step d (a Defragment or RestartMember, verb naming
// it) on m, or first moves leadership off m: a leader that stops
// answering costs the cluster an election, and every write waits for it.
func (p planner) disruptMember(m Member, d Decision, verb, why string) (Decision, bool) {
	if m.Leader && len(p.voters()) > 1 && !p.opts.defragLeader {
		mv, _ := p.moveLeaderAway(m)
		if mv.Kind == MoveLeader {
			mv.Reason = fmt.Sprintf("moving etcd leadership from %s to %s before %s %s, the last member due", p.memberName(m), mv.Machine, verb, p.memberName(m))
		}
		return mv, true
	}
	mc, _ := p.machineOf(m)
	d.MemberID, d.Machine = m.ID, mc.Name
	d.Reason = fmt.Sprintf("%s member %s: %s", verb, p.memberName(m), why)
	return d, true
}

// restartForQuota restarts in place, one at a time, each voter known to
// run with another backend quota than the configured one: a quota change
// replaces no machine, so it also works while NOSPACE blocks growth (the
// recovery calls restartMember itself, before its defragmentations). The
// preflight is a disruption's: it waits while any voter is unhealthy, and
// the cluster must be able to lose the member, unless its desired size
// (one or two) never could.
func (p planner) restartForQuota() (Decision, bool) {
	due := p.dueForRestart()
	if len(due) == 0 {
		return Decision{}, false
	}
	return p.restartMember(followersFirst(due), min(1, tolerance(p.Desired)))
}

// restartMember restarts voter m with the configured quota once the
// preflight of a disruption tolerating minTolerance failures passes.
func (p planner) restartMember(m Member, minTolerance int) (Decision, bool) {
	running, _ := p.runningQuota(m)
	what := fmt.Sprintf("restarting member %s with the backend quota of %d MiB", p.memberName(m), p.QuotaBackendBytes>>20)
	if d, ok := p.waitToDisrupt(what, minTolerance); ok && !p.opts.restartUnchecked {
		return d, true
	}
	return p.disruptMember(m, Decision{Kind: RestartMember, QuotaBackendBytes: p.QuotaBackendBytes}, "restarting",
		fmt.Sprintf("it runs with a backend quota of %d MiB, and %d MiB is configured; the machine stays", running>>20, p.QuotaBackendBytes>>20))
}

// dueForRestart are the started voters known to run with a backend quota
// other than the configured one. A member whose quota is unknown (etcd
// 3.5, on a machine without a record) is left alone.
func (p planner) dueForRestart() []Member {
	if p.QuotaBackendBytes <= 0 {
		return nil
	}
	return filter(p.voters(), func(m Member) bool {
		q, known := p.runningQuota(m)
		mc, ok := p.machineOf(m)
		return ok && !mc.Deleting && m.Started() && known && q != p.QuotaBackendBytes
	})
}

// runningQuota is the backend quota m runs with, if known: the one it
// reports (etcd 3.6), else the one its machine was last given.
func (v view) runningQuota(m Member) (int64, bool) {
	if m.DBSizeQuota > 0 {
		return m.DBSizeQuota, true
	}
	if mc, ok := v.machineOf(m); ok && mc.QuotaBackendBytes > 0 {
		return mc.QuotaBackendBytes, true
	}
	return 0, false
}

// recoverFromNoSpace brings a cluster whose only alarms are NOSPACE back
// to writable: compact the history (once per recovery), restart members
// whose quota differs from the configured one, defragment every member
// once after the compaction (and at most once per DefragMinInterval), one
// at a time, then disarm the
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
	// Once per recovery: again only once the history has grown by a whole
	// retention since the last compaction. Under the alarm deletes and
	// lease revocations still move the revision a little, and compacting
	// (and then defragmenting) on every step of it would never end.
	if target := leader.Revision - p.tun.CompactionRetention; target > 0 && (p.CompactedRevision == 0 || target >= p.CompactedRevision+p.tun.CompactionRetention) || (p.opts.compactAgain && target > 0) {
		return Decision{Kind: Compact, Revision: target,
			Reason: fmt.Sprintf("%s: compacting etcd's history to revision %d (the current %d, less a retention of %d revisions), so that defragmentation can give the space back",
				what, target, leader.Revision, p.tun.CompactionRetention)}, true
	}
	// Each member once after the compaction, and at most once per
	// DefragMinInterval: a second NOSPACE soon after a recovery means the
	// data outgrows the quota, and another pass would only start a loop
	// of alarms, defragmentations and disarms.
	due := filter(p.voters(), func(m Member) bool {
		mc, ok := p.machineOf(m)
		last := lastDefrag(mc)
		return ok && m.Started() && last.Before(p.CompactedAt) && (last.IsZero() || p.since(last) >= p.tun.DefragMinInterval)
	})
	restart := p.dueForRestart()
	if len(due) > 0 || len(restart) > 0 {
		if l := p.learners(); len(l) > 0 {
			// A join cannot finish under the alarm (no promotion), and
			// a disruption waits for no learner: the join goes, and its
			// machine is replaced once etcd takes writes again.
			return p.removeMember(l[0], fmt.Sprintf("%s: removing learner %s, whose join cannot finish under the alarm, before %s; its machine is replaced after the recovery",
				what, p.memberName(l[0]), why(len(restart) > 0, "restarting members with the new quota", "defragmenting"))), true
		}
	}
	if len(restart) > 0 {
		// A raised quota first: it is what a database over the quota
		// needs, and costs each member seconds, not a defragmentation.
		return p.restartMember(followersFirst(restart), 0)
	}
	if len(due) > 0 {
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
		mc, _ := p.machineOf(m)
		again := ""
		if last := lastDefrag(mc); !last.IsZero() && last.Before(p.CompactedAt) {
			again = fmt.Sprintf(" (it was last defragmented at %s; QCP defragments it again once defragMinIntervalSeconds, %s, has passed)",
				stamp(last), p.tun.DefragMinInterval)
		}
		return degradedf("%s, and member %s's database is %d MiB after compaction and defragmentation%s, not below its quota of %d MiB: the data itself does not fit; raise etcd's quota (quotaBackendBytes: spec.etcd.stacked.quotaBackendBytes of a QuorumControlPlane, spec.quotaBackendBytes of an EtcdCluster), or delete data",
			what, p.memberName(m), m.DBSize>>20, again, p.quotaOf(m)>>20), true
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
// (etcd 3.6), else the one its machine was last given, else the
// configured one.
func (p planner) quotaOf(m Member) int64 {
	if q, ok := p.runningQuota(m); ok {
		return q
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
// healthy, no learner joining, no other member disrupted, no certificate
// renewal in flight (one such step at a time), and etcd tolerating at
// least minTolerance failures (1: it can lose the member disrupted).
func (p planner) waitToDisrupt(what string, minTolerance int) (Decision, bool) {
	if d, ok := p.waitForDisrupted(what); ok {
		return d, true
	}
	if d, ok := p.waitForRenewal(what); ok {
		return d, true
	}
	if l := p.learners(); len(l) > 0 {
		return waitf("waiting for learner %s to be promoted or removed before %s", p.memberName(l[0]), what), true
	}
	if d, ok := p.waitForVoters(what, false); ok {
		return d, true
	}
	if n := len(p.voters()); tolerance(n) < minTolerance {
		return waitf("not %s: with %d voter%s etcd cannot lose one while it is out of service", what, n, why(n == 1, "", "s")), true
	}
	return Decision{}, false
}

// waitForDisrupted waits while a member is disrupted, naming it.
func (p planner) waitForDisrupted(what string) (Decision, bool) {
	if m, ok := p.disrupted(); ok {
		mc, _ := p.machineOf(m)
		verb, since, timeout := p.disrupting(m), mc.DefragStartedAt, p.tun.DefragTimeout
		if verb == "restarting" {
			since, timeout = mc.RestartStartedAt, p.tun.RestartTimeout
		}
		return waitf("waiting for member %s to finish %s (started at %s; counted as unhealthy %s) before %s",
			p.memberName(m), verb, stamp(since), due(since, timeout), what), true
	}
	return Decision{}, false
}

// disrupted returns a member whose defragmentation or restart is in
// flight.
func (v view) disrupted() (Member, bool) {
	for _, m := range v.members {
		if v.disrupting(m) != "" {
			return m, true
		}
	}
	return Member{}, false
}

// disrupting says what m is busy with ("defragmenting", "restarting"), or
// "" if nothing: its machine holds an open record of the step, started
// less than the step's timeout ago, and m does not answer. A member that
// answers again has finished, even if a manager restart left the record
// open.
func (v view) disrupting(m Member) string {
	mc, ok := v.machineOf(m)
	switch {
	case !ok || m.Healthy:
		return ""
	case !mc.DefragStartedAt.IsZero() && v.since(mc.DefragStartedAt) < v.tun.DefragTimeout:
		return "defragmenting"
	case !mc.RestartStartedAt.IsZero() && v.since(mc.RestartStartedAt) < v.tun.RestartTimeout:
		return "restarting"
	}
	return ""
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
