package engine

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	qcpmetrics "github.com/qcp-dev/qcp/internal/metrics"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// Metrics of one kind of owner, served on qcp-manager's metrics endpoint
// next to controller-runtime's own: qcp_controlplane_* for
// QuorumControlPlanes, qcp_etcdcluster_* for EtcdClusters.
type Metrics struct {
	reconciles      *prometheus.CounterVec
	decisions       *prometheus.CounterVec
	membershipSteps *prometheus.HistogramVec
	members         *prometheus.GaugeVec
	reaction        *prometheus.SummaryVec
	// The database and revision of each member that answered its status
	// request, exact where status rounds (EtcdMemberStatus.Database).
	dbSize, dbSizeInUse, dbSizeQuota, revision *prometheus.GaugeVec
	// certificateExpiry is status.certificates: when the first certificate
	// of each kind expires.
	certificateExpiry *prometheus.GaugeVec
	// The backups: when the last one succeeded, how long it took and how
	// big it was, and the failed attempts.
	backupLastSuccess, backupDuration, backupSize *prometheus.GaugeVec
	backupFailures                                *prometheus.CounterVec
	// invariantViolations counts the steps that broke a safety invariant
	// (Stepper.CheckTaken).
	invariantViolations *prometheus.CounterVec
}

// NewMetrics returns the metrics named prefix_*, for owners of kind (for
// the help texts), registered with controller-runtime's registry; a
// collector another Setup in the same process registered first is reused.
func NewMetrics(prefix, kind string) *Metrics {
	return (&Metrics{
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_reconciles_total",
			Help: "Reconciles of " + kind + "s, by outcome (success or error).",
		}, []string{"namespace", "name", "outcome"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_steps_total",
			Help: "Steps the quorum engine decided and the controller took, by kind and outcome (success or error).",
		}, []string{"namespace", "name", "kind", "outcome"}),
		membershipSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    prefix + "_membership_step_duration_seconds",
			Help:    "Duration of etcd membership steps: learner added to promoted (promote), leadership transfer (move_leader), member removal (remove).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300},
		}, []string{"namespace", "name", "step"}),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_etcd_members",
			Help: "etcd members of a " + kind + " as last observed, by role (voter or learner).",
		}, []string{"namespace", "name", "role"}),
		reaction: prometheus.NewSummaryVec(prometheus.SummaryOpts{
			Name:       prefix + "_reaction_latency_seconds",
			Help:       "Time from the latest observable change (a machine's or Node's condition turning, or the previous step finishing) to the controller starting its next step.",
			Objectives: map[float64]float64{0.5: 0.01, 0.9: 0.01, 0.99: 0.001},
			MaxAge:     time.Hour,
		}, []string{"namespace", "name"}),
		dbSize: memberGauge(prefix+"_etcd_db_size_bytes",
			"Size of each etcd member's backend database file, from the member's status in the latest observation; absent while the member does not answer."),
		dbSizeInUse: memberGauge(prefix+"_etcd_db_size_in_use_bytes",
			"The part of each etcd member's backend database that holds data; the rest is free pages that only defragmentation gives back."),
		dbSizeQuota: memberGauge(prefix+"_etcd_db_quota_bytes",
			"The backend quota each etcd member runs with: as it reports it (etcd 3.6 and later), else as QCP configured it; absent when the quota is off."),
		revision: memberGauge(prefix+"_etcd_revision",
			"Each etcd member's key-value store revision, from the member's status in the latest observation; absent while the member does not answer."),
		certificateExpiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_certificate_expiry_timestamp_seconds",
			Help: "When the first certificate of each kind a " + kind + " runs on expires, in seconds since the epoch (status.certificates).",
		}, []string{"namespace", "name", "kind"}),
		backupLastSuccess: ownerGauge(prefix+"_backup_last_success_timestamp_seconds",
			"When the newest verified etcd snapshot of a "+kind+" was started, in seconds since the epoch."),
		backupDuration: ownerGauge(prefix+"_backup_duration_seconds",
			"How long the newest verified etcd snapshot took: streaming, storing and verifying by a scratch restore."),
		backupSize: ownerGauge(prefix+"_backup_size_bytes",
			"The stored size of the newest verified etcd snapshot."),
		backupFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_backup_failures_total",
			Help: "Etcd snapshots of a " + kind + " that failed to be taken, stored or verified.",
		}, []string{"namespace", "name"}),
		invariantViolations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_invariant_violations_total",
			Help: "Steps taken for a " + kind + " that broke a safety invariant (I1–I9), judged against the observation they were planned on and the next one: a bug in QCP, which an InvariantViolated event describes.",
		}, []string{"namespace", "name"}),
	}).register()
}

func (m *Metrics) register() *Metrics {
	m.reconciles = qcpmetrics.RegisterOrReuse(m.reconciles)
	m.decisions = qcpmetrics.RegisterOrReuse(m.decisions)
	m.membershipSteps = qcpmetrics.RegisterOrReuse(m.membershipSteps)
	m.members = qcpmetrics.RegisterOrReuse(m.members)
	m.reaction = qcpmetrics.RegisterOrReuse(m.reaction)
	m.dbSize = qcpmetrics.RegisterOrReuse(m.dbSize)
	m.backupLastSuccess = qcpmetrics.RegisterOrReuse(m.backupLastSuccess)
	m.backupDuration = qcpmetrics.RegisterOrReuse(m.backupDuration)
	m.backupSize = qcpmetrics.RegisterOrReuse(m.backupSize)
	m.backupFailures = qcpmetrics.RegisterOrReuse(m.backupFailures)
	m.invariantViolations = qcpmetrics.RegisterOrReuse(m.invariantViolations)
	m.dbSizeInUse = qcpmetrics.RegisterOrReuse(m.dbSizeInUse)
	m.dbSizeQuota = qcpmetrics.RegisterOrReuse(m.dbSizeQuota)
	m.revision = qcpmetrics.RegisterOrReuse(m.revision)
	m.certificateExpiry = qcpmetrics.RegisterOrReuse(m.certificateExpiry)
	return m
}

