package quorum

import (
	"fmt"
	"slices"
	"strings"
)

// Kind names the one step a Decision asks the caller to take.
type Kind string

// The steps. How a caller carries each one out is documented on the constant.
const (
	// CreateMachine: create a machine in Decision.FailureDomain with the
	// current spec. If there are no etcd members it bootstraps a new cluster
	// (--initial-cluster-state=new); otherwise it waits to be added as a
	// learner and then joins with --initial-cluster-state=existing.
	CreateMachine Kind = "CreateMachine"
	// AddLearner: record Machine.JoinStarted, then
	// MemberAddAsLearner(Decision.PeerURL) for Decision.Machine, then record
	// the member's ID (Machine.MemberID) and the time (Member.AddedAt).
	// Retry "unhealthy cluster".
	AddLearner Kind = "AddLearner"
	// Promote: MemberPromote(Decision.MemberID). "member not learner" is
	// success; "not in sync with leader" is retryable.
	Promote Kind = "Promote"
	// MoveLeader: MoveLeader(Decision.MemberID), sent to the current leader.
	MoveLeader Kind = "MoveLeader"
	// RemoveMember: MemberRemove(Decision.MemberID).
	RemoveMember Kind = "RemoveMember"
	// AddHook: add HookAnnotations to Decision.Machine.
	AddHook Kind = "AddHook"
	// RemoveHook: remove HookAnnotations from Decision.Machine.
	RemoveHook Kind = "RemoveHook"
	// DeleteMachine: delete Decision.Machine (its hook, if any, holds the
	// drain until the member is removed).
	DeleteMachine Kind = "DeleteMachine"
	// DisarmAlarm: disarm alarm Decision.Alarm raised by member
	// Decision.MemberID (etcd's AlarmDisarm), listed or not.
	DisarmAlarm Kind = "DisarmAlarm"
	// Compact: compact etcd's history up to Decision.Revision (physically),
	// then record State.CompactedRevision and CompactedAt. A revision
	// already compacted is success.
	Compact Kind = "Compact"
	// Defragment: record Machine.DefragStartedAt on Decision.Machine, call
	// etcd's Defragment on member Decision.MemberID alone, then record
	// Machine.DefragmentedAt and clear DefragStartedAt. The member blocks
	// its reads and writes while it defragments: a disruption of one
	// member, like a membership change.
	Defragment Kind = "Defragment"
	// RestartMember: record Machine.RestartStartedAt on Decision.Machine,
	// have its agent restart member Decision.MemberID's etcd in place with
	// backend quota Decision.QuotaBackendBytes, then record
	// Machine.QuotaBackendBytes and clear RestartStartedAt. The member is
	// out of service for the seconds its restart takes: a disruption of
	// one member, like a defragmentation.
	RestartMember Kind = "RestartMember"
	// RenewCertificates: record Machine.RenewStartedAt on
	// Decision.Machine, ask its agent to renew its leaf certificates in
	// place (POST /pki/renew), then record the new
	// Machine.CertificatesRenewAt and clear RenewStartedAt. MemberID names
	// the member the machine hosts, if any (for messages). etcd and the
	// API server reload the new files; the controller manager and the
	// scheduler on the machine restart one after the other. etcd is not
	// disrupted, but the step is one at a time, and never beside a
	// member's defragmentation or restart.
	RenewCertificates Kind = "RenewCertificates"
	// SetAuthority: bring Decision.Machine to the current stage of a CA
	// rotation (PUT /pki/etcd-authority or /pki/cluster-authority on its
	// agent). With
	// RestartsMember (Machine.AuthorityUpdate is AuthorityTrust) the
	// agent restarts member Decision.MemberID's etcd, and then its API
	// server, to read the new trust: a disruption of the restart's class,
	// recorded as Machine.RestartStartedAt. Without, it moves the leaves
	// to the new authority or changes a trust no member reads, in place,
	// recorded as
	// Machine.RenewStartedAt like a renewal. The caller then records what
	// the machine reports and clears the record.
	SetAuthority Kind = "SetAuthority"
	// Snapshot: take a snapshot of member Decision.MemberID's database
	// (on Decision.Machine), stream it to the backup store, have an agent
	// restore it into a scratch etcd, and record it once verified. etcd
	// is not disrupted: the member serves on while it streams.
	Snapshot Kind = "Snapshot"
	// Recover: etcd lost quorum for good, and member Decision.MemberID
	// on Decision.Machine survives it with the highest applied index.
	// Record the recovery on the owner first (a token naming it, the
	// machine, the member and Decision.Revision), then have the
	// machine's agent stop its etcd and restore its own database as the
	// only member of a new cluster (etcdutl snapshot restore
	// --skip-hash-check --bump-revision --mark-compacted, with the
	// token as --initial-cluster-token), start it, and record the new
	// member's ID as the machine's Machine.MemberID. Every other member
	// is then gone from the list: their machines are spent, deleted and
	// replaced by learners, the hooks released once they host no voter.
	// The one step allowed to shrink the membership below quorum's
	// rules (I7), and only once every lost voter's machine is confirmed
	// lost (I9).
	Recover Kind = "Recover"
	// RestoreFromBackup: etcd lost quorum for good, no member answers,
	// and every machine that hosted one is confirmed lost. Record the
	// recovery on the owner (the snapshot State.Restore names, its
	// revision); the next steps delete the old cluster's machines,
	// release their hooks (their members went with the cluster) and
	// create a first machine that restores the snapshot, as a new
	// cluster's does (Recovery.Restoring). Like Recover, allowed only
	// as I9 says.
	RestoreFromBackup Kind = "RestoreFromBackup"
	// Wait: nothing to do until the world changes; Reason names what for.
	Wait Kind = "Wait"
	// Degraded: the planner refuses to act and a human is needed; Reason
	// says why and what to do.
	Degraded Kind = "Degraded"
)

