package agent

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// ComponentConditionTypes are the Node conditions the agent sets, one per
// component it runs, so that a control plane provider reads each machine's
// component health through the workload API, as its preflight checks need,
// without reaching into the machine.
var ComponentConditionTypes = map[bootstrap.Component]corev1.NodeConditionType{
	bootstrap.Etcd:                  "EtcdHealthy",
	bootstrap.KubeAPIServer:         "APIServerHealthy",
	bootstrap.KubeControllerManager: "ControllerManagerHealthy",
	bootstrap.KubeScheduler:         "SchedulerHealthy",
}

// IsComponentCondition reports whether t is one of the agent's component
// conditions, for readers that check them all.
func IsComponentCondition(t corev1.NodeConditionType) bool {
	for _, c := range ComponentConditionTypes {
		if c == t {
			return true
		}
	}
	return false
}

// Reasons of the component conditions.
const (
	ReasonProbeSucceeded = "ProbeSucceeded"
	ReasonProbeFailed    = "ProbeFailed"
	ReasonNotRunning     = "NotRunning"
)

// kubeletConditions returns the Node's conditions with the ones kubelet
// reports, as a healthy kubelet reports them: Ready, and no memory, disk or
// PID pressure. CAPI core's NodeHealthy (and so the Machine's Ready) waits
// for all four. A condition keeps its last transition time while its status
// holds; every other condition is kept as it is.
func kubeletConditions(existing []corev1.NodeCondition, now metav1.Time) []corev1.NodeCondition {
	want := []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "QCPAgentReady", Message: "qcp-agent is running and heartbeating"},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "qcp-agent reports no memory pressure"},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "qcp-agent reports no disk pressure"},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "qcp-agent reports no PID pressure"},
	}
	out := slices.Clone(existing)
	for _, w := range want {
		w.LastHeartbeatTime, w.LastTransitionTime = now, now
		out = setNodeCondition(out, w)
	}
	return out
}

// setNodeCondition puts cond into conds, in place of the condition of its
// type if there is one, keeping that one's last transition time while the
// status holds.
func setNodeCondition(conds []corev1.NodeCondition, cond corev1.NodeCondition) []corev1.NodeCondition {
	i := conditionIndex(conds, cond.Type)
	if i < 0 {
		return append(conds, cond)
	}
	if conds[i].Status == cond.Status {
		cond.LastTransitionTime = conds[i].LastTransitionTime
	}
	conds[i] = cond
	return conds
}

// NodeCondition returns node's condition of type t, or nil if it has none.
func NodeCondition(node *corev1.Node, t corev1.NodeConditionType) *corev1.NodeCondition {
	if i := conditionIndex(node.Status.Conditions, t); i >= 0 {
		return &node.Status.Conditions[i]
	}
	return nil
}

func conditionIndex(conds []corev1.NodeCondition, t corev1.NodeConditionType) int {
	return slices.IndexFunc(conds, func(c corev1.NodeCondition) bool { return c.Type == t })
}

// componentConditions returns the Node's conditions with one condition per
// component in components, from the supervisor's and the prober's view.
// A condition keeps its last transition time while its status holds; every
// other condition (Ready, and any not the agent's) is kept as it is.
func componentConditions(existing []corev1.NodeCondition, components []bootstrap.Component,
	states map[bootstrap.Component]ComponentState, probes map[bootstrap.Component]Probe, now metav1.Time) []corev1.NodeCondition {
	out := slices.Clone(existing)
	for _, c := range components {
		t, ok := ComponentConditionTypes[c]
		if !ok {
			continue
		}
		cond := corev1.NodeCondition{Type: t, Status: corev1.ConditionTrue, Reason: ReasonProbeSucceeded,
			Message: string(c) + " is running and answers its health check", LastHeartbeatTime: now, LastTransitionTime: now}
		switch st, probe := states[c], probes[c]; {
		case !st.Running:
			cond.Status, cond.Reason = corev1.ConditionFalse, ReasonNotRunning
			cond.Message = string(c) + " is not running" + suffix(st.Waiting, st.LastError)
		case !probe.OK:
			cond.Status, cond.Reason = corev1.ConditionFalse, ReasonProbeFailed
			cond.Message = string(c) + " does not answer its health check" + suffix("", probe.Error)
		}
		out = setNodeCondition(out, cond)
	}
	return out
}

func suffix(waiting, lastErr string) string {
	switch {
	case waiting != "":
		return ": " + waiting
	case lastErr != "":
		return ": " + lastErr
	}
	return ""
}
