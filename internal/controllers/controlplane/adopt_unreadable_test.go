package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// testAdoptedMachineWithUnreadableEtcdIsKept is issue 28's controller hole
// 4: a QuorumControlPlane adopts the one control plane Machine of a cluster
// whose etcd QCP cannot read (a migration from KCP where the manager
// reaches only the API server's port). The machine carries none of QCP's
// records, and QCP has never seen a member; the planner must still take
// its etcd for bootstrapped, and say that it cannot see the membership
// rather than delete the machine, and its etcd data with it: after the
// learner start timeout has passed, and when a health check marks it.
// Each round is the controller's own (reconcileNormal on a real management
// cluster, the control plane read back from the API server every time), so
// a DeleteMachine it planned would really be taken.
func testAdoptedMachineWithUnreadableEtcdIsKept(t *testing.T, env *localenv.Env) {
	for i, tc := range []struct {
		name    string
		changes []func(*adoptWorld)
	}{
		{"after the learner start timeout", []func(*adoptWorld){(*adoptWorld).pastLearnerStartTimeout}},
		{"marked by a health check", []func(*adoptWorld){(*adoptWorld).markByHealthCheck, (*adoptWorld).pastLearnerStartTimeout}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ctx = log.IntoContext(ctx, testr.New(t))
			w := newAdoptWorld(ctx, t, env, fmt.Sprintf("adopt-blind-%d", i), net.IPv4(127, 0, 250, byte(10+i)))
			w.round(ctx) // adopts the machine
			if owner := metav1.GetControllerOf(w.machine(ctx)); owner == nil || owner.Kind != "QuorumControlPlane" || owner.Name != w.name {
				t.Fatalf("machine %s's controller is %+v after a round, want QuorumControlPlane %s", w.name, owner, w.name)
			}
			for _, change := range tc.changes {
				change(w)
				w.round(ctx)
			}
		})
	}
}

// adoptWorld is one cluster on the management cluster: paused, so that
// CAPI core leaves it and its Machine alone, with a control plane and an
// orphan control plane Machine whose address only hangs up on etcd
// clients.
type adoptWorld struct {
	t    *testing.T
	c    client.Client
	name string
	r    *Reconciler
	// live counts the round's live lists of Machines.
	live *machineLists

	mu  sync.Mutex
	now time.Time
}

const adoptLearnerStartTimeout = time.Minute

