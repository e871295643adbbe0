package quorum

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Plan returns the one next step for s. It is pure and deterministic: the
// same State (in any order) always yields the same Decision.
//
// Plan tries its rules in order and returns the first decision a rule makes.
// The order is the policy: protect voters first, then refuse to act on a
// cluster that lost quorum, then clean up, then finish what is in flight,
// and only then start something new.
func Plan(s State) Decision {
	return planWith(s, options{})
}

// Options change the planner for measurements. Production code uses Plan.
type Options struct {
	// SkipLeaderTransfer removes leaders without MoveLeader first. It
	// deliberately breaks I6, so that a test can measure the write gap that
	// MoveLeader saves. Never set it outside such a measurement.
	SkipLeaderTransfer bool
}

// PlanWithOptions is Plan with measurement options; see Options.
func PlanWithOptions(s State, o Options) Decision {
	return planWith(s, options{skipLeaderTransfer: o.SkipLeaderTransfer})
}

// options lets tests swap in deliberately broken planners, to prove that the
// exploration catches them. Production code always uses the zero value.
type options struct {
	// skipQuorumChecks removes the I1 and I7 guards.
	skipQuorumChecks bool
	// skipLeaderTransfer removes the I6 MoveLeader step.
	skipLeaderTransfer bool
	// protectVotersLast runs protectVoters after every other rule, so that
	// voter machines without the hook may be deleted before they get it.
	protectVotersLast bool
	// removeHealthyWithOtherDown lets a healthy departing voter go while
	// another voter is down, lowering fault tolerance.
	removeHealthyWithOtherDown bool
	// noVoterFloor lets a healthy departing voter go under RemoveFirst
	// while the cluster is already a voter short (issue 28, hole 1).
	noVoterFloor bool
	// verifyIgnoresMachines leaves the set of machines out of every
	// Expectation, so a machine created since the plan goes unseen (hole 2).
	verifyIgnoresMachines bool
	// deleteServingMarked deletes a marked machine first in the
	// APIServersOnly topology even while it serves (hole 3).
	deleteServingMarked bool
	// releaseHookUnknown releases a deleting first machine's hook while the
	// member list cannot be read (hole 4).
	releaseHookUnknown bool
	// ignoreMachinesWord remediates a voter that does not answer QCP
	// though its machine says it answers there, as one that is down
	// (issue 37).
	ignoreMachinesWord bool
	// keepStalledLearners never gives up on a learner that answers but
	// does not catch up (hole 5).
	keepStalledLearners bool
	// defragFirst runs defragment right after the quorum checks, without
	// its preflight, so that it disrupts a second member.
	defragFirst bool
	// defragLeader defragments the leader without moving leadership.
	defragLeader bool
	// compactAgain compacts on every NOSPACE round, forgetting the last
	// compaction, so a recovery that cannot succeed never ends.
	compactAgain bool
	// restartUnchecked restarts a member for a new quota without the
	// preflight of a disruption.
	restartUnchecked bool
	// renewUnchecked renews a machine's certificates without waiting for
	// a renewal or a disruption in flight.
	renewUnchecked bool
	// snapshotFromLeader takes scheduled snapshots from the leader.
	snapshotFromLeader bool
	// restoreUnchecked creates a restoring first machine while its
	// snapshot has a problem.
	restoreUnchecked bool
	// recoverUnfenced recovers from a survivor, or restores from a backup,
	// while lost voters' machines are not confirmed lost.
	recoverUnfenced bool
}

// planner holds one observation; its methods are the rules.
type planner struct {
	view
	opts options
}

// rule returns a decision and true, or false to let the next rule decide.
type rule func(p planner) (Decision, bool)

