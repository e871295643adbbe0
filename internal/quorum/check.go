package quorum

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Check reports every invariant (I1–I9) that taking decision d in state
// before, ending in state after, breaks, and every RenewCertificates
// taken when it is not due; nil if none. "after" is the state right after
// the step; faults and progress of the world may also show in it, so
// Check only blames d for what d can cause.
func Check(before State, d Decision, after State) error {
	b, a := newView(before), newView(after)
	checks := []func(view, Decision, view) error{
		checkQuorum, checkBounded, checkLearnersFirst, checkOneAtATime,
		checkHooks, checkLeader, checkNoHeroics, checkRenewal, checkAuthority, checkSnapshotSource,
		checkRestoreSource, checkOneCluster,
	}
	var errs []error
	for _, c := range checks {
		if err := c(b, d, a); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s: %w", d, errors.Join(errs...))
	}
	return nil
}

// OnlyI6 reports whether err, from Check, breaks I6 and nothing else: what
// a measurement that skips leadership transfers on purpose
// (PlanOptions.SkipLeaderTransfer) breaks, and all it may.
func OnlyI6(err error) bool {
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) == 0 {
		return false
	}
	for _, e := range joined.Unwrap() {
		if !strings.HasPrefix(e.Error(), "I6 leader:") {
			return false
		}
	}
	return true
}

// CheckMembers checks the invariants that a bare member list must satisfy at
// all times (I2: voters ≤ desired+1 and at most one learner). Runtime
// monitors call it on every sample. During a scale down pass the largest
// desired seen recently: the user lowering desired is not a violation.
func CheckMembers(desired int, members []Member) error {
	voters, learners := 0, 0
	for _, m := range members {
		if m.Learner {
			learners++
		} else {
			voters++
		}
	}
	var errs []error
	if voters > desired+1 {
		errs = append(errs, fmt.Errorf("I2 bounded: %d voters, more than desired %d + 1", voters, desired))
	}
	if learners > 1 {
		errs = append(errs, fmt.Errorf("I2 bounded: %d learners, more than 1", learners))
	}
	return errors.Join(errs...)
}

// CheckMembershipChange checks I1 and I3 between two consecutive samples of
// a member list: a voter may only disappear if the voters left that were
// healthy before are a majority of the voters left, and a member may only
// appear as a learner (except the first member, which bootstraps).
func CheckMembershipChange(before, after []Member) error {
	was := map[uint64]Member{}
	for _, m := range before {
		was[m.ID] = m
	}
	now := map[uint64]bool{}
	remaining, healthy := 0, 0
	var errs []error
	for _, m := range after {
		now[m.ID] = true
		old, existed := was[m.ID]
		switch {
		case !existed && m.Voter() && len(before) > 0:
			errs = append(errs, fmt.Errorf("I3 learners first: member %s joined as a voter", idString(m.ID)))
		case existed && old.Voter() && m.Voter():
			remaining++
			if old.Healthy {
				healthy++
			}
		}
	}
	for _, m := range before {
		if m.Voter() && !now[m.ID] && 2*healthy <= remaining {
			errs = append(errs, fmt.Errorf("I1 quorum: voter %s removed leaving %d healthy of %d voters", idString(m.ID), healthy, remaining))
		}
	}
	return errors.Join(errs...)
}

func checkQuorum(b view, d Decision, _ view) error {
	m, ok := b.member(d.MemberID)
	if !ok || d.Kind != RemoveMember || !m.Voter() {
		return nil
	}
	if !quorumAfterRemoval(b.voters(), m.ID) {
		return fmt.Errorf("I1 quorum: removing voter %s leaves the healthy voters without a majority", b.memberName(m))
	}
	// A voter whose machine an operator let go (deleting, hook removed) is
	// about to drop out: removing it first lowers nothing.
	if !keepsTolerance(b.atRiskVoters(), m.ID) {
		return fmt.Errorf("I1 quorum: removing healthy voter %s while another voter is down leaves etcd unable to survive one more failure", b.memberName(m))
	}
	if !floorAfterRemoval(b.atRiskVoters(), b.Desired, m.ID) {
		return fmt.Errorf("I8 floor: removing healthy voter %s leaves %d voters, fewer than desired %d − 1: the cluster was already a voter short",
			b.memberName(m), len(b.voters())-1, b.Desired)
	}
	return nil
}

func checkBounded(b view, d Decision, a view) error {
	var errs []error
	if av := a.voterCount(); av > a.Desired+1 && av > b.voterCount() {
		errs = append(errs, fmt.Errorf("I2 bounded: voters grew to %d, above desired %d + 1", av, a.Desired))
	}
	if al := a.learnerCount(); al > 1 && al > b.learnerCount() {
		errs = append(errs, fmt.Errorf("I2 bounded: learners grew to %d", al))
	}
	return errors.Join(errs...)
}