func newAdoptWorld(ctx context.Context, t *testing.T, env *localenv.Env, name string, ip net.IP) *adoptWorld {
	t.Helper()
	w := &adoptWorld{t: t, c: env.Client, name: name, now: time.Now()}
	hangUpOn(t, net.JoinHostPort(ip.String(), "2379"))

	createPausedControlPlane(ctx, t, w.c, name, ip.String(), 1)
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{clusterv1.PausedAnnotation: ""},
			Labels: map[string]string{clusterv1.ClusterNameLabel: name, clusterv1.MachineControlPlaneLabel: ""}},
		Spec: clusterv1.MachineSpec{
			ClusterName: name, Version: "v1.36.3", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(name + "-bootstrap")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "ProcessMachine", Name: name},
		},
	}
	w.create(ctx, m)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := w.machine(ctx)
		m.Status.Addresses = clusterv1.MachineAddresses{{Type: clusterv1.MachineInternalIP, Address: ip.String()}}
		return w.c.Status().Update(ctx, m)
	}); err != nil {
		t.Fatal(err)
	}
	// CAPI core writes the machine's Paused condition once it sees it. A
	// write between the round's live list and its adoption patch makes the
	// patch's optimistic lock fail, and the round with it: in a manager the
	// next round would adopt, here the test's round must. Let CAPI core
	// have its say first; the condition does not change after that.
	if err := testkit.Eventually(ctx, 100*time.Millisecond, "CAPI core marking machine "+name+" Paused", func(ctx context.Context) error {
		m := &clusterv1.Machine{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, m); err != nil {
			return err
		}
		if !conditions.IsTrue(m, clusterv1.PausedCondition) {
			return fmt.Errorf("machine %s has no Paused condition True yet", name)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	pool := etcd.NewPool()
	t.Cleanup(func() { _ = pool.Close() })
	w.live = &machineLists{Reader: env.Client}
	w.r = &Reconciler{Client: env.Client, APIReader: w.live, Etcd: pool, Recorder: record.NewFakeRecorder(1000),
		Tunables: quorum.Tunables{LearnerStartTimeout: adoptLearnerStartTimeout}, Now: w.clock}
	w.r.init()
	return w
}

func (w *adoptWorld) clock() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

func (w *adoptWorld) create(ctx context.Context, o client.Object) {
	w.t.Helper()
	if err := w.c.Create(ctx, o); err != nil {
		w.t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
}

func (w *adoptWorld) machine(ctx context.Context) *clusterv1.Machine {
	w.t.Helper()
	m := &clusterv1.Machine{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: w.name}, m); err != nil {
		w.t.Fatalf("machine %s: %v", w.name, err)
	}
	return m
}

// round is one reconcile of the control plane, read afresh from the API
// server as the controller reads it: what keeps the machine must be
// persisted, not held in memory. The plan must be Degraded, for the
// membership QCP cannot see, and the machine must still be there.
func (w *adoptWorld) round(ctx context.Context) {
	w.t.Helper()
	cluster, cp := &clusterv1.Cluster{}, &controlplanev1.QuorumControlPlane{}
	key := client.ObjectKey{Namespace: "default", Name: w.name}
	if err := errors.Join(w.c.Get(ctx, key, cluster), w.c.Get(ctx, key, cp)); err != nil {
		w.t.Fatal(err)
	}
	w.live.n.Store(0)
	if _, err := w.r.reconcileNormal(ctx, cluster, cp, w.clock()); err != nil {
		w.t.Fatalf("reconciling at %s: %v", w.clock().Format(time.RFC3339), err)
	}
	// The adoption's live list serves the observation: a round that takes
	// no step reads the Machines once, the first round, which adopts,
	// included.
	if n := w.live.n.Load(); n != 1 {
		w.t.Errorf("the round listed Machines live %d times, want once", n)
	}
	last := cp.Status.LastOperation
	if last.Kind == controlplanev1.OperationDeleteMachine {
		w.t.Errorf("the planner deleted the adopted machine whose etcd it cannot read: %s", last.Reason)
	}
	if last.Kind != controlplanev1.OperationDegraded || !strings.Contains(last.Reason, "see the membership") {
		w.t.Errorf("decision %s (%s), want Degraded until QCP can see the membership", last.Kind, last.Reason)
	}
	if m := w.machine(ctx); !m.DeletionTimestamp.IsZero() {
		w.t.Fatalf("the adopted machine %s is being deleted", w.name)
	}
}

// machineLists is a live reader that counts its lists of Machines.
type machineLists struct {
	client.Reader
	n atomic.Int32
}

func (l *machineLists) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*clusterv1.MachineList); ok {
		l.n.Add(1)
	}
	return l.Reader.List(ctx, list, opts...)
}

// pastLearnerStartTimeout moves the clock past the time the planner gives
// a first machine to bootstrap etcd.
func (w *adoptWorld) pastLearnerStartTimeout() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.now = w.now.Add(2 * adoptLearnerStartTimeout)
}

// markByHealthCheck marks the machine as CAPI's MachineHealthCheck does.
func (w *adoptWorld) markByHealthCheck() {
	w.t.Helper()
	ctx := context.Background()
	// CAPI core writes the machine's Paused condition meanwhile.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := w.machine(ctx)
		conditions.Set(m, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
			Reason: clusterv1.MachineHealthCheckNodeStartupTimeoutReason, Message: "Node failed to report startup"})
		conditions.Set(m, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse,
			Reason: clusterv1.MachineOwnerRemediatedWaitingForRemediationReason, Message: "Waiting for remediation"})
		return w.c.Status().Update(ctx, m)
	}); err != nil {
		w.t.Fatal(err)
	}
}

// hangUpOn listens on addr and closes every connection at once: an etcd
// endpoint that nothing answers on, held for the test so that no other
// process can take the address meanwhile.
func hangUpOn(t *testing.T, addr string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_ = conn.Close()
		}
	}()
}
