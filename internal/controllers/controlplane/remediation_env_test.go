package controlplane

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// testRemediationAgainstRealParts runs the reconciler's rounds (observe,
// tend the machines, plan, act) against a real management cluster with CAPI
// core. The Cluster and its Machines are paused, so that CAPI core and the
// MachineHealthCheck leave the conditions the test writes alone. Each round
// is reconcileNormal on a fresh read of the control plane, without the
// status patch Reconcile defers: as if the manager crashed right after every
// round.
func testRemediationAgainstRealParts(t *testing.T, env *localenv.Env) {
	t.Run("a recovered machine with a stale mark is not remediated", func(t *testing.T) {
		testStaleMarkNotRemediated(t, newRemediationWorld(t, env, "stale"))
	})
	t.Run("a crash right after a remediation step keeps one at a time", func(t *testing.T) {
		testCrashKeepsOneAtATime(t, newRemediationWorld(t, env, "crash"))
	})
}

// testStaleMarkNotRemediated: with no etcd member yet, the bootstrap rule
// deletes a marked machine at once. Of three machines marked, two have
// recovered (their health check passes again, or no longer reports): only
// the third is deleted, and the stale marks are cleared, with an event.
func testStaleMarkNotRemediated(t *testing.T, w *remediationWorld) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recovered := metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionTrue, Reason: clusterv1.MachineHealthCheckSucceededReason}
	w.machine(ctx, "stale-a", markCondition(), recovered)
	w.machine(ctx, "stale-b", markCondition())
	w.machine(ctx, "stale-c", markCondition(), unhealthyCondition())

	w.eventually(ctx, "marked machine stale-c remediated", func(ctx context.Context) error {
		if _, err := w.round(ctx); err != nil {
			return err
		}
		for _, name := range []string{"stale-a", "stale-b"} {
			if m := w.get(ctx, name); m == nil || !m.DeletionTimestamp.IsZero() {
				t.Fatalf("machine %s, whose health check no longer fails, was remediated", name)
			}
		}
		if m := w.get(ctx, "stale-c"); m != nil && m.DeletionTimestamp.IsZero() {
			return fmt.Errorf("machine stale-c is not being deleted")
		}
		return nil
	})
	for _, name := range []string{"stale-a", "stale-b"} {
		if c := conditions.Get(w.get(ctx, name), clusterv1.MachineOwnerRemediatedCondition); c != nil {
			t.Errorf("machine %s keeps its stale mark: %+v", name, c)
		}
		if !w.sawEvent("StaleRemediationMarkCleared", "Machine "+name+" ") {
			t.Errorf("no event says the stale mark of machine %s was cleared; events: %v", name, w.events)
		}
	}
}