func checkLearnersFirst(b view, d Decision, a view) error {
	var errs []error
	if len(b.members) > 0 {
		for _, m := range a.members {
			if _, existed := b.member(m.ID); m.Voter() && !existed {
				errs = append(errs, fmt.Errorf("I3 learners first: member %s appeared as a voter", a.memberName(m)))
			}
		}
	}
	if d.Kind != Promote {
		return errors.Join(errs...)
	}
	m, ok := b.member(d.MemberID)
	leader, hasLeader := b.leader()
	switch {
	case !ok || !m.Learner:
		errs = append(errs, fmt.Errorf("I3 learners first: promoting %s, which is not a learner", idString(d.MemberID)))
	case !m.Started() || !m.Healthy:
		errs = append(errs, fmt.Errorf("I3 learners first: promoting learner %s, which is not started and healthy", b.memberName(m)))
	case !hasLeader || leader.AppliedIndex > m.AppliedIndex+b.tun.CatchUpMaxLag:
		errs = append(errs, fmt.Errorf("I3 learners first: promoting learner %s, which has not caught up with the leader", b.memberName(m)))
	}
	return errors.Join(errs...)
}

func checkOneAtATime(b view, d Decision, _ view) error {
	if err := checkOneDisruption(b, d); err != nil {
		return err
	}
	switch d.Kind {
	case CreateMachine:
		if prov := b.provisioning(); len(prov) > 0 {
			return fmt.Errorf("I4 one at a time: creating a machine while %s is being created", prov[0].Name)
		}
		if len(b.learners()) > 0 {
			return errors.New("I4 one at a time: creating a machine while a learner is joining")
		}
	case DeleteMachine:
		m, ok := b.memberOn(d.Machine)
		if !ok || !m.Voter() {
			return nil // cleanup of a machine that holds no vote
		}
		if prov := b.provisioning(); len(prov) > 0 {
			return fmt.Errorf("I4 one at a time: deleting voter machine %s while %s is being created", d.Machine, prov[0].Name)
		}
		for _, mc := range b.machines {
			if _, hosts := b.memberOn(mc.Name); hosts && mc.Deleting && mc.Name != d.Machine {
				return fmt.Errorf("I4 one at a time: deleting voter machine %s while %s is still leaving", d.Machine, mc.Name)
			}
		}
	case AddLearner:
		if len(b.learners()) > 0 {
			return errors.New("I4 one at a time: adding a learner while another learner exists")
		}
	case RemoveMember:
		m, ok := b.member(d.MemberID)
		for _, l := range b.learners() {
			if ok && m.Voter() && !l.Started() {
				return fmt.Errorf("I4 one at a time: removing voter %s while learner %s has not started", b.memberName(m), b.memberName(l))
			}
		}
	}
	return nil
}

// checkOneDisruption is I4's wider class: a membership change, a
// defragmentation and a restart in place each take a member out of
// service for a while, so at most one is in flight, and a disruption
// starts only while the cluster can lose the member (at least three
// voters, every one healthy, no learner joining).
func checkOneDisruption(b view, d Decision) error {
	restart := d.Kind == RestartMember || d.Kind == SetAuthority && d.RestartsMember
	if busy, ok := b.disrupted(); ok && busy.ID != d.MemberID {
		switch {
		case d.Kind == AddLearner, d.Kind == Promote, d.Kind == Defragment, restart:
			return fmt.Errorf("I4 one at a time: %s while member %s is %s", d.Kind, b.memberName(busy), b.disrupting(busy))
		case d.Kind == RemoveMember, d.Kind == DeleteMachine:
			if b.destructive(d) {
				return fmt.Errorf("I4 one at a time: %s of a voter while member %s is %s", d.Kind, b.memberName(busy), b.disrupting(busy))
			}
		}
	}
	verb := map[Kind]string{Defragment: "defragmenting", RestartMember: "restarting"}[d.Kind]
	if restart {
		verb = "restarting"
	}
	if verb == "" {
		return nil
	}
	if r, ok := b.renewing(); ok {
		return fmt.Errorf("I4 one at a time: %s %s while machine %s renews its certificates", verb, idString(d.MemberID), r.Name)
	}
	m, ok := b.member(d.MemberID)
	if !ok || !m.Voter() || !m.Started() || !m.Healthy {
		return fmt.Errorf("I4 one at a time: %s %s, which is not a healthy, started voter", verb, idString(d.MemberID))
	}
	voters := b.voters()
	if down := filter(voters, func(o Member) bool { return !o.Healthy }); len(down) > 0 {
		return fmt.Errorf("I4 one at a time: %s %s while voter %s is unhealthy: the cluster cannot lose both", verb, b.memberName(m), b.memberName(down[0]))
	}
	if l := b.learners(); len(l) > 0 {
		return fmt.Errorf("I4 one at a time: %s %s while learner %s is joining", verb, b.memberName(m), b.memberName(l[0]))
	}
	// A NOSPACE recovery may disrupt one of one or two voters: the
	// cluster refuses writes already. So may a quota restart in a cluster
	// whose desired size could never lose a member.
	if tolerance(len(voters)) < 1 && !b.noSpaceRaised() && (!restart || tolerance(b.Desired) > 0) {
		return fmt.Errorf("I4 one at a time: %s %s, one of %d voters: the cluster cannot lose it", verb, b.memberName(m), len(voters))
	}
	return nil
}