// Kinds are every Kind a Decision may have.
var Kinds = []Kind{CreateMachine, AddLearner, Promote, MoveLeader, RemoveMember, AddHook, RemoveHook, DeleteMachine,
	DisarmAlarm, Compact, Defragment, RestartMember, RenewCertificates, SetAuthority, Snapshot, Recover, RestoreFromBackup, Wait, Degraded}

// Decision is exactly one next step. Only the fields its Kind names are set.
type Decision struct {
	// Kind is the step.
	Kind Kind
	// FailureDomain is where CreateMachine places the new machine.
	FailureDomain string
	// Machine is the machine AddLearner, AddHook, RemoveHook,
	// DeleteMachine and RenewCertificates act on; for member steps it names the hosting machine
	// when there is one (for messages).
	Machine string
	// MemberID is the member Promote, RemoveMember, Defragment and
	// RestartMember act on, and the member
	// MoveLeader hands leadership to; for RenewCertificates, the member
	// Machine hosts, if any (for messages).
	MemberID uint64
	// PeerURL is the peer URL AddLearner registers.
	PeerURL string
	// Alarm is the alarm DisarmAlarm disarms (NOSPACE).
	Alarm string
	// Revision is the revision Compact compacts to; for Recover, the
	// survivor's revision, which the recovery keeps.
	Revision int64
	// Snapshot is the snapshot RestoreFromBackup restores.
	Snapshot string
	// QuotaBackendBytes is the backend quota RestartMember gives the member.
	QuotaBackendBytes int64
	// RestartsMember says that SetAuthority restarts the member.
	RestartsMember bool
	// Reason is a sentence for humans: why this step, or what is waited for.
	Reason string
	// Expect is what the world must still look like when the caller acts.
	Expect Expectation
}

