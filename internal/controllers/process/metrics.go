package process

import (
	"github.com/prometheus/client_golang/prometheus"

	qcpmetrics "github.com/qcp-dev/qcp/internal/metrics"
)

// Metrics of the process provider, served on qcp-manager's metrics endpoint
// next to controller-runtime's own.
type providerMetrics struct {
	machineStarts *prometheus.CounterVec
	machineStops  *prometheus.CounterVec
	machineExits  *prometheus.CounterVec
	lbBackends    *prometheus.GaugeVec
}

func newProviderMetrics() *providerMetrics {
	return &providerMetrics{
		machineStarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "qcp_process_machine_starts_total",
			Help: "Process machines whose agent this manager launched (re-attaching to a running one does not count), by cluster.",
		}, []string{"namespace", "cluster"}),
		machineStops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "qcp_process_machine_stops_total",
			Help: "Process machines stopped and removed because their ProcessMachine was deleted, by cluster.",
		}, []string{"namespace", "cluster"}),
		machineExits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "qcp_process_machine_exits_total",
			Help: "Times a running process machine's agent was found gone (killed or crashed), by cluster.",
		}, []string{"namespace", "cluster"}),
		lbBackends: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "qcp_process_lb_backends",
			Help: "API servers the cluster's load balancer forwards to (before its own readiness probes).",
		}, []string{"namespace", "cluster"}),
	}
}

// register adds the metrics to controller-runtime's registry. When another
// Setup in the same process registered them first, those collectors are used.
func (m *providerMetrics) register() *providerMetrics {
	m.machineStarts = qcpmetrics.RegisterOrReuse(m.machineStarts)
	m.machineStops = qcpmetrics.RegisterOrReuse(m.machineStops)
	m.machineExits = qcpmetrics.RegisterOrReuse(m.machineExits)
	m.lbBackends = qcpmetrics.RegisterOrReuse(m.lbBackends)
	return m
}
