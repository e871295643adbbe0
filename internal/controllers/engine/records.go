// Package engine is what the QuorumControlPlane and EtcdCluster controllers
// share: the records the quorum planner needs kept on each machine, the
// executor that takes the planner's membership steps, and the bookkeeping
// of a reconciler built as observe → plan → verify → act.
package engine

import (
	"github.com/qcp-dev/qcp/internal/agent"
	"strconv"
	"strings"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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
	// DefragStartedAnnotation is written right before the machine's member
	// is defragmented and removed once it is done (RFC 3339). Left behind,
	// by a restart or a failed call, it still counts as a defragmentation
	// started then.
	DefragStartedAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-defrag-started"
	// DefragmentedAnnotation is when the machine's member was last
	// defragmented to the end (RFC 3339).
	DefragmentedAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-defragmented"
	// RestartStartedAnnotation is written right before the machine's agent
	// is asked to restart its etcd with new settings, and removed once the
	// member answers again (RFC 3339). Left behind, it counts as a restart
	// in flight until the planner's RestartTimeout.
	RestartStartedAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-restart-started"
	// QuotaAnnotation is the backend quota, in bytes, the machine's etcd
	// was last given: by its bootstrap data, then by each restart. etcd 3.5
	// does not report its quota; this record says it instead.
	QuotaAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-quota-backend-bytes"
	// CertificatesRenewAtAnnotation is when the machine's certificates are
	// due for renewal in place (RFC 3339): the earliest point, over the
	// leaves its agent reported, at which a leaf has lived the renewal
	// fraction of its life. It is written when QCP first reads the
	// machine's certificates and after each renewal.
	CertificatesRenewAtAnnotation = "controlplane.cluster.x-k8s.io/qcp-certificates-renew-at"
	// RenewStartedAnnotation is written right before the machine's agent
	// is asked to renew its certificates, and removed once it has (RFC
	// 3339). Left behind, it counts as a renewal in flight until the
	// planner's RenewTimeout.
	RenewStartedAnnotation = "controlplane.cluster.x-k8s.io/qcp-certificates-renew-started"
	// EtcdClientSerialAnnotation is, on a control plane machine of an
	// external etcd or an EtcdCluster, the serial number (hexadecimal) of
	// the API server's etcd client certificate the machine holds: the one
	// its bootstrap data carried, then the one each renewal delivered. A
	// machine whose serial is not the <cluster>-apiserver-etcd-client
	// Secret's is due for renewal, which delivers the Secret's pair.
	EtcdClientSerialAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-client-serial"
	// EtcdAuthorityAnnotation is, on a machine that runs an etcd member,
	// what its agent last reported of its etcd authorities:
	// "<issuer>/<trusted>", the key identifier of the authority its etcd
	// leaves come from ("mixed" while they come from several) and the
	// sorted key identifiers of those it trusts, comma-separated; "none"
	// on a machine without a member. An etcd CA rotation compares it with
	// its stage's.
	EtcdAuthorityAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-authority"
	// ClusterAuthorityAnnotation is the same of the cluster authorities,
	// on a machine that runs Kubernetes components ("none" elsewhere).
	ClusterAuthorityAnnotation = "controlplane.cluster.x-k8s.io/qcp-cluster-authority"
	// FrontProxyAuthorityAnnotation is the same of the front-proxy
	// authorities, on a machine that runs an API server ("none"
	// elsewhere).
	FrontProxyAuthorityAnnotation = "controlplane.cluster.x-k8s.io/qcp-front-proxy-authority"
	// ServiceAccountAuthorityAnnotation is the same of the service-account
	// keys, on a machine that runs kube-apiserver or
	// kube-controller-manager: "<signing key>/<keys taken>".
	ServiceAccountAuthorityAnnotation = "controlplane.cluster.x-k8s.io/qcp-service-account-authority"
)

// AuthorityAnnotation is the record of the machine's authorities of kind k.
func AuthorityAnnotation(k agent.AuthorityKind) string { return authorityLeaves[k].annotation }

// CompactedAnnotation is, on the owner (a QuorumControlPlane or an
// EtcdCluster), the revision QCP last compacted etcd to and when, as
// "<revision> <RFC 3339>": a NOSPACE recovery compacts only past it.
const CompactedAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-compacted"

// ReadCompaction reads owner's CompactedAnnotation into s; a record that
// does not parse counts as none.
func ReadCompaction(owner client.Object, s *quorum.State) {
	rev, at, ok := strings.Cut(owner.GetAnnotations()[CompactedAnnotation], " ")
	r, err := strconv.ParseInt(rev, 10, 64)
	if !ok || err != nil || ParseTime(at).IsZero() {
		return
	}
	s.CompactedRevision, s.CompactedAt = r, ParseTime(at)
}

// FormatCompaction is CompactedAnnotation's value.
func FormatCompaction(rev int64, at time.Time) string {
	return strconv.FormatInt(rev, 10) + " " + FormatTime(at)
}

