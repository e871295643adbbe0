package quorum

import (
	"fmt"
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
	p := planner{view: newView(s), opts: o}
	rules := []rule{
		planner.bootstrap,
		planner.protectVoters,
		planner.releaseDepartedMachines,
		planner.refuseWithoutQuorum,
		planner.refuseWithAlarms,
		planner.removeStrayLearners,
		planner.deleteUnusableMachines,
		planner.removeDepartingVoter,
		planner.remediateUnhealthyVoter,
		planner.finishJoining,
		planner.createMachine,
		planner.scaleDown,
	}
	for _, r := range rules {
		if d, ok := r(p); ok {
			return d
		}
	}
	return waitf("nothing to do: %d healthy, up-to-date voters as desired", len(p.voters()))
}

// bootstrap handles the cluster before it has any etcd member: the first
// machine starts a new etcd cluster on its own, without AddLearner.
func (p planner) bootstrap() (Decision, bool) {
	if len(p.members) > 0 {
		return Decision{}, false
	}
	for _, mc := range p.machines {
		switch {
		case mc.Deleting && mc.HasHook:
			return Decision{Kind: RemoveHook, Machine: mc.Name,
				Reason: "machine " + mc.Name + " is being deleted and hosts no etcd member"}, true
		case mc.Deleting:
			return waitf("waiting for machine %s to finish deleting before bootstrapping etcd", mc.Name), true
		case mc.CreationFailed || mc.MemberID != 0:
			return Decision{Kind: DeleteMachine, Machine: mc.Name,
				Reason: "machine " + mc.Name + " cannot bootstrap etcd (creation failed or its member is gone)"}, true
		}
	}
	switch live := p.keep(); len(live) {
	case 0:
		fd := p.nextFailureDomain()
		return Decision{Kind: CreateMachine, FailureDomain: fd,
			Reason: "creating the first machine in failure domain " + quoteFD(fd) + "; it bootstraps a new etcd cluster"}, true
	case 1:
		mc := live[0]
		if age := p.Now.Sub(mc.CreatedAt); age >= p.tun.LearnerStartTimeout {
			return Decision{Kind: DeleteMachine, Machine: mc.Name,
				Reason: fmt.Sprintf("machine %s has not bootstrapped etcd %s after it was created (timeout %s); deleting it to try again",
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
	voters := p.voters()
	unhealthy := filter(voters, func(m Member) bool { return !m.Healthy })
	if len(voters) > 0 && len(unhealthy) <= tolerance(len(voters)) {
		return Decision{}, false
	}
	return degradedf("etcd has lost quorum: %d of %d voters are unhealthy (%s) and it tolerates %d; bring those members back or restore etcd from a backup",
		len(unhealthy), len(voters), names(unhealthy, p.memberName), tolerance(len(voters))), true
}

// refuseWithAlarms stops membership changes while a member has an alarm:
// NOSPACE and CORRUPT need an operator (defragment, disarm, restore).
func (p planner) refuseWithAlarms() (Decision, bool) {
	for _, m := range p.members {
		if len(m.Alarms) > 0 {
			return degradedf("member %s has alarms %v; resolve them (defragment and disarm, or restore) before QCP changes membership",
				p.memberName(m), m.Alarms), true
		}
	}
	return Decision{}, false
}

func quoteFD(fd string) string {
	if fd == "" {
		return `""`
	}
	return fd
}

func idString(id uint64) string { return strconv.FormatUint(id, 16) }

func roundDuration(d time.Duration) string { return d.Round(time.Second).String() }