func planWith(s State, o options) Decision {
	if s.Desired < 1 {
		return degradedf("desired replicas is %d; set it to at least 1", s.Desired)
	}
	if o.ignoreMachinesWord {
		s.Machines = slices.Clone(s.Machines)
		for i := range s.Machines {
			s.Machines[i].EtcdAnswersOnMachine = false
		}
	}
	p := planner{view: newView(s), opts: o}
	rules := []rule{
		planner.recoverQuorum,
		planner.refuseUnknownMembership,
		planner.bootstrap,
		planner.protectVoters,
		planner.releaseDepartedMachines,
		planner.refuseWithAlarms,
		planner.refuseWithoutQuorum,
		planner.removeStrayLearners,
		planner.deleteUnusableMachines,
		planner.cancelSurplusMachines,
		planner.removeDepartingVoter,
		planner.remediateUnhealthyVoter,
		planner.finishJoining,
		planner.createMachine,
		planner.scaleDown,
		planner.renewCertificates,
		planner.rotateAuthority,
		planner.waitForUnhealthyVoters,
		planner.restartForQuota,
		planner.takeSnapshot,
		planner.defragment,
	}
	if o.defragFirst {
		rules = slices.Insert(rules[:len(rules)-1], 7, planner.defragment)
	}
	if o.protectVotersLast {
		rules = append(slices.Delete(rules, 3, 4), planner.protectVoters)
	}
	steady := func() Decision {
		return waitf("nothing to do: %d healthy, up-to-date voters as desired", len(p.voters()))
	}
	if s.Topology == APIServersOnly {
		rules, steady = apiServerRules, p.apiServersSteady
	}
	for _, r := range rules {
		if d, ok := r(p); ok {
			return p.expect(d)
		}
	}
	return steady()
}

// expect fills in the preconditions of d (see Expectation) from the
// observation it was planned on. Every step but Wait and Degraded gets the
// same, whole set: it is cheap to check, and a partial one proved to leave
// gaps (the exploration's stale observations found each of them).
func (p planner) expect(d Decision) Decision {
	if d.Kind == Wait || d.Kind == Degraded {
		return d
	}
	if mc, ok := p.machine(d.Machine); ok {
		d.Expect.MachineResourceVersion = mc.ResourceVersion
	}
	d.Expect.Desired, d.Expect.FailureDomains = p.Desired, sortedDomains(p.FailureDomains)
	d.Expect.Deleting, d.Expect.Hooked = machineNames(p.machines)
	if !p.opts.verifyIgnoresMachines {
		d.Expect.Machines = allMachineNames(p.machines)
	}
	if len(p.members) > 0 {
		d.Expect.Members, d.Expect.Learners = memberIDs(p.members)
		d.Expect.Healthy = healthyIDs(p.members)
	}
	// The leader named, healthy or not: a leader QCP cannot reach (its
	// followers name it) may hand leadership to the step's target before
	// the step, which must then stop (I6).
	for _, m := range p.members {
		if m.Leader && m.Voter() {
			d.Expect.Leader = m.ID
		}
	}
	return d
}

// refuseUnknownMembership takes no step while the member list cannot be
// observed, once etcd has ever had a member. An empty or unreadable list is
// then a blind spot, not a fact: taking it for "no members" would treat
// every machine as spent and delete the whole control plane.
func (p planner) refuseUnknownMembership() (Decision, bool) {
	if len(p.members) > 0 {
		return Decision{}, false
	}
	recorded := filter(p.machines, func(mc Machine) bool { return mc.MemberID != 0 || mc.JoinStarted })
	if len(recorded) == 0 && !p.Bootstrapped {
		return Decision{}, false // etcd never had a member: the bootstrap rule decides
	}
	what := "no etcd member is listed"
	if p.MembersUnknown {
		what = "the etcd member list cannot be read (no member answered, or the members disagree)"
	}
	who := "etcd was bootstrapped before"
	if len(recorded) > 0 {
		who = "machines " + names(recorded, func(m Machine) string { return m.Name }) + " have hosted etcd members"
	}
	return degradedf("%s, but %s; QCP takes no step until it can see the membership, and never bootstraps a second cluster over the first: bring a member back, or restore etcd from a backup",
		what, who), true
}