// ObserveReconcile counts a reconcile of namespace/name.
func (m *Metrics) ObserveReconcile(namespace, name string, err error, _ time.Duration) {
	m.reconciles.WithLabelValues(namespace, name, outcome(err)).Inc()
}

// ObserveDecision counts a step of owner and times it: its reaction latency
// from trigger to start, and for membership steps how long they took.
func (m *Metrics) ObserveDecision(owner client.Object, d quorum.Decision, err error, trigger, start, end time.Time, learnerAdded time.Time) {
	m.decisions.WithLabelValues(owner.GetNamespace(), owner.GetName(), string(d.Kind), outcome(err)).Inc()
	if err != nil {
		return
	}
	if !trigger.IsZero() && !start.Before(trigger) {
		m.reaction.WithLabelValues(owner.GetNamespace(), owner.GetName()).Observe(start.Sub(trigger).Seconds())
	}
	switch d.Kind {
	case quorum.Promote:
		if !learnerAdded.IsZero() {
			m.membershipSteps.WithLabelValues(owner.GetNamespace(), owner.GetName(), "promote").Observe(end.Sub(learnerAdded).Seconds())
		}
	case quorum.MoveLeader:
		m.membershipSteps.WithLabelValues(owner.GetNamespace(), owner.GetName(), "move_leader").Observe(end.Sub(start).Seconds())
	case quorum.RemoveMember:
		m.membershipSteps.WithLabelValues(owner.GetNamespace(), owner.GetName(), "remove").Observe(end.Sub(start).Seconds())
	}
}

// ObserveCertificates sets owner's certificate expiry gauges from its
// status.certificates, anew each time, so that a kind no longer reported
// goes.
func (m *Metrics) ObserveCertificates(owner client.Object, expiries []controlplanev1.CertificateExpiry) {
	m.certificateExpiry.DeletePartialMatch(prometheus.Labels{"namespace": owner.GetNamespace(), "name": owner.GetName()})
	for _, e := range expiries {
		m.certificateExpiry.WithLabelValues(owner.GetNamespace(), owner.GetName(), string(e.Kind)).Set(float64(e.NotAfter.Unix()))
	}
}

// memberGauge is a gauge by member: the owner, and the member's ID in
// hexadecimal as status.etcd.members gives it.
func ownerGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"namespace", "name"})
}

// backupSucceeded records a verified snapshot of owner that took took.
func (m *Metrics) backupSucceeded(owner client.Object, man backup.Manifest, took time.Duration) {
	if m == nil {
		return
	}
	ns, name := owner.GetNamespace(), owner.GetName()
	m.backupLastSuccess.WithLabelValues(ns, name).Set(float64(man.Started.Unix()))
	m.backupDuration.WithLabelValues(ns, name).Set(took.Seconds())
	m.backupSize.WithLabelValues(ns, name).Set(float64(man.Size))
}

// invariantViolated counts a step of owner that broke an invariant.
func (m *Metrics) invariantViolated(owner client.Object) {
	if m == nil {
		return
	}
	m.invariantViolations.WithLabelValues(owner.GetNamespace(), owner.GetName()).Inc()
}

// backupFailed counts a failed snapshot of owner.
func (m *Metrics) backupFailed(owner client.Object) {
	if m == nil {
		return
	}
	m.backupFailures.WithLabelValues(owner.GetNamespace(), owner.GetName()).Inc()
}

func memberGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"namespace", "name", "member"})
}

// ObserveState sets owner's member gauges from an observation. The
// per-member series are set anew each time, so that a removed member's
// go with it.
func (m *Metrics) ObserveState(owner client.Object, obs *Observation) {
	if obs.MembersErr != nil {
		return
	}
	ownerLabels := prometheus.Labels{"namespace": owner.GetNamespace(), "name": owner.GetName()}
	perMember := []*prometheus.GaugeVec{m.dbSize, m.dbSizeInUse, m.dbSizeQuota, m.revision}
	for _, g := range perMember {
		g.DeletePartialMatch(ownerLabels)
	}
	for _, mb := range obs.Members {
		db := databaseStatus(mb, obs.State.QuotaBackendBytes)
		if db == nil {
			continue // it did not answer
		}
		id := FormatMemberID(mb.ID)
		m.dbSize.WithLabelValues(owner.GetNamespace(), owner.GetName(), id).Set(float64(mb.DBSize))
		m.dbSizeInUse.WithLabelValues(owner.GetNamespace(), owner.GetName(), id).Set(float64(mb.DBSizeInUse))
		if db.Quota != nil {
			m.dbSizeQuota.WithLabelValues(owner.GetNamespace(), owner.GetName(), id).Set(float64(db.Quota.Value()))
		}
		m.revision.WithLabelValues(owner.GetNamespace(), owner.GetName(), id).Set(float64(mb.Revision))
	}
	voters, learners := 0, 0
	for _, mb := range obs.Members {
		if mb.Learner {
			learners++
		} else {
			voters++
		}
	}
	m.members.WithLabelValues(owner.GetNamespace(), owner.GetName(), "voter").Set(float64(voters))
	m.members.WithLabelValues(owner.GetNamespace(), owner.GetName(), "learner").Set(float64(learners))
}

func outcome(err error) string {
	if err != nil {
		return "error"
	}
	return "success"
}
