package controlplane

import (
	"strconv"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qcp-dev/qcp/internal/quorum"
)

// The records the planner needs its caller to keep (see the package comment
// of internal/quorum), as annotations on each Machine: they live as long as
// the machine, survive a manager restart, and are written with the same
// optimistic lock as the machine's hook.
const (
	// MemberIDAnnotation is the etcd member ID (hex) QCP added, or that
	// bootstrapped, on the machine.
	MemberIDAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-member-id"
	// JoinStartedAnnotation is written before MemberAddAsLearner is called
	// (RFC 3339): a machine that has started joining is never joined again.
	JoinStartedAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-join-started"
	// LearnerAddedAnnotation is when MemberAddAsLearner returned (RFC 3339).
	LearnerAddedAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-learner-added"
	// InfraReadyAnnotation is when QCP first saw the machine's
	// infrastructure ready, with an address (RFC 3339).
	InfraReadyAnnotation = "controlplane.cluster.x-k8s.io/qcp-infrastructure-ready"
	// UnhealthySinceAnnotation is when QCP first saw the machine's member
	// unhealthy (RFC 3339); removed once it is healthy again.
	UnhealthySinceAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-unhealthy-since"
)

// EtcdRoleLabel is the role of the machine's etcd member (leader, voter or
// learner), absent while it hosts none: `kubectl get machines -L` shows
// at a glance what status.etcd.members says in full. It is kept for
// people, never read back.
const EtcdRoleLabel = "controlplane.cluster.x-k8s.io/qcp-etcd-role"

// records are a machine's annotations as the planner reads them.
type records struct {
	memberID       uint64
	joinStarted    bool
	learnerAdded   time.Time
	infraReady     time.Time
	unhealthySince time.Time
}

// readRecords reads obj's records. A record that does not parse counts as
// unknown (zero), which the planner treats as "now": a damaged annotation
// restarts a timeout instead of firing it, and is written again.
func readRecords(obj client.Object) records {
	a := obj.GetAnnotations()
	r := records{
		learnerAdded:   parseTime(a[LearnerAddedAnnotation]),
		infraReady:     parseTime(a[InfraReadyAnnotation]),
		unhealthySince: parseTime(a[UnhealthySinceAnnotation]),
	}
	_, r.joinStarted = a[JoinStartedAnnotation]
	if id, err := strconv.ParseUint(a[MemberIDAnnotation], 16, 64); err == nil {
		r.memberID = id
	}
	return r
}

// apply copies the records into the planner's view of the machine.
func (r records) apply(m *quorum.Machine) {
	m.MemberID, m.JoinStarted, m.InfraReadyAt = r.memberID, r.joinStarted, r.infraReady
}

// setRecord sets one record on obj; the caller writes obj.
func setRecord(obj client.Object, key, value string) {
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	obj.SetAnnotations(a)
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func formatMemberID(id uint64) string { return strconv.FormatUint(id, 16) }

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}
	}
	return t
}
