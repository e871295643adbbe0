package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// actWorld is a real management cluster with CAPI core, Machines paused so
// that CAPI leaves them alone, and a real 3-member etcd cluster with TLS.
type actWorld struct {
	env *localenv.Env
	t   *testing.T
	c   client.Client
	cl  *testkit.EtcdCluster
	ps  []*testkit.EtcdProcess
	cli *etcd.Client
	x   Executor
}

func newActWorld(t *testing.T) *actWorld {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := localenv.StartForTest(t, localenv.Options{})
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "act", 3)
	return &actWorld{env: env, t: t, c: env.Client, cl: cl, ps: ps, cli: cli, x: Executor{Client: env.Client, Etcd: cli, Now: time.Now}}
}

func (w *actWorld) machine(ctx context.Context, name string) *clusterv1.Machine {
	w.t.Helper()
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{clusterv1.PausedAnnotation: ""},
			Labels: map[string]string{clusterv1.ClusterNameLabel: "act", clusterv1.MachineControlPlaneLabel: ""}},
		Spec: clusterv1.MachineSpec{
			ClusterName: "act", Version: "v1.36.3", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(name + "-bootstrap")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "ProcessMachine", Name: name},
		},
	}
	if err := w.c.Create(ctx, m); err != nil {
		w.t.Fatal(err)
	}
	return w.get(ctx, name)
}

func (w *actWorld) get(ctx context.Context, name string) *clusterv1.Machine {
	w.t.Helper()
	var m clusterv1.Machine
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &m); err != nil {
		w.t.Fatal(err)
	}
	return &m
}

// settle executes d on a fresh read of its machine until it applies, as a
// reconciler does on its next rounds: CAPI core may still be writing the
// new Machine, and every such write makes the plan's resourceVersion stale.
func (w *actWorld) settle(ctx context.Context, d quorum.Decision) {
	w.t.Helper()
	if err := testkit.Eventually(ctx, 200*time.Millisecond, string(d.Kind)+" applied", func(ctx context.Context) error {
		var m *clusterv1.Machine
		if d.Machine != "" {
			m = w.get(ctx, d.Machine)
			d.Expect.MachineResourceVersion = m.ResourceVersion
		}
		return w.x.Execute(ctx, d, m)
	}); err != nil {
		w.t.Fatal(err)
	}
}