// bootstrap handles the cluster before it has any etcd member: the first
// machine starts a new etcd cluster on its own, without AddLearner. It runs
// only when no machine has ever recorded a member (refuseUnknownMembership).
func (p planner) bootstrap() (Decision, bool) {
	if len(p.members) > 0 {
		return Decision{}, false
	}
	for _, mc := range p.machines {
		switch {
		case mc.Deleting && mc.HasHook && mc.PeerURL != "" && !p.opts.releaseHookUnknown:
			// No member seen is not no member: a machine with an address
			// may run the only one, bootstrapped but not yet observed, and
			// its hook goes only once its member is known to be gone (I5).
			return waitf("waiting to read a member list from etcd before releasing the drain of deleting machine %s: it may host the only member; if it never ran etcd, removing its hook annotations by hand lets it go",
				mc.Name), true
		case mc.Deleting && mc.HasHook:
			return Decision{Kind: RemoveHook, Machine: mc.Name,
				Reason: "machine " + mc.Name + " is being deleted and hosts no etcd member"}, true
		case mc.Deleting:
			return waitf("waiting for machine %s to finish deleting before bootstrapping etcd", mc.Name), true
		case mc.CreationFailed || mc.Remediate:
			return Decision{Kind: DeleteMachine, Machine: mc.Name,
				Reason: "machine " + mc.Name + " cannot bootstrap etcd (" + why(mc.Remediate, "a health check marked it", "creation failed") + "); deleting it"}, true
		}
	}
	switch live := p.keep(); len(live) {
	case 0:
		fd := p.nextFailureDomain(nil)
		if r := p.Restore; r.Requested {
			if r.Problem != "" && !p.opts.restoreUnchecked {
				return waitf("waiting for a snapshot to restore before creating the first machine: %s", r.Problem), true
			}
			return Decision{Kind: CreateMachine, FailureDomain: fd,
				Reason: "creating the first machine in failure domain " + quoteFD(fd) + "; it restores etcd from snapshot " + r.Snapshot}, true
		}
		return Decision{Kind: CreateMachine, FailureDomain: fd,
			Reason: "creating the first machine in failure domain " + quoteFD(fd) + "; it bootstraps a new etcd cluster"}, true
	case 1:
		mc := live[0]
		if mc.PeerURL == "" {
			return waitf("waiting for machine %s to be provisioned (no address yet) before it bootstraps etcd", mc.Name), true
		}
		if age := p.since(mc.InfraReadyAt); age >= p.tun.LearnerStartTimeout {
			return Decision{Kind: DeleteMachine, Machine: mc.Name,
				Reason: fmt.Sprintf("machine %s has not bootstrapped etcd %s after its infrastructure became ready (timeout %s); deleting it to try again",
					mc.Name, roundDuration(age), p.tun.LearnerStartTimeout)}, true
		}
		return waitf("waiting for machine %s to bootstrap the etcd cluster", mc.Name), true
	default:
		return degradedf("%d machines (%s) but no etcd member: etcd cannot bootstrap twice; delete all but one machine, or restore etcd from a backup",
			len(live), names(live, func(m Machine) string { return m.Name })), true
	}
}

// protectVoters puts the pre-drain hook on every machine that hosts a voter
// and is not being deleted (I5). It runs even without quorum: it only ever
// makes deleting a voter harder. It never touches a deleting machine, so an
// operator removing the hook there is a deliberate escape hatch.
func (p planner) protectVoters() (Decision, bool) {
	for _, mc := range p.machines {
		if mc.Deleting || mc.HasHook {
			continue
		}
		if m, ok := p.memberOn(mc.Name); ok && m.Voter() {
			return Decision{Kind: AddHook, Machine: mc.Name,
				Reason: "machine " + mc.Name + " hosts a voter but lacks the pre-drain hook"}, true
		}
	}
	return Decision{}, false
}