func checkHooks(b view, d Decision, _ view) error {
	switch d.Kind {
	case Promote:
		m, _ := b.member(d.MemberID)
		if mc, ok := b.machineOf(m); !ok || !mc.HasHook {
			return fmt.Errorf("I5 hooks: promoting %s before its machine carries the pre-drain hook", b.memberName(m))
		}
	case RemoveHook:
		if m, ok := b.memberOn(d.Machine); ok && m.Voter() {
			return fmt.Errorf("I5 hooks: removing the hook from %s, which still hosts a voter", d.Machine)
		}
	case AddHook:
		if mc, ok := b.machine(d.Machine); ok && mc.Deleting {
			return fmt.Errorf("I5 hooks: adding the hook back to deleting machine %s", d.Machine)
		}
	case DeleteMachine:
		mc, _ := b.machine(d.Machine)
		if m, ok := b.memberOn(d.Machine); ok && m.Voter() && !mc.HasHook {
			return fmt.Errorf("I5 hooks (and I1): deleting voter machine %s, which lacks the pre-drain hook, drains it before its member is removed", d.Machine)
		}
	}
	return nil
}

func checkLeader(b view, d Decision, _ view) error {
	var leaving Member
	var ok bool
	switch d.Kind {
	case RemoveMember:
		leaving, ok = b.member(d.MemberID)
	case DeleteMachine:
		leaving, ok = b.memberOn(d.Machine)
	case MoveLeader:
		return checkLeaderTarget(b, d)
	case Defragment, RestartMember, SetAuthority:
		if d.Kind == SetAuthority && !d.RestartsMember {
			return nil
		}
		if m, ok := b.member(d.MemberID); ok && m.Leader && m.Healthy && len(b.voters()) > 1 {
			return fmt.Errorf("I6 leader: %s of leader %s without moving leadership first", d.Kind, b.memberName(m))
		}
		return nil
	}
	if ok && leaving.Voter() && leaving.Leader && leaving.Healthy && len(b.voters()) > 1 {
		return fmt.Errorf("I6 leader: %s removes leader %s without moving leadership first", d.Kind, b.memberName(leaving))
	}
	return nil
}

func checkLeaderTarget(b view, d Decision) error {
	t, ok := b.member(d.MemberID)
	mc, hasMachine := b.machineOf(t)
	current, _ := b.leader()
	best, found := b.leaderTarget(current.ID)
	bestMC, _ := b.machineOf(best)
	if !ok || !t.Voter() || !t.Healthy || !t.Started() || t.Leader || !hasMachine || (mc.Deleting && found && !bestMC.Deleting) {
		return fmt.Errorf("I6 leader: moving leadership to %s, which is not a healthy voter that stays", idString(d.MemberID))
	}
	if found && b.outdated(mc) && !b.outdated(bestMC) {
		return fmt.Errorf("I6 leader: moving leadership to outdated %s while up-to-date %s is available", mc.Name, bestMC.Name)
	}
	return nil
}

func checkNoHeroics(b view, d Decision, _ view) error {
	if !b.destructive(d) {
		return nil
	}
	voters := b.voters()
	unhealthy := filter(voters, func(m Member) bool { return !m.Healthy })
	if len(unhealthy) > tolerance(len(voters)) {
		return fmt.Errorf("I7 no heroics: %s while %d of %d voters are unhealthy", d.Kind, len(unhealthy), len(voters))
	}
	return nil
}

