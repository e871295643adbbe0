package agent

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qcp-dev/qcp/internal/bootstrap"
)

func TestComponentConditions(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	components := []bootstrap.Component{bootstrap.Etcd, bootstrap.KubeAPIServer, bootstrap.KubeControllerManager, bootstrap.KubeScheduler}
	states := map[bootstrap.Component]ComponentState{
		bootstrap.Etcd: {Running: true}, bootstrap.KubeAPIServer: {Running: true},
		bootstrap.KubeControllerManager: {Running: true}, bootstrap.KubeScheduler: {Running: false, LastError: "exit status 1"},
	}
	probes := map[bootstrap.Component]Probe{
		bootstrap.Etcd: {OK: true}, bootstrap.KubeAPIServer: {OK: false, Error: "connection refused"},
		bootstrap.KubeControllerManager: {OK: true},
	}
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: t0}
	first := componentConditions([]corev1.NodeCondition{ready}, components, states, probes, t0)
	want := map[corev1.NodeConditionType]struct {
		status corev1.ConditionStatus
		reason string
		text   string
	}{
		"EtcdHealthy":              {corev1.ConditionTrue, ReasonProbeSucceeded, "answers its health check"},
		"APIServerHealthy":         {corev1.ConditionFalse, ReasonProbeFailed, "connection refused"},
		"ControllerManagerHealthy": {corev1.ConditionTrue, ReasonProbeSucceeded, "kube-controller-manager is running"},
		"SchedulerHealthy":         {corev1.ConditionFalse, ReasonNotRunning, "kube-scheduler is not running: exit status 1"},
	}
	if len(first) != 5 || first[0].Type != corev1.NodeReady {
		t.Fatalf("conditions %v: want Ready kept first and one per component", first)
	}
	for _, c := range first[1:] {
		w, ok := want[c.Type]
		if !ok || c.Status != w.status || c.Reason != w.reason || !strings.Contains(c.Message, w.text) {
			t.Errorf("%s = %s/%s %q, want %s/%s containing %q", c.Type, c.Status, c.Reason, c.Message, w.status, w.reason, w.text)
		}
	}

	// A minute later the API server answers: only its condition moves.
	probes[bootstrap.KubeAPIServer] = Probe{OK: true}
	second := componentConditions(first, components, states, probes, t1)
	for _, c := range second[1:] {
		moved := c.Type == "APIServerHealthy"
		if got := c.LastTransitionTime.Equal(&t1); got != moved {
			t.Errorf("%s last transition %s; want it to move only for the condition whose status changed", c.Type, c.LastTransitionTime)
		}
	}

	// An etcd-only machine gets only its etcd condition.
	if got := componentConditions(nil, []bootstrap.Component{bootstrap.Etcd}, states, probes, t0); len(got) != 1 || got[0].Type != "EtcdHealthy" {
		t.Errorf("etcd-only machine conditions %v", got)
	}
}

// TestKubeletConditions: the agent reports what CAPI core's NodeHealthy
// waits for (Ready, and no memory, disk or PID pressure), keeps each
// transition time while the status holds, and keeps other conditions.
func TestKubeletConditions(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	other := corev1.NodeCondition{Type: "EtcdHealthy", Status: corev1.ConditionFalse, LastTransitionTime: t0}
	stale := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: t0}
	first := kubeletConditions([]corev1.NodeCondition{other, stale}, t0)
	second := kubeletConditions(first, t1)
	want := map[corev1.NodeConditionType]corev1.ConditionStatus{
		corev1.NodeReady: corev1.ConditionTrue, corev1.NodeMemoryPressure: corev1.ConditionFalse,
		corev1.NodeDiskPressure: corev1.ConditionFalse, corev1.NodePIDPressure: corev1.ConditionFalse, "EtcdHealthy": corev1.ConditionFalse,
	}
	if len(second) != len(want) {
		t.Fatalf("conditions %v: want %d", second, len(want))
	}
	for _, c := range second {
		if c.Status != want[c.Type] {
			t.Errorf("%s = %s, want %s", c.Type, c.Status, want[c.Type])
		}
		if !c.LastTransitionTime.Equal(&t0) {
			t.Errorf("%s last transition %s, want %s: the status did not change a minute later", c.Type, c.LastTransitionTime, t0)
		}
		if c.Type != "EtcdHealthy" && !c.LastHeartbeatTime.Equal(&t1) {
			t.Errorf("%s heartbeat %s, want %s", c.Type, c.LastHeartbeatTime, t1)
		}
	}
}