// EtcdRoleLabel is the role of the machine's etcd member (leader, voter or
// learner), absent while it hosts none: `kubectl get machines -L` shows
// at a glance what status.etcd.members says in full. It is kept for
// people, never read back.
const EtcdRoleLabel = "controlplane.cluster.x-k8s.io/qcp-etcd-role"

// Records are a machine's annotations as the planner reads them.
type Records struct {
	MemberID       uint64
	JoinStarted    bool
	LearnerAdded   time.Time
	InfraReady     time.Time
	UnhealthySince time.Time
	DefragStarted  time.Time
	Defragmented   time.Time
	RestartStarted time.Time
	// QuotaBackendBytes is QuotaAnnotation; 0 when absent or unreadable.
	QuotaBackendBytes int64
	// CertificatesRenewAt is zero until QCP has read the machine's
	// certificates: the planner renews no machine it knows nothing of.
	CertificatesRenewAt time.Time
	RenewStarted        time.Time
}

// ReadRecords reads obj's records. A record that does not parse counts as
// unknown (zero), which the planner treats as "now": a damaged annotation
// restarts a timeout instead of firing it, and is written again.
func ReadRecords(obj client.Object) Records {
	a := obj.GetAnnotations()
	r := Records{
		LearnerAdded:   ParseTime(a[LearnerAddedAnnotation]),
		InfraReady:     ParseTime(a[InfraReadyAnnotation]),
		UnhealthySince: ParseTime(a[UnhealthySinceAnnotation]),
		DefragStarted:  ParseTime(a[DefragStartedAnnotation]),
		Defragmented:   ParseTime(a[DefragmentedAnnotation]),
		RestartStarted: ParseTime(a[RestartStartedAnnotation]),

		CertificatesRenewAt: ParseTime(a[CertificatesRenewAtAnnotation]),
		RenewStarted:        ParseTime(a[RenewStartedAnnotation]),
	}
	if q, err := strconv.ParseInt(a[QuotaAnnotation], 10, 64); err == nil && q > 0 {
		r.QuotaBackendBytes = q
	}
	_, r.JoinStarted = a[JoinStartedAnnotation]
	if id, err := strconv.ParseUint(a[MemberIDAnnotation], 16, 64); err == nil {
		r.MemberID = id
	}
	return r
}

// Apply copies the records into the planner's view of the machine.
func (r Records) Apply(m *quorum.Machine) {
	m.MemberID, m.JoinStarted, m.InfraReadyAt = r.MemberID, r.JoinStarted, r.InfraReady
	m.DefragStartedAt, m.DefragmentedAt = r.DefragStarted, r.Defragmented
	m.RestartStartedAt, m.QuotaBackendBytes = r.RestartStarted, r.QuotaBackendBytes
	m.CertificatesRenewAt, m.RenewStartedAt = r.CertificatesRenewAt, r.RenewStarted
}

// SetRecord sets one record on obj; the caller writes obj.
func SetRecord(obj client.Object, key, value string) {
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	obj.SetAnnotations(a)
}

func FormatTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func FormatMemberID(id uint64) string { return strconv.FormatUint(id, 16) }

func ParseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// KeepRecords sets the records the planner needs on m: its member's ID
// (found by name, or by peer URL for a learner added just before a crash),
// when its infrastructure became ready, when its learner was added (if
// the add was never recorded), and since when its member has been down;
// and EtcdRoleLabel. The caller writes m.
func KeepRecords(m *clusterv1.Machine, obs *Observation, now time.Time) {
	r := ReadRecords(m)
	if r.InfraReady.IsZero() && PeerURL(m) != "" {
		SetRecord(m, InfraReadyAnnotation, FormatTime(now))
	}
	if obs.MembersErr != nil {
		return
	}
	mb, ok := obs.MemberOn(m)
	setRoleLabel(m, mb, ok)
	if !ok {
		return
	}
	if r.MemberID != mb.ID {
		SetRecord(m, MemberIDAnnotation, FormatMemberID(mb.ID))
	}
	if mb.Learner && r.LearnerAdded.IsZero() {
		SetRecord(m, LearnerAddedAnnotation, FormatTime(now))
	}
	switch {
	case !mb.Healthy && r.UnhealthySince.IsZero():
		SetRecord(m, UnhealthySinceAnnotation, FormatTime(now))
	case mb.Healthy && !r.UnhealthySince.IsZero():
		delete(m.Annotations, UnhealthySinceAnnotation)
	}
}

// setRoleLabel keeps EtcdRoleLabel on the role of m's member.
func setRoleLabel(m *clusterv1.Machine, mb quorum.Member, hasMember bool) {
	if !hasMember {
		delete(m.Labels, EtcdRoleLabel)
		return
	}
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	m.Labels[EtcdRoleLabel] = strings.ToLower(string(MemberRole(mb)))
}