// TestExecutorAgainstRealParts carries out decisions on real Machines and a
// real etcd cluster, and shows that a decision planned on a machine that
// changed since is refused, not taken.
func TestExecutorAgainstRealParts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newActWorld(t)

	// A hook is not put back on a machine a user deleted after the plan.
	m1 := w.machine(ctx, "act-m1")
	planned := m1.DeepCopy()
	w.settle(ctx, quorum.Decision{Kind: quorum.AddHook, Machine: "act-m1"})
	for _, hook := range quorum.HookAnnotations {
		if _, ok := w.get(ctx, "act-m1").Annotations[hook]; !ok {
			t.Fatalf("AddHook did not put %s on act-m1", hook)
		}
	}
	stale := quorum.Decision{Kind: quorum.RemoveHook, Machine: "act-m1", Expect: quorum.Expectation{MachineResourceVersion: planned.ResourceVersion}}
	if err := w.x.Execute(ctx, stale, planned); err == nil {
		t.Fatal("RemoveHook planned on an older act-m1 was carried out")
	}
	if _, ok := w.get(ctx, "act-m1").Annotations[quorum.HookAnnotation]; !ok {
		t.Fatal("a stale RemoveHook removed the hook")
	}

	// A machine is deleted only as it was planned.
	m2 := w.machine(ctx, "act-m2")
	w.settle(ctx, quorum.Decision{Kind: quorum.AddHook, Machine: "act-m2"})
	err := w.x.Execute(ctx, quorum.Decision{Kind: quorum.DeleteMachine, Machine: "act-m2", Expect: quorum.Expectation{MachineResourceVersion: m2.ResourceVersion}}, m2)
	if !apierrors.IsConflict(err) {
		t.Fatalf("DeleteMachine of act-m2 planned before its hook was added: %v, want a conflict", err)
	}
	if w.get(ctx, "act-m2").DeletionTimestamp != nil {
		t.Fatal("act-m2 is being deleted although the plan was stale")
	}
	w.settle(ctx, quorum.Decision{Kind: quorum.DeleteMachine, Machine: "act-m2"})
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "act-m2 deleting", func(ctx context.Context) error {
		var m clusterv1.Machine
		err := w.c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "act-m2"}, &m)
		if apierrors.IsNotFound(err) || (err == nil && m.DeletionTimestamp != nil) {
			return nil
		}
		return fmt.Errorf("act-m2 not deleting (%v)", err)
	}); err != nil {
		t.Fatal(err)
	}

	// A learner is added with its records, refused without a trace when
	// etcd has no room for it, promoted and removed, each idempotently.
	newcomer, err := w.cl.NewMember("act-new")
	if err != nil {
		t.Fatal(err)
	}
	w.machine(ctx, "act-m3")
	w.settle(ctx, quorum.Decision{Kind: quorum.AddLearner, Machine: "act-m3", PeerURL: newcomer.PeerURL()})
	r := ReadRecords(w.get(ctx, "act-m3"))
	if !r.JoinStarted || r.MemberID == 0 || r.LearnerAdded.IsZero() {
		t.Fatalf("act-m3's records after AddLearner: %+v", r)
	}
	second, err := w.cl.NewMember("act-second")
	if err != nil {
		t.Fatal(err)
	}
	m4 := w.machine(ctx, "act-m4")
	err = w.x.Execute(ctx, quorum.Decision{Kind: quorum.AddLearner, Machine: "act-m4", PeerURL: second.PeerURL()}, m4)
	if !etcd.IsRefused(err) {
		t.Fatalf("a second learner: %v, want a refusal", err)
	}
	if r := ReadRecords(w.get(ctx, "act-m4")); r.JoinStarted {
		t.Fatal("a refused join left act-m4 marked as started; the planner would replace a good machine")
	}
	// The same when someone else (CAPI core, writing status) changed the
	// machine between the record and its taking back.
	m5 := w.machine(ctx, "act-m5")
	patches := 0
	racy := w.x
	watching, err := client.NewWithWatch(w.env.Config, client.Options{Scheme: w.env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	racy.Client = interceptor.NewClient(watching, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if patches++; patches == 2 {
				other := w.get(ctx, obj.GetName())
				before := other.DeepCopy()
				other.Labels = map[string]string{"written-by": "someone-else"}
				if err := c.Patch(ctx, other, client.MergeFrom(before)); err != nil {
					return err
				}
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	})
	err = racy.Execute(ctx, quorum.Decision{Kind: quorum.AddLearner, Machine: "act-m5", PeerURL: second.PeerURL()}, m5)
	if !etcd.IsRefused(err) || patches != 2 {
		t.Fatalf("a second learner, with a concurrent write: %v after %d patches, want a refusal after 2", err, patches)
	}
	if r := ReadRecords(w.get(ctx, "act-m5")); r.JoinStarted {
		t.Fatalf("a refused join left act-m5 marked as started after a concurrent write (%v); the planner would replace a good machine", err)
	}

	if err := newcomer.Start(testkit.InitialCluster(append(w.ps, newcomer)...), "existing"); err != nil {
		t.Fatal(err)
	}
	promote := quorum.Decision{Kind: quorum.Promote, MemberID: r.MemberID}
	if err := testkit.Eventually(ctx, 500*time.Millisecond, "learner promoted", func(ctx context.Context) error {
		return w.x.Execute(ctx, promote, nil)
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.x.Execute(ctx, promote, nil); err != nil {
		t.Fatalf("promoting a voter again: %v, want success", err)
	}
	remove := quorum.Decision{Kind: quorum.RemoveMember, MemberID: r.MemberID}
	for range 2 {
		if err := testkit.Eventually(ctx, 500*time.Millisecond, "member removed", func(ctx context.Context) error {
			return w.x.Execute(ctx, remove, nil)
		}); err != nil {
			t.Fatal(err)
		}
	}
	members, err := w.cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 3 {
		t.Fatalf("%d members after the learner was promoted and removed, want 3", len(members))
	}
}