// releaseDepartedMachines lets a deleting machine drain once it hosts no
// voter (its member was removed, or it never got past learner).
func (p planner) releaseDepartedMachines() (Decision, bool) {
	for _, mc := range p.machines {
		if !mc.Deleting || !mc.HasHook {
			continue
		}
		if m, ok := p.memberOn(mc.Name); ok && m.Voter() {
			continue
		}
		return Decision{Kind: RemoveHook, Machine: mc.Name,
			Reason: "machine " + mc.Name + " is being deleted and no longer hosts a voter; releasing its drain"}, true
	}
	return Decision{}, false
}

// refuseWithoutQuorum is I7: with more voters unhealthy than etcd tolerates,
// every membership change would fail or make things worse, and only a human
// can bring members back or restore from a backup.
func (p planner) refuseWithoutQuorum() (Decision, bool) {
	if p.opts.skipQuorumChecks {
		return Decision{}, false
	}
	if p.hasQuorum() {
		return Decision{}, false
	}
	voters := p.voters()
	unhealthy := filter(voters, func(m Member) bool { return !m.Healthy })
	return degradedf("etcd has lost quorum: %d of %d voters are unhealthy (%s) and it tolerates %d; bring those members back or restore etcd from a backup",
		len(unhealthy), len(voters), names(unhealthy, p.memberName), tolerance(len(voters))), true
}

// refuseWithAlarms stops membership changes while a member has an alarm.
// CORRUPT needs an operator (check the data, or restore); QCP recovers
// from NOSPACE by itself (recoverFromNoSpace). It runs before
// refuseWithoutQuorum so that the message names the alarm.
// Removing members QCP would remove anyway is still allowed, when
// quorum-safe: stray learners, and voters that are leaving (their machine
// is deleting or gone, or, unless NOSPACE alone is raised, they are due
// for remediation), the alarmed ones first and without waiting for a
// replacement. Removing the alarmed member and replacing it is the
// standard fix for a CORRUPT member. Under NOSPACE it fixes nothing, and
// the marks it brings (Nodes NotReady, as no lease can be renewed) are no
// sign of a broken machine: only a member itself down past
// UnhealthyTimeout is removed, and the rest of remediation waits for the
// recovery.
func (p planner) refuseWithAlarms() (Decision, bool) {
	alarmed := filter(p.members, func(m Member) bool { return len(m.Alarms) > 0 })
	departed := p.departedAlarms()
	if len(alarmed) == 0 && len(departed) == 0 {
		return Decision{}, false
	}
	if d, ok := p.disarmDepartedNoSpace(departed); ok {
		return d, true
	}
	if d, ok := p.removeStrayLearners(); ok {
		return d, true
	}
	noSpace := p.noSpaceOnly()
	leaving := func(m Member) bool {
		mc, ok := p.machineOf(m)
		switch {
		case !ok || mc.Deleting:
			return true
		case noSpace:
			// Only a member down itself past the timeout: a mark alone
			// may come from the alarm.
			return p.dueForRemediation(m) && p.unhealthyFor(m) >= p.tun.UnhealthyTimeout
		}
		return mc.Remediate || p.dueForRemediation(m)
	}
	candidates := append(filter(alarmed, leaving), filter(p.voters(), func(m Member) bool {
		return len(m.Alarms) == 0 && leaving(m) && !m.Healthy
	})...)
	for _, m := range candidates {
		if m.Learner {
			return p.removeMember(m, "learner "+p.memberName(m)+" has alarms "+fmt.Sprint(m.Alarms)+" and is leaving; removing it"), true
		}
		if !p.hasQuorum() || !p.removalSafe(m) {
			continue
		}
		if d, blocked := p.membershipBusy(); blocked {
			return d, true
		}
		if !p.keepsFloor(m) {
			continue
		}
		return p.removeVoter(m, fmt.Sprintf("member %s is leaving while %s; removing it first%s",
			p.memberName(m), p.alarmSummary(alarmed, departed), why(len(m.Alarms) > 0, ", then replacing its machine", "")))
	}
	if noSpace && p.hasQuorum() {
		return p.recoverFromNoSpace(p.alarmSummary(alarmed, departed))
	}
	if len(alarmed) == 0 {
		return degradedf("%s; QCP changes no membership until it is cleared: %s", p.alarmSummary(alarmed, departed), departedAdvice(departed[0])), true
	}
	return degradedf("member %s has alarms %v; resolve them (defragment and disarm, or restore) before QCP changes membership",
		p.memberName(alarmed[0]), alarmed[0].Alarms), true
}

