package engine

import (
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// MemberStatuses lists the members by ID, each with its machine and role,
// for an owner's status; nil while the membership is unknown.
func MemberStatuses(obs *Observation) []controlplanev1.EtcdMemberStatus {
	if obs.MembersErr != nil {
		return nil
	}
	var out []controlplanev1.EtcdMemberStatus
	for _, mb := range obs.Members {
		s := controlplanev1.EtcdMemberStatus{ID: FormatMemberID(mb.ID), Name: mb.Name, Role: MemberRole(mb),
			Healthy: mb.Healthy, Revision: mb.Revision}
		for _, m := range obs.Machines {
			if on, ok := obs.MemberOn(m); ok && on.ID == mb.ID {
				s.Machine = m.Name
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// MemberRole is mb's part in raft, as status shows it.
func MemberRole(mb quorum.Member) controlplanev1.EtcdMemberRole {
	switch {
	case mb.Learner:
		return controlplanev1.EtcdMemberRoleLearner
	case mb.Leader:
		return controlplanev1.EtcdMemberRoleLeader
	}
	return controlplanev1.EtcdMemberRoleVoter
}

// RecordDecision keeps last on the latest decision: a Wait or Degraded
// that repeats keeps its start time, so that it says since when the owner
// has been waiting.
func RecordDecision(last *controlplanev1.LastOperation, d quorum.Decision, now time.Time) {
	if string(last.Kind) == string(d.Kind) && last.Reason == d.Reason {
		return
	}
	StartOperation(last, d, now)
	if d.Kind == quorum.Wait || d.Kind == quorum.Degraded {
		last.FinishTime = metav1.Time{}
	}
}

// StartOperation records in last that step d started at now.
func StartOperation(last *controlplanev1.LastOperation, d quorum.Decision, now time.Time) {
	*last = controlplanev1.LastOperation{Kind: controlplanev1.OperationKind(d.Kind), Target: target(d),
		Reason: d.Reason, StartTime: metav1.NewTime(now)}
}

func target(d quorum.Decision) string {
	switch d.Kind {
	case quorum.CreateMachine:
		return "failure domain " + quoteFD(d.FailureDomain)
	case quorum.Promote, quorum.MoveLeader, quorum.RemoveMember:
		if d.Machine == "" {
			return FormatMemberID(d.MemberID)
		}
		return FormatMemberID(d.MemberID) + " on " + d.Machine
	case quorum.Wait, quorum.Degraded:
		return ""
	}
	return d.Machine
}

func quoteFD(fd string) string {
	if fd == "" {
		return `""`
	}
	return fd
}