// testCrashKeepsOneAtATime: two machines are marked. The first one's
// remediation step is taken and the manager crashes before its deferred
// status patch. The remediation in progress is on the API server anyway,
// so after the restart the second machine waits its turn, even once the
// first is gone: its replacement is not created yet.
func testCrashKeepsOneAtATime(t *testing.T, w *remediationWorld) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w.machine(ctx, "crash-a", markCondition(), unhealthyCondition())
	w.machine(ctx, "crash-b", markCondition(), unhealthyCondition())

	w.eventually(ctx, "the remediation step on crash-a taken", func(ctx context.Context) error {
		if _, err := w.round(ctx); err != nil {
			return err
		}
		if m := w.get(ctx, "crash-a"); m != nil && m.DeletionTimestamp.IsZero() {
			return fmt.Errorf("machine crash-a is not being deleted")
		}
		return nil
	})
	cp := w.controlPlane(ctx)
	rec, ok := readRemediation(cp, RemediationInProgressAnnotation)
	if !ok || rec.Machine != "crash-a" {
		t.Fatalf("after a crash right after the step, QuorumControlPlane %s records remediation %q, want machine crash-a's", cp.Name, cp.Annotations[RemediationInProgressAnnotation])
	}

	// The deleted machine goes (CAPI core, paused, would hold its finalizer).
	w.eventually(ctx, "machine crash-a gone", func(ctx context.Context) error {
		m := w.get(ctx, "crash-a")
		if m == nil {
			return nil
		}
		if len(m.Finalizers) > 0 {
			before := m.DeepCopy()
			m.Finalizers = nil
			if err := w.c.Patch(ctx, m, client.MergeFrom(before)); err != nil {
				return err
			}
		}
		return fmt.Errorf("machine crash-a still exists")
	})

	secrets, err := w.r.ensureSecrets(ctx, w.cluster(ctx), cp, nil)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := w.r.observe(ctx, w.cluster(ctx), cp, secrets, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(obs.State.Machines) != 1 || !obs.State.Machines[0].HoldRemediation || !obs.State.Machines[0].RemediationQueued ||
		!strings.Contains(obs.remediationRefused["crash-b"], "remediation of machine crash-a") {
		t.Fatalf("after the restart, the planner sees %+v, refused %v; want crash-b queued behind crash-a", obs.State.Machines, obs.remediationRefused)
	}
	after, err := w.round(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m := w.get(ctx, "crash-b"); m == nil || !m.DeletionTimestamp.IsZero() {
		t.Fatal("machine crash-b was remediated while crash-a's remediation is unfinished")
	}
	if c := conditions.Get(after, controlplanev1.RemediatingCondition); c == nil || c.Reason != controlplanev1.RemediationBlockedReason ||
		!strings.Contains(c.Message, "waiting for the remediation of machine crash-a") {
		t.Errorf("Remediating %+v, want crash-b blocked behind crash-a", c)
	}
}

// remediationWorld is a paused Cluster with its infrastructure provisioned,
// a QuorumControlPlane of three stacked-etcd replicas, and a Reconciler on
// the real API server.
type remediationWorld struct {
	t      *testing.T
	c      client.Client
	r      *Reconciler
	rec    *record.FakeRecorder
	events []string
	key    client.ObjectKey
}

func newRemediationWorld(t *testing.T, env *localenv.Env, name string) *remediationWorld {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := &remediationWorld{t: t, c: env.Client, rec: record.NewFakeRecorder(1000), key: client.ObjectKey{Namespace: "default", Name: name}}
	createPausedControlPlane(ctx, t, w.c, name, "127.0.0.1", 3)
	w.r = &Reconciler{Client: env.Client, APIReader: env.Client, Etcd: etcd.NewPool(), Recorder: w.rec}
	w.r.init()
	return w
}

// round is one reconcile round on a fresh read of the control plane, with
// no status patch after it; it returns the control plane as the round left
// it in memory.
func (w *remediationWorld) round(ctx context.Context) (*controlplanev1.QuorumControlPlane, error) {
	cp := w.controlPlane(ctx)
	_, err := w.r.reconcileNormal(ctx, w.cluster(ctx), cp, time.Time{})
	return cp, err
}

// machine creates a paused control plane machine owned by the control
// plane, with conds in its status.
func (w *remediationWorld) machine(ctx context.Context, name string, conds ...metav1.Condition) {
	w.t.Helper()
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.key.Namespace,
			Annotations:     map[string]string{clusterv1.PausedAnnotation: ""},
			Labels:          map[string]string{clusterv1.ClusterNameLabel: w.key.Name, clusterv1.MachineControlPlaneLabel: "", clusterv1.MachineControlPlaneNameLabel: w.key.Name},
			OwnerReferences: []metav1.OwnerReference{controlPlaneOwnerRef(w.controlPlane(ctx))}},
		Spec: clusterv1.MachineSpec{
			ClusterName: w.key.Name, Version: "v1.36.3", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(name + "-bootstrap")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachine", Name: name},
		},
	}
	if err := w.c.Create(ctx, m); err != nil {
		w.t.Fatal(err)
	}
	// CAPI core writes the new machine's status too.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := w.get(ctx, name)
		for _, c := range conds {
			conditions.Set(m, c)
		}
		return w.c.Status().Update(ctx, m)
	}); err != nil {
		w.t.Fatal(err)
	}
}

func markCondition() metav1.Condition {
	return metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse, Reason: clusterv1.MachineOwnerRemediatedWaitingForRemediationReason}
}

func unhealthyCondition() metav1.Condition {
	return metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionFalse, Reason: clusterv1.MachineHealthCheckNodeStartupTimeoutReason}
}

// get reads machine name, nil once it is gone.
func (w *remediationWorld) get(ctx context.Context, name string) *clusterv1.Machine {
	w.t.Helper()
	m := &clusterv1.Machine{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: w.key.Namespace, Name: name}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		w.t.Fatal(err)
	}
	return m
}

func (w *remediationWorld) controlPlane(ctx context.Context) *controlplanev1.QuorumControlPlane {
	w.t.Helper()
	cp := &controlplanev1.QuorumControlPlane{}
	if err := w.c.Get(ctx, w.key, cp); err != nil {
		w.t.Fatal(err)
	}
	return cp
}

func (w *remediationWorld) cluster(ctx context.Context) *clusterv1.Cluster {
	w.t.Helper()
	c := &clusterv1.Cluster{}
	if err := w.c.Get(ctx, w.key, c); err != nil {
		w.t.Fatal(err)
	}
	return c
}

// sawEvent reports whether an event with reason and a message containing
// text was recorded.
func (w *remediationWorld) sawEvent(reason, text string) bool {
	for {
		select {
		case e := <-w.rec.Events:
			w.events = append(w.events, e)
			continue
		default:
		}
		break
	}
	for _, e := range w.events {
		if strings.Contains(e, " "+reason+" ") && strings.Contains(e, text) {
			return true
		}
	}
	return false
}

func (w *remediationWorld) eventually(ctx context.Context, what string, cond func(context.Context) error) {
	w.t.Helper()
	if err := testkit.Eventually(ctx, 100*time.Millisecond, what, cond); err != nil {
		w.t.Fatal(err)
	}
}
