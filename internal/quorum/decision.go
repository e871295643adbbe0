package quorum

import "fmt"

// Kind names the one step a Decision asks the caller to take.
type Kind string

// The steps. How a caller carries each one out is documented on the constant.
const (
	// CreateMachine: create a machine in Decision.FailureDomain with the
	// current spec. If there are no etcd members it bootstraps a new cluster
	// (--initial-cluster-state=new); otherwise it waits to be added as a
	// learner and then joins with --initial-cluster-state=existing.
	CreateMachine Kind = "CreateMachine"
	// AddLearner: MemberAddAsLearner(Decision.PeerURL) for Decision.Machine,
	// and record the time in Member.AddedAt. Retry "unhealthy cluster".
	AddLearner Kind = "AddLearner"
	// Promote: MemberPromote(Decision.MemberID). "member not learner" is
	// success; "not in sync with leader" is retryable.
	Promote Kind = "Promote"
	// MoveLeader: MoveLeader(Decision.MemberID), sent to the current leader.
	MoveLeader Kind = "MoveLeader"
	// RemoveMember: MemberRemove(Decision.MemberID).
	RemoveMember Kind = "RemoveMember"
	// AddHook: add HookAnnotation to Decision.Machine.
	AddHook Kind = "AddHook"
	// RemoveHook: remove HookAnnotation from Decision.Machine.
	RemoveHook Kind = "RemoveHook"
	// DeleteMachine: delete Decision.Machine (its hook, if any, holds the
	// drain until the member is removed).
	DeleteMachine Kind = "DeleteMachine"
	// Wait: nothing to do until the world changes; Reason names what for.
	Wait Kind = "Wait"
	// Degraded: the planner refuses to act and a human is needed; Reason
	// says why and what to do.
	Degraded Kind = "Degraded"
)

// Decision is exactly one next step. Only the fields its Kind names are set.
type Decision struct {
	// Kind is the step.
	Kind Kind
	// FailureDomain is where CreateMachine places the new machine.
	FailureDomain string
	// Machine is the machine AddLearner, AddHook, RemoveHook and
	// DeleteMachine act on; for member steps it names the hosting machine
	// when there is one (for messages).
	Machine string
	// MemberID is the member Promote, RemoveMember act on, and the member
	// MoveLeader hands leadership to.
	MemberID uint64
	// PeerURL is the peer URL AddLearner registers.
	PeerURL string
	// Reason is a sentence for humans: why this step, or what is waited for.
	Reason string
}

// Destructive reports whether the step can reduce etcd's fault tolerance:
// removing a voter, or deleting a machine that hosts one. I7 forbids these
// while the cluster has lost more members than it tolerates.
func (d Decision) Destructive(s State) bool {
	v := newView(s)
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

// String renders the decision for logs and status.
func (d Decision) String() string {
	var target string
	switch d.Kind {
	case CreateMachine:
		target = fmt.Sprintf("(fd=%q)", d.FailureDomain)
	case AddLearner:
		target = fmt.Sprintf("(%s %s)", d.Machine, d.PeerURL)
	case Promote, MoveLeader, RemoveMember:
		target = fmt.Sprintf("(%x on %s)", d.MemberID, orNone(d.Machine))
	case AddHook, RemoveHook, DeleteMachine:
		target = fmt.Sprintf("(%s)", d.Machine)
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
