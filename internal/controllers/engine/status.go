package engine

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

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
		s := controlplanev1.EtcdMemberStatus{ID: FormatMemberID(mb.ID), Name: mb.Name, Role: MemberRole(mb), Healthy: mb.Healthy}
		if mb.Learner {
			s.Revision = mb.Revision // see EtcdMemberStatus.Revision
		}
		s.Database = databaseStatus(mb, obs.State.QuotaBackendBytes)
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

// databaseStatus is mb's database for status, nil if mb did not say: sizes
// in whole mebibytes rounded up (see EtcdMemberStatus.Database), and the
// quota mb reports, else configured (0 unknown, math.MaxInt64 off).
func databaseStatus(mb quorum.Member, configured int64) *controlplanev1.EtcdDatabaseStatus {
	if mb.DBSize <= 0 {
		return nil
	}
	d := &controlplanev1.EtcdDatabaseStatus{Size: mebibytesUp(mb.DBSize), InUse: mebibytesUp(mb.DBSizeInUse)}
	quota := mb.DBSizeQuota
	if quota <= 0 && configured > 0 && configured < math.MaxInt64 {
		quota = configured
	}
	if quota > 0 {
		d.Quota = resource.NewQuantity(quota, resource.BinarySI)
	}
	return d
}

// mebibytesUp is n bytes in whole mebibytes, rounded up.
func mebibytesUp(n int64) resource.Quantity {
	const mi = 1 << 20
	return *resource.NewQuantity((n+mi-1)/mi*mi, resource.BinarySI)
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
	case quorum.DisarmAlarm:
		return d.Alarm + " of " + FormatMemberID(d.MemberID)
	case quorum.Compact:
		return "revision " + strconv.FormatInt(d.Revision, 10)
	case quorum.Promote, quorum.MoveLeader, quorum.RemoveMember, quorum.Defragment, quorum.RestartMember:
		if d.Machine == "" {
			return FormatMemberID(d.MemberID)
		}
		return FormatMemberID(d.MemberID) + " on " + d.Machine
	case quorum.Wait, quorum.Degraded:
		return ""
	case quorum.RestoreFromBackup:
		return "snapshot " + d.Snapshot
	}
	return d.Machine
}

func quoteFD(fd string) string {
	if fd == "" {
		return `""`
	}
	return fd
}

// SetEtcdHealthy sets owner's EtcdClusterHealthy: every member healthy and started, the voters agree on
// the list, no alarm, not even one raised by a member since removed. When
// the planner's decision d is Degraded, its reason (what a human must do,
// such as which quota to raise) ends the message.
func SetEtcdHealthy(owner conditions.Setter, obs *Observation, d quorum.Decision) {
	if obs.MembersErr != nil {
		reason := controlplanev1.EtcdClusterInspectionFailedReason
		if len(obs.Machines) == 0 {
			reason = controlplanev1.EtcdClusterHealthUnknownReason
		}
		conditions.Set(owner, metav1.Condition{Type: controlplanev1.EtcdClusterHealthyCondition, Status: metav1.ConditionUnknown,
			Reason: reason, Message: "Cannot observe etcd: " + obs.MembersErr.Error()})
		return
	}
	var problems []string
	for _, mb := range obs.Members {
		name := memberName(obs, mb)
		switch {
		case !mb.Started():
			problems = append(problems, fmt.Sprintf("* Member %s: added, not started yet", name))
		case !mb.Healthy && answersOnMachine(obs, mb):
			problems = append(problems, fmt.Sprintf("* Member %s: does not answer QCP, but its machine says it answers there (is QCP cut off from the machine?)", name))
		case !mb.Healthy:
			problems = append(problems, fmt.Sprintf("* Member %s: not healthy", name))
		}
		for _, a := range mb.Alarms {
			problems = append(problems, fmt.Sprintf("* Member %s: alarm %s raised", name, a))
		}
	}
	for _, a := range obs.DepartedAlarms {
		problems = append(problems, "* "+DepartedAlarmMessage(a, obs.State.QuotaBackendBytes))
	}
	if len(obs.Members) == 0 {
		problems = append(problems, "* No etcd member yet")
	}
	for _, r := range obs.RefusedMatches() {
		problems = append(problems, "* "+r)
	}
	if len(problems) > 0 && d.Kind == quorum.Degraded {
		problems = append(problems, "* "+d.Reason)
	}
	if len(problems) > 0 {
		conditions.Set(owner, metav1.Condition{Type: controlplanev1.EtcdClusterHealthyCondition, Status: metav1.ConditionFalse,
			Reason: controlplanev1.EtcdClusterNotHealthyReason, Message: strings.Join(problems, "\n")})
		return
	}
	conditions.Set(owner, metav1.Condition{Type: controlplanev1.EtcdClusterHealthyCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.EtcdClusterHealthyReason})
}

// DepartedAlarmMessage names alarm a of a member since removed, what it
// does and who clears it. etcd keeps such an alarm until it is disarmed,
// and no member QCP lists shows it.
func DepartedAlarmMessage(a quorum.Alarm, quota int64) string {
	head := fmt.Sprintf("Member %s, since removed, raised %s", FormatMemberID(a.MemberID), a.Type)
	switch a.Type {
	case "NOSPACE":
		limit := "etcd's backend quota"
		if quota > 0 && quota < math.MaxInt64 {
			limit = fmt.Sprintf("the backend quota (%d bytes)", quota)
		}
		return fmt.Sprintf("%s; etcd refuses writes until it is disarmed, which QCP does once every member's database is below %s", head, limit)
	case "CORRUPT":
		return head + "; some member's data may differ from the others', so QCP adds no member until a person has compared them " +
			"(etcdctl endpoint hashkv --cluster) and disarmed the alarm (etcdctl alarm disarm)"
	}
	return head + "; etcd keeps it until it is disarmed (etcdctl alarm disarm)"
}

