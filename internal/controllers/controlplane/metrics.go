package controlplane

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	qcpmetrics "github.com/qcp-dev/qcp/internal/metrics"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// metrics of the control plane provider, served on qcp-manager's metrics
// endpoint next to controller-runtime's own.
type metrics struct {
	reconciles      *prometheus.CounterVec
	decisions       *prometheus.CounterVec
	membershipSteps *prometheus.HistogramVec
	members         *prometheus.GaugeVec
	reaction        *prometheus.SummaryVec
}

func newMetrics() *metrics {
	return &metrics{
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "qcp_controlplane_reconciles_total",
			Help: "Reconciles of QuorumControlPlanes, by outcome (success or error).",
		}, []string{"namespace", "name", "outcome"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "qcp_controlplane_steps_total",
			Help: "Steps the quorum engine decided and the controller took, by kind and outcome (success or error).",
		}, []string{"namespace", "name", "kind", "outcome"}),
		membershipSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "qcp_controlplane_membership_step_duration_seconds",
			Help:    "Duration of etcd membership steps: learner added to promoted (promote), leadership transfer (move_leader), member removal (remove).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300},
		}, []string{"namespace", "name", "step"}),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "qcp_controlplane_etcd_members",
			Help: "etcd members of a control plane as last observed, by role (voter or learner).",
		}, []string{"namespace", "name", "role"}),
		reaction: prometheus.NewSummaryVec(prometheus.SummaryOpts{
			Name:       "qcp_controlplane_reaction_latency_seconds",
			Help:       "Time from the latest observable change (a machine's or Node's condition turning, or the previous step finishing) to the controller starting its next step.",
			Objectives: map[float64]float64{0.5: 0.01, 0.9: 0.01, 0.99: 0.001},
			MaxAge:     time.Hour,
		}, []string{"namespace", "name"}),
	}
}

// register adds the metrics to controller-runtime's registry, reusing
// collectors another Setup in the same process registered first.
func (m *metrics) register() *metrics {
	m.reconciles = qcpmetrics.RegisterOrReuse(m.reconciles)
	m.decisions = qcpmetrics.RegisterOrReuse(m.decisions)
	m.membershipSteps = qcpmetrics.RegisterOrReuse(m.membershipSteps)
	m.members = qcpmetrics.RegisterOrReuse(m.members)
	m.reaction = qcpmetrics.RegisterOrReuse(m.reaction)
	return m
}

func (m *metrics) observeReconcile(namespace, name string, err error, _ time.Duration) {
	m.reconciles.WithLabelValues(namespace, name, outcome(err)).Inc()
}

// observeDecision counts a step and times it: its reaction latency from
// trigger to start, and for membership steps how long they took.
func (m *metrics) observeDecision(cp *controlplanev1.QuorumControlPlane, d quorum.Decision, err error, trigger, start, end time.Time, learnerAdded time.Time) {
	m.decisions.WithLabelValues(cp.Namespace, cp.Name, string(d.Kind), outcome(err)).Inc()
	if err != nil {
		return
	}
	if !trigger.IsZero() && !start.Before(trigger) {
		m.reaction.WithLabelValues(cp.Namespace, cp.Name).Observe(start.Sub(trigger).Seconds())
	}
	switch d.Kind {
	case quorum.Promote:
		if !learnerAdded.IsZero() {
			m.membershipSteps.WithLabelValues(cp.Namespace, cp.Name, "promote").Observe(end.Sub(learnerAdded).Seconds())
		}
	case quorum.MoveLeader:
		m.membershipSteps.WithLabelValues(cp.Namespace, cp.Name, "move_leader").Observe(end.Sub(start).Seconds())
	case quorum.RemoveMember:
		m.membershipSteps.WithLabelValues(cp.Namespace, cp.Name, "remove").Observe(end.Sub(start).Seconds())
	}
}

// observeState sets the member gauges from an observation.
func (m *metrics) observeState(cp *controlplanev1.QuorumControlPlane, obs *observation) {
	if obs.membersErr != nil {
		return
	}
	voters, learners := 0, 0
	for _, mb := range obs.members {
		if mb.Learner {
			learners++
		} else {
			voters++
		}
	}
	m.members.WithLabelValues(cp.Namespace, cp.Name, "voter").Set(float64(voters))
	m.members.WithLabelValues(cp.Namespace, cp.Name, "learner").Set(float64(learners))
}

func outcome(err error) string {
	if err != nil {
		return "error"
	}
	return "success"
}
