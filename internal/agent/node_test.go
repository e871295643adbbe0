package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestNodeReportsAComponentChangeAtOnce checks, against a real API server,
// that a component condition changes on the Node after the probe round that
// saw it, not at the next status refresh: the refresh here is an hour away.
func TestNodeReportsAComponentChangeAtOnce(t *testing.T) {
	testkit.RequireBinaries(t, "kube", "etcd")
	env := localenv.StartForTest(t, localenv.Options{WithoutCAPI: true})
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	components := []bootstrap.Component{bootstrap.Etcd, bootstrap.KubeAPIServer, bootstrap.KubeScheduler}
	n := agent.NewNodeAgentForTest(cs, "m1", components, time.Hour)
	n.SetHealth(bootstrap.Etcd, true, true)
	n.SetHealth(bootstrap.KubeAPIServer, true, false)
	n.SetHealth(bootstrap.KubeScheduler, true, true)
	done := make(chan struct{})
	go func() { defer close(done); n.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Within 20 s, where an hour-long refresh could only be met by a write
	// on change.
	wantConditions := func(want map[corev1.NodeConditionType]corev1.ConditionStatus) *corev1.Node {
		t.Helper()
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		var node *corev1.Node
		err := testkit.Eventually(wctx, 200*time.Millisecond, "Node m1's component conditions", func(context.Context) error {
			var err error
			if node, err = cs.CoreV1().Nodes().Get(ctx, "m1", metav1.GetOptions{}); err != nil {
				return err
			}
			for typ, status := range want {
				c := agent.NodeCondition(node, typ)
				if c == nil {
					return fmt.Errorf("%s is missing, want %q", typ, status)
				}
				if c.Status != status {
					return fmt.Errorf("%s is %q, want %q", typ, c.Status, status)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return node
	}
	first := wantConditions(map[corev1.NodeConditionType]corev1.ConditionStatus{
		"EtcdHealthy": corev1.ConditionTrue, "APIServerHealthy": corev1.ConditionFalse, "SchedulerHealthy": corev1.ConditionTrue,
	})

	n.SetHealth(bootstrap.KubeAPIServer, true, true)
	wantConditions(map[corev1.NodeConditionType]corev1.ConditionStatus{
		"EtcdHealthy": corev1.ConditionTrue, "APIServerHealthy": corev1.ConditionTrue, "SchedulerHealthy": corev1.ConditionTrue,
	})

	n.SetHealth(bootstrap.KubeScheduler, false, false)
	last := wantConditions(map[corev1.NodeConditionType]corev1.ConditionStatus{
		"EtcdHealthy": corev1.ConditionTrue, "APIServerHealthy": corev1.ConditionTrue, "SchedulerHealthy": corev1.ConditionFalse,
	})
	if c := agent.NodeCondition(last, "SchedulerHealthy"); c.Reason != agent.ReasonNotRunning {
		t.Errorf("SchedulerHealthy reason %q, want %q", c.Reason, agent.ReasonNotRunning)
	}
	// A condition whose status held keeps its transition time.
	if a, b := agent.NodeCondition(first, "EtcdHealthy").LastTransitionTime, agent.NodeCondition(last, "EtcdHealthy").LastTransitionTime; !a.Equal(&b) {
		t.Errorf("EtcdHealthy last transition moved from %s to %s with no change", a, b)
	}
}