// departedAlarms are the alarms of members no longer listed (etcd keeps an
// alarm until it is disarmed), CORRUPT first.
func (p planner) departedAlarms() []Alarm {
	out := filter(p.DepartedAlarms, func(a Alarm) bool { _, listed := p.member(a.MemberID); return !listed })
	slices.SortStableFunc(out, func(a, b Alarm) int {
		return cmp.Or(-cmp.Compare(boolInt(a.Type == "CORRUPT"), boolInt(b.Type == "CORRUPT")), cmp.Compare(a.MemberID, b.MemberID))
	})
	return out
}

// disarmDepartedNoSpace disarms a NOSPACE alarm whose member is gone, once
// every member's database is known to be below the quota: the space it
// complained of left with it, and the alarm alone keeps refusing every
// write. Reclaiming space on members still listed is etcd maintenance's
// job, not this rule's.
func (p planner) disarmDepartedNoSpace(departed []Alarm) (Decision, bool) {
	for _, a := range departed {
		if a.Type != "NOSPACE" || p.QuotaBackendBytes <= 0 || len(p.members) == 0 {
			continue
		}
		if len(p.overQuota()) > 0 {
			continue
		}
		return Decision{Kind: DisarmAlarm, MemberID: a.MemberID, Alarm: a.Type,
			Reason: fmt.Sprintf("disarming NOSPACE raised by member %s, since removed: every member's database is below the quota of %d bytes", idString(a.MemberID), p.QuotaBackendBytes)}, true
	}
	return Decision{}, false
}

// alarmSummary names the first alarm, a listed member's before a departed one's.
func (p planner) alarmSummary(alarmed []Member, departed []Alarm) string {
	if len(alarmed) > 0 {
		return fmt.Sprintf("member %s has alarms %v", p.memberName(alarmed[0]), alarmed[0].Alarms)
	}
	return fmt.Sprintf("member %s, since removed, raised %s, which etcd keeps until it is disarmed", idString(departed[0].MemberID), departed[0].Type)
}

// departedAdvice says what a person does about a departed member's alarm.
func departedAdvice(a Alarm) string {
	if a.Type == "CORRUPT" {
		return "check the remaining members' data (etcdctl check hashkv), then disarm it (etcdctl alarm disarm), or restore etcd from a backup"
	}
	return "QCP disarms it once every member's database is known to be below the quota; defragment the members, or disarm it by hand (etcdctl alarm disarm)"
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func quoteFD(fd string) string {
	if fd == "" {
		return `""`
	}
	return fd
}

func idString(id uint64) string { return strconv.FormatUint(id, 16) }

func roundDuration(d time.Duration) string { return d.Round(time.Second).String() }

// A Wait's reason names times, not ages. It then reads the same from one
// round to the next while the situation stands: status is not rewritten
// every round for a clock that moved, and lastOperation.startTime, kept
// while the reason repeats, says since when the owner has been waiting.

// stamp is t as status shows times: RFC 3339, in UTC; "a time not
// recorded" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "a time not recorded"
	}
	return t.UTC().Format(time.RFC3339)
}

// due is when a timeout of d from t runs out: "at" a time, or, from a
// time not recorded (which restarts the timeout: view.since), d after one
// is.
func due(t time.Time, d time.Duration) string {
	if t.IsZero() {
		return d.String() + " after that is recorded"
	}
	return "at " + stamp(t.Add(d))
}