// Expectation holds the preconditions of a Decision. The caller observes,
// plans and only then acts, and the world may change in between: a user
// deletes the machine QCP is about to put a hook on, or a voter crashes
// before QCP removes another. Right before it acts, the caller observes
// again and calls Decision.Verify; on a mismatch it drops the step and
// plans again.
type Expectation struct {
	// Desired is the desired replica count the plan used: a user lowering
	// it between plan and act must not see the cluster grow past it (I2).
	Desired int
	// FailureDomains are the domains the plan used, sorted: placement and
	// the choice of leadership target depend on them.
	FailureDomains []string
	// MachineResourceVersion is Decision.Machine's ResourceVersion as
	// observed (for member steps, the machine hosting the member: a learner
	// is promoted only while its machine still carries the hook it had).
	// Beyond Verify, AddHook, RemoveHook and DeleteMachine must be
	// conditional on it (an optimistic-lock patch, a delete precondition),
	// so that, for example, a hook is never put back on a machine that
	// started deleting.
	MachineResourceVersion string
	// Deleting are the machines that were being deleted, and Hooked those
	// that carried the hook, both sorted. A machine is deleted only while no
	// other one has started leaving since (I4), and a member is removed only
	// while no voter's machine has lost its hook since (it is about to drain).
	Deleting, Hooked []string
	// Machines are the names of every machine the plan saw, sorted. A
	// machine that appeared since (a create that committed after its client
	// timed out, or a second manager's during a leader-election hand-over)
	// would otherwise let a second creation through (I4), or desired + 2
	// machines during a surge.
	Machines []string
	// Members are the IDs of every member the plan saw, sorted. Every step
	// is taken only if a fresh member list has exactly these IDs: a member
	// that only looked gone must not lose its hook or its machine, and a
	// learner that was missed must not get a second one next to it.
	Members []uint64
	// Learners are the IDs of the members that were learners, sorted: roles
	// must match too (a stale list must not promote a voter again).
	Learners []uint64
	// Healthy are the members that were healthy and started, sorted. The
	// set must be the same right before the step: a removal relied on the
	// voters it leaves, a promotion on the learner, a leadership move on its
	// target being the best one.
	Healthy []uint64
	// Leader is the member that led when the plan was made; it must still
	// lead. Moving leadership away from it, and removing or deleting a voter
	// that was not the leader (I6), depend on it.
	Leader uint64
	// Survivors are the members that answered on their own (State.Survivors)
	// when the plan was made, sorted; a recovery is taken only while the
	// same members answer, so that a lost member that answers again stops
	// it.
	Survivors []uint64
}

// Verify checks d's preconditions against a fresh observation, made right
// before the caller acts.
func (d Decision) Verify(fresh State) error {
	e := d.Expect
	v := newView(fresh)
	if e.Desired != 0 && fresh.Desired != e.Desired {
		return fmt.Errorf("desired replicas changed since the plan: %d, planned with %d", fresh.Desired, e.Desired)
	}
	if e.FailureDomains != nil && !slices.Equal(sortedDomains(fresh.FailureDomains), e.FailureDomains) {
		return fmt.Errorf("failure domains changed since the plan: %v, planned with %v", fresh.FailureDomains, e.FailureDomains)
	}
	if e.MachineResourceVersion != "" {
		if mc, ok := v.machine(d.Machine); !ok || mc.ResourceVersion != e.MachineResourceVersion {
			return fmt.Errorf("machine %s changed since the plan", d.Machine)
		}
	}
	if e.Deleting != nil {
		deleting, hooked := machineNames(v.machines)
		if !slices.Equal(deleting, e.Deleting) || !slices.Equal(hooked, e.Hooked) {
			return fmt.Errorf("machines being deleted or carrying the hook changed since the plan: %v and %v, planned with %v and %v",
				deleting, hooked, e.Deleting, e.Hooked)
		}
	}
	if e.Members != nil {
		ids, learners := memberIDs(v.members)
		if !slices.Equal(ids, e.Members) || !slices.Equal(learners, e.Learners) {
			return fmt.Errorf("etcd membership changed since the plan: members %s (learners %s), planned with %s (learners %s)",
				idList(ids), idList(learners), idList(e.Members), idList(e.Learners))
		}
	}
	if all := allMachineNames(v.machines); e.Machines != nil && !slices.Equal(all, e.Machines) {
		return fmt.Errorf("the machines changed since the plan: %v, planned with %v", all, e.Machines)
	}
	if l, ok := v.member(e.Leader); e.Leader != 0 && (!ok || !l.Leader) {
		return fmt.Errorf("member %s no longer leads; the plan relied on it", idString(e.Leader))
	}
	if healthy := healthyIDs(v.members); e.Members != nil && !slices.Equal(healthy, e.Healthy) {
		return fmt.Errorf("member health changed since the plan: healthy %s, planned with %s", idList(healthy), idList(e.Healthy))
	}
	if s := survivorIDs(fresh.Survivors); e.Survivors != nil && !slices.Equal(s, e.Survivors) {
		return fmt.Errorf("the members that answer on their own changed since the plan: %s, planned with %s", idList(s), idList(e.Survivors))
	}
	switch d.Kind {
	case Recover:
		return v.verifyRecovery(d)
	case RestoreFromBackup:
		return v.verifyRestoreFromBackup(d)
	case RenewCertificates:
		return v.verifyRenewal(d.Machine)
	case SetAuthority:
		return v.verifyAuthority(d)
	}
	return nil
}