// checkRenewal holds RenewCertificates to its rule: one renewal at a
// time, never beside a member's disruption, only on a machine that stays
// and whose certificates are known to be due, and that is well (its
// member a healthy, started voter; in the APIServersOnly topology, it
// serves).
func checkRenewal(b view, d Decision, _ view) error {
	if d.Kind != RenewCertificates {
		return nil
	}
	mc, ok := b.machine(d.Machine)
	switch {
	case !ok:
		return fmt.Errorf("renewal: renewing the certificates of machine %s, which does not exist", d.Machine)
	case mc.Deleting:
		return fmt.Errorf("renewal: renewing the certificates of deleting machine %s", d.Machine)
	case mc.CertificatesRenewAt.IsZero():
		return fmt.Errorf("renewal: renewing the certificates of machine %s, whose renewal time is unknown", d.Machine)
	case mc.CertificatesRenewAt.After(b.Now):
		return fmt.Errorf("renewal: renewing the certificates of machine %s before they are due (%s)", d.Machine, mc.CertificatesRenewAt.UTC().Format(time.RFC3339))
	}
	if r, ok := b.renewing(); ok {
		return fmt.Errorf("I4 one at a time: renewing the certificates of machine %s while machine %s renews its own", d.Machine, r.Name)
	}
	if busy, ok := b.disrupted(); ok {
		return fmt.Errorf("I4 one at a time: renewing the certificates of machine %s while member %s is %s", d.Machine, b.memberName(busy), b.disrupting(busy))
	}
	if b.Topology == APIServersOnly {
		if !b.serves(mc) {
			return fmt.Errorf("renewal: renewing the certificates of machine %s, which does not serve", d.Machine)
		}
		return nil
	}
	if m, ok := b.memberOn(d.Machine); !ok || !m.Voter() || !m.Started() || !m.Healthy {
		return fmt.Errorf("renewal: renewing the certificates of machine %s, whose member is not a healthy, started voter", d.Machine)
	}
	return nil
}

// checkAuthority holds SetAuthority to its rule: only on a machine
// that stays, lacks what the step gives it, and hosts a healthy, started
// voter; a leaf move (no restart) one at a time and never beside a
// disruption or a renewal, as a renewal. A trust change is a restart,
// which checkOneDisruption and checkLeader hold.
func checkAuthority(b view, d Decision, _ view) error {
	if d.Kind != SetAuthority {
		return nil
	}
	mc, ok := b.machine(d.Machine)
	want := d.authorityUpdate()
	switch {
	case !ok || mc.Deleting:
		return fmt.Errorf("authority: changing the authorities of machine %s, which is gone or deleting", d.Machine)
	case mc.AuthorityUpdate != want:
		return fmt.Errorf("authority: a %q change on machine %s, which lacks %q", want, d.Machine, mc.AuthorityUpdate)
	}
	m, ok := b.memberOn(d.Machine)
	if !ok || m.ID != d.MemberID || !m.Voter() || !m.Started() || !m.Healthy {
		return fmt.Errorf("authority: changing the authorities of machine %s, whose member is not a healthy, started voter", d.Machine)
	}
	if d.RestartsMember {
		return nil
	}
	if r, ok := b.renewing(); ok {
		return fmt.Errorf("I4 one at a time: bringing machine %s to a CA rotation's stage while machine %s renews its own", d.Machine, r.Name)
	}
	if busy, ok := b.disrupted(); ok {
		return fmt.Errorf("I4 one at a time: bringing machine %s to a CA rotation's stage while member %s is %s", d.Machine, b.memberName(busy), b.disrupting(busy))
	}
	return nil
}

// checkSnapshotSource: a snapshot is taken from a healthy, started voter,
// and from the leader only when it is the only voter (the leader serves
// every write; a follower's stream costs the cluster nothing).
func checkSnapshotSource(b view, d Decision, _ view) error {
	if d.Kind != Snapshot {
		return nil
	}
	m, ok := b.member(d.MemberID)
	switch {
	case !ok || !m.Voter() || !m.Healthy || !m.Started():
		return fmt.Errorf("snapshot source: member %s is not a healthy, started voter", idString(d.MemberID))
	case m.Leader && len(b.voters()) > 1:
		return fmt.Errorf("snapshot source: member %s is the leader, and the cluster has %d voters", idString(d.MemberID), len(b.voters()))
	}
	return nil
}

// checkRestoreSource: the first machine of a cluster that restores a
// snapshot is created only once the snapshot was found and checked; one
// created earlier would start from nothing, or from bad data.
func checkRestoreSource(b view, d Decision, _ view) error {
	if d.Kind != CreateMachine || !b.Restore.Requested || b.Restore.Problem == "" || len(b.members) > 0 || b.Bootstrapped {
		return nil
	}
	return fmt.Errorf("restore source: the first machine was created while the snapshot cannot be restored (%s)", b.Restore.Problem)
}