func memberName(obs *Observation, mb quorum.Member) string {
	if m := obs.HostOf(mb); m != nil {
		return fmt.Sprintf("%s (machine %s)", FormatMemberID(mb.ID), m.Name)
	}
	return FormatMemberID(mb.ID)
}

// answersOnMachine reports whether the machine hosting mb says that it
// answers there (quorum.Machine.EtcdAnswersOnMachine).
func answersOnMachine(obs *Observation, mb quorum.Member) bool {
	m := obs.HostOf(mb)
	if m == nil {
		return false
	}
	i := slices.IndexFunc(obs.State.Machines, func(pm quorum.Machine) bool { return pm.Name == m.Name })
	return i >= 0 && obs.State.Machines[i].EtcdAnswersOnMachine
}

// SetScaling reports owner's ScalingUp and ScalingDown; while one is under way and
// the planner waits, its message says for what.
func SetScaling(owner conditions.Setter, obs *Observation, desired int, d quorum.Decision) {
	current := 0
	for _, m := range obs.Machines {
		if m.DeletionTimestamp.IsZero() {
			current++
		}
	}
	detail := ""
	if d.Kind == quorum.Wait || d.Kind == quorum.Degraded {
		detail = "; " + d.Reason
	}
	up := metav1.Condition{Type: controlplanev1.ScalingUpCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.NotScalingUpReason}
	down := metav1.Condition{Type: controlplanev1.ScalingDownCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.NotScalingDownReason}
	switch {
	case current < desired:
		up.Status, up.Reason = metav1.ConditionTrue, controlplanev1.ScalingUpReason
		up.Message = fmt.Sprintf("Scaling up from %d to %d replicas%s", current, desired, detail)
	case current > desired:
		down.Status, down.Reason = metav1.ConditionTrue, controlplanev1.ScalingDownReason
		down.Message = fmt.Sprintf("Scaling down from %d to %d replicas%s", current, desired, detail)
	}
	conditions.Set(owner, up)
	conditions.Set(owner, down)
}

// SetRollingOut reports owner's RollingOut: the machines that are not up to date, why, and
// what the rollout waits for; a replacement whose infrastructure is not
// ready (a missing kube binary, for one) shows its infrastructure's
// message, which names the fix.
func SetRollingOut(owner conditions.Setter, obs *Observation, outdatedBy func(*clusterv1.Machine) []string, d quorum.Decision) {
	var outdated, lines []string
	for _, m := range obs.Machines {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		if why := outdatedBy(m); len(why) > 0 {
			outdated = append(outdated, m.Name)
			for _, w := range why {
				if line := "* " + w; !slices.Contains(lines, line) {
					lines = append(lines, line)
				}
			}
		}
		if PeerURL(m) == "" && conditions.IsFalse(m, clusterv1.MachineInfrastructureReadyCondition) {
			lines = append(lines, fmt.Sprintf("* Machine %s: %s", m.Name, conditions.GetMessage(m, clusterv1.MachineInfrastructureReadyCondition)))
		}
	}
	cond := metav1.Condition{Type: controlplanev1.RollingOutCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.NotRollingOutReason}
	rebalancing := quorum.Rebalancing(obs.State)
	switch {
	case len(outdated) == 0 && rebalancing != "":
		cond.Status, cond.Reason = metav1.ConditionTrue, controlplanev1.RebalancingReason
		cond.Message = "Rebalancing failure domains, one machine at a time: " + rebalancing
		if d.Kind == quorum.Wait || d.Kind == quorum.Degraded {
			cond.Message += "\n* " + d.Reason
		}
	case len(outdated) == 0:
	case obs.State.Strategy == quorum.OnDelete:
		cond.Reason = controlplanev1.WaitingForDeleteReason
		cond.Message = fmt.Sprintf("%d not up-to-date replicas (%s) wait to be deleted (strategy OnDelete)\n%s", len(outdated), strings.Join(outdated, ", "), strings.Join(lines, "\n"))
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, controlplanev1.RollingOutReason
		cond.Message = fmt.Sprintf("Rolling out %d not up-to-date replicas (%s)\n%s", len(outdated), strings.Join(outdated, ", "), strings.Join(lines, "\n"))
		if d.Kind == quorum.Wait || d.Kind == quorum.Degraded {
			cond.Message += "\n* " + d.Reason
		}
	}
	conditions.Set(owner, cond)
}

// QuorumMessage is what Available says of an etcd that served a
// linearizable member list. Only a quorum can serve one (etcd confirms
// leadership with a majority first), so etcd is available, whatever the
// voters answered to their status requests: those time out after a
// second, and on a busy host all of them did while etcd went on serving
// writes. The message names that case, and is empty otherwise.
func QuorumMessage(healthy, voters int) string {
	if healthy*2 > voters {
		return ""
	}
	return fmt.Sprintf("etcd served a linearizable member list, though only %d of %d voters answered a status request in time", healthy, voters)
}