// machineNames returns the names of the deleting machines and of those
// carrying the hook, sorted and non-nil.
func machineNames(machines []Machine) (deleting, hooked []string) {
	deleting, hooked = []string{}, []string{}
	for _, mc := range machines {
		if mc.Deleting {
			deleting = append(deleting, mc.Name)
		}
		if mc.HasHook {
			hooked = append(hooked, mc.Name)
		}
	}
	slices.Sort(deleting)
	slices.Sort(hooked)
	return deleting, hooked
}

// allMachineNames returns the names of machines, sorted and non-nil.
func allMachineNames(machines []Machine) []string {
	out := make([]string, 0, len(machines))
	for _, mc := range machines {
		out = append(out, mc.Name)
	}
	slices.Sort(out)
	return out
}

// healthyIDs returns the IDs of the healthy, started members, sorted.
func healthyIDs(members []Member) []uint64 {
	ids := []uint64{}
	for _, m := range members {
		if m.Healthy && m.Started() {
			ids = append(ids, m.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

func sortedDomains(fds []string) []string {
	out := append([]string{}, fds...)
	slices.Sort(out)
	return out
}

// memberIDs returns the IDs of members (sorted by ID) and of the learners
// among them, both non-nil.
func memberIDs(members []Member) (ids, learners []uint64) {
	ids, learners = []uint64{}, []uint64{}
	for _, m := range members {
		ids = append(ids, m.ID)
		if m.Learner {
			learners = append(learners, m.ID)
		}
	}
	return ids, learners
}

func idList(ids []uint64) string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		out = append(out, idString(id))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// Destructive reports whether the step can reduce etcd's fault tolerance:
// removing a voter, or deleting a machine that hosts one. I7 forbids these
// while the cluster has lost more members than it tolerates.
func (d Decision) Destructive(s State) bool { return newView(s).destructive(d) }

func (v view) destructive(d Decision) bool {
	switch d.Kind {
	case RemoveMember:
		m, ok := v.member(d.MemberID)
		return ok && m.Voter()
	case DeleteMachine:
		m, ok := v.memberOn(d.Machine)
		return ok && m.Voter()
	}
	return false
}

// authorityUpdate is what a SetAuthority step gives its machine.
func (d Decision) authorityUpdate() AuthorityUpdate {
	if d.RestartsMember {
		return AuthorityTrust
	}
	return AuthorityLeaves
}

// String renders the decision for logs and status.
func (d Decision) String() string {
	var target string
	switch d.Kind {
	case CreateMachine:
		target = fmt.Sprintf("(fd=%q)", d.FailureDomain)
	case AddLearner:
		target = fmt.Sprintf("(%s %s)", d.Machine, d.PeerURL)
	case Promote, MoveLeader, RemoveMember, Defragment, Snapshot:
		target = fmt.Sprintf("(%x on %s)", d.MemberID, orNone(d.Machine))
	case Recover:
		target = fmt.Sprintf("(from %x on %s, revision %d)", d.MemberID, d.Machine, d.Revision)
	case RestoreFromBackup:
		target = fmt.Sprintf("(snapshot %s)", d.Snapshot)
	case RestartMember:
		target = fmt.Sprintf("(%x on %s, quota %d)", d.MemberID, orNone(d.Machine), d.QuotaBackendBytes)
	case DisarmAlarm:
		target = fmt.Sprintf("(%s of %x)", d.Alarm, d.MemberID)
	case Compact:
		target = fmt.Sprintf("(to %d)", d.Revision)
	case AddHook, RemoveHook, DeleteMachine, RenewCertificates:
		target = fmt.Sprintf("(%s)", d.Machine)
	case SetAuthority:
		target = fmt.Sprintf("(%s, restarts member %v)", d.Machine, d.RestartsMember)
	}
	return fmt.Sprintf("%s%s: %s", d.Kind, target, d.Reason)
}

func orNone(s string) string {
	if s == "" {
		return "no machine"
	}
	return s
}

func waitf(format string, args ...any) Decision {
	return Decision{Kind: Wait, Reason: fmt.Sprintf(format, args...)}
}

func degradedf(format string, args ...any) Decision {
	return Decision{Kind: Degraded, Reason: fmt.Sprintf(format, args...)}
}
