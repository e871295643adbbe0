package process_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/process"
	"github.com/qcp-dev/qcp/internal/lb"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// These steps run inside TestProcessProvider, on clusters of their own with
// no control plane, so that they share its management cluster but not its
// workload cluster.

// stepContext bounds one step on a side cluster: none takes a minute, and a
// broken one should fail well before the whole test's deadline.
func stepContext(ctx context.Context, t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// withCluster is w for another cluster of the same management cluster, with
// authorities of its own. A step running on it sets its t.
func (w *world) withCluster(t *testing.T, name string) *world {
	other := *w
	other.t, other.cluster, other.endpoint = t, name, ""
	var err error
	if other.cas, err = certs.NewClusterCAs(time.Now()); err != nil {
		t.Fatal(err)
	}
	return &other
}

// createBareCluster creates a Cluster with no control plane whose
// infrastructure is the ProcessCluster of the same name, which may not exist
// yet.
func (w *world) createBareCluster(ctx context.Context) {
	w.create(ctx, &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: w.cluster, Namespace: ns},
		Spec: clusterv1.ClusterSpec{InfrastructureRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessCluster", Name: w.cluster,
		}},
	})
}

// createProcessCluster creates the cluster's ProcessCluster, owned by owner
// if given. CAPI core looks again for an infrastructure object created after
// its Cluster only every 30 s, unless the object names the Cluster as owner.
func (w *world) createProcessCluster(ctx context.Context, owner *clusterv1.Cluster) {
	pc := &infrav1.ProcessCluster{ObjectMeta: metav1.ObjectMeta{Name: w.cluster, Namespace: ns}}
	if owner != nil {
		pc.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(owner, clusterv1.GroupVersion.WithKind("Cluster"))}
	}
	w.create(ctx, pc)
}

// testClusterWaits: a ProcessCluster no Cluster owns waits for one and
// starts nothing; once owned, its load balancer runs and the infrastructure
// is provisioned, but its condition says it forwards nowhere until the
// cluster CA Secret exists; when the Secret arrives the balancer gets the CA.
func (w *world) testClusterWaits(ctx context.Context) {
	t := w.t
	w.createProcessCluster(ctx, nil)
	c := w.waitLBCondition(ctx, process.WaitingForClusterReason)
	if c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "Cluster") {
		t.Errorf("condition %+v does not say it waits for a Cluster", c)
	}
	if pc := w.processCluster(ctx); len(pc.Finalizers) != 0 || pc.Spec.ControlPlaneEndpoint.Host != "" {
		t.Errorf("an unowned ProcessCluster was acted on: finalizers %v, endpoint %q", pc.Finalizers, pc.Spec.ControlPlaneEndpoint.Host)
	}
	host := &machinehost.Host{Root: w.host()}
	if st, _ := host.LBStatus(ns, w.cluster); st.Running {
		t.Errorf("the load balancer of an unowned ProcessCluster runs (pid %d)", st.PID)
	}

	w.createBareCluster(ctx)
	caSecret := w.cluster + "-ca"
	c = w.waitLBCondition(ctx, process.WaitingForClusterCAReason)
	if c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, caSecret) {
		t.Errorf("condition %+v does not name the missing CA Secret %s", c, caSecret)
	}
	w.waitInfrastructureProvisioned(ctx)
	// Provisioned means the balancer's process runs; on a loaded host it
	// listens a moment later.
	endpoint := w.lbEndpoint(ctx)
	w.eventually(ctx, "the load balancer listening on "+endpoint+" while it waits for the CA", func(context.Context) error { return dial(endpoint) })

	for _, s := range certs.Secrets(ns, w.cluster, w.cas) {
		w.create(ctx, s)
	}
	if c = w.waitLBCondition(ctx, process.LoadBalancerRunningReason); c.Status != metav1.ConditionTrue {
		t.Errorf("condition %+v after the CA arrived", c)
	}
	caFile := filepath.Join(host.LBDir(ns, w.cluster), lb.CAFile)
	w.eventually(ctx, "the load balancer holding the cluster CA", func(context.Context) error {
		data, err := os.ReadFile(caFile)
		if err != nil {
			return err
		}
		if string(data) != string(w.cas.Cluster.CertPEM) {
			return fmt.Errorf("%s holds %d bytes, not the cluster CA", caFile, len(data))
		}
		return nil
	})

	// A cluster CA rotation's new authority, <cluster>-ca-next: the
	// balancer trusts both at once (nothing else changes to wake it), and
	// the old one alone again once the Secret is gone.
	next, err := certs.NewCA("kubernetes-next", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	nextSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: caSecret + "-next", Namespace: ns,
		Labels: map[string]string{clusterv1.ClusterNameLabel: w.cluster}},
		Data: map[string][]byte{corev1.TLSCertKey: next.CertPEM, corev1.TLSPrivateKeyKey: next.KeyPEM}}
	w.create(ctx, nextSecret)
	holds := func(what string, want []byte) {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		w.eventually(wctx, "the load balancer trusting "+what, func(context.Context) error {
			data, err := os.ReadFile(caFile)
			if err != nil {
				return err
			}
			if string(data) != string(want) {
				return fmt.Errorf("%s holds %d bytes, want %d", caFile, len(data), len(want))
			}
			return nil
		})
	}
	holds("the cluster CA and <cluster>-ca-next's", append(append([]byte{}, w.cas.Cluster.CertPEM...), next.CertPEM...))
	if err := w.c.Delete(ctx, nextSecret); err != nil {
		t.Fatal(err)
	}
	holds("the cluster CA alone once <cluster>-ca-next is gone", w.cas.Cluster.CertPEM)
}

// testClusterDeletion: deleting the Cluster deletes its ProcessCluster,
// which stops the load balancer, frees its address and lets the object go.
func (w *world) testClusterDeletion(ctx context.Context) {
	t := w.t
	pc := w.processCluster(ctx)
	endpoint := w.lbEndpoint(ctx)
	reservation := filepath.Join(w.host(), ".addresses", pc.Spec.ControlPlaneEndpoint.Host)
	if _, err := os.Stat(reservation); err != nil {
		t.Fatalf("the load balancer's address has no reservation: %v", err)
	}
	pid := int(pc.Status.LoadBalancerPID)
	if procs, err := machinehost.GroupProcesses(pid); err != nil || len(procs) == 0 {
		t.Fatalf("the load balancer (pid %d) does not run before the deletion: %v %v", pid, procs, err)
	}
	lbDir := (&machinehost.Host{Root: w.host()}).LBDir(ns, w.cluster)

	w.deleteAndWait(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: w.cluster, Namespace: ns}})
	w.waitGone(ctx, &infrav1.ProcessCluster{ObjectMeta: metav1.ObjectMeta{Name: w.cluster, Namespace: ns}})
	if procs, err := machinehost.GroupProcesses(pid); err != nil || len(procs) != 0 {
		t.Errorf("processes of the load balancer remain: %v (%v)", procs, err)
	}
	if strays := processesMentioning(t, lbDir); len(strays) != 0 {
		t.Errorf("processes still use the load balancer's directory: %v", strays)
	}
	if err := dial(endpoint); err == nil {
		t.Errorf("something still listens on %s", endpoint)
	}
	if _, err := os.Stat(reservation); !os.IsNotExist(err) {
		t.Errorf("address %s is still reserved (%v)", pc.Spec.ControlPlaneEndpoint.Host, err)
	}
	if _, err := os.Stat(lbDir); !os.IsNotExist(err) {
		t.Errorf("the load balancer's directory %s remains (%v)", lbDir, err)
	}
}

// testMachineWaits: a ProcessMachine whose cluster has no infrastructure
// yet waits for it, then waits for its Machine's bootstrap data; it starts
// nothing meanwhile. No bootstrap provider runs here: the Machine names a
// bootstrap config that never appears (any kind under CAPI's contract
// serves), so CAPI core leaves spec.bootstrap.dataSecretName empty until
// the test sets it, as a bootstrap provider would.
func (w *world) testMachineWaits(ctx context.Context, name string) {
	t := w.t
	w.createBareCluster(ctx)
	w.create(ctx,
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-bootstrap", Namespace: ns,
				Labels: map[string]string{clusterv1.ClusterNameLabel: w.cluster}},
			Type: clusterv1.ClusterSecretType,
			Data: map[string][]byte{"value": w.etcdOnlyDoc(name), "format": []byte("qcp")},
		},
		&infrav1.ProcessMachine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{clusterv1.ClusterNameLabel: w.cluster}}},
		&clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{clusterv1.ClusterNameLabel: w.cluster}},
			Spec: clusterv1.MachineSpec{
				ClusterName: w.cluster,
				Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachineTemplate", Name: name + "-never",
				}},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachine", Name: name,
				},
			},
		},
	)
	c := w.waitCondition(ctx, name, process.WaitingForInfrastructureReason)
	if !strings.Contains(c.Message, "infrastructure") {
		t.Errorf("message %q does not name the cluster's infrastructure", c.Message)
	}
	w.checkNotStarted(name)

	cluster := &clusterv1.Cluster{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, cluster); err != nil {
		t.Fatal(err)
	}
	w.createProcessCluster(ctx, cluster)
	w.waitInfrastructureProvisioned(ctx)
	// The machine must move on within seconds: the Cluster's infrastructure
	// becoming provisioned wakes it. Without that watch it would wait for
	// CAPI core to update the Machine, which on a loaded host took longer
	// than 15 s, or for CAPI core's periodic look for the missing bootstrap
	// config, after 30 s.
	woken, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c = w.waitCondition(woken, name, process.WaitingForBootstrapDataReason)
	if !strings.Contains(c.Message, "bootstrap data") {
		t.Errorf("message %q does not name the bootstrap data", c.Message)
	}
	w.checkNotStarted(name)
}

// testPausedMachine: while its Cluster is paused, a ProcessMachine whose
// bootstrap data arrives is not started, and a deleted ProcessMachine or
// ProcessCluster is not stopped; each happens once the Cluster resumes. The
// Paused condition follows the Cluster, as CAPI's v1beta2 contract asks.
func (w *world) testPausedMachine(ctx context.Context, name string) {
	t := w.t
	host := &machinehost.Host{Root: w.host()}
	w.setPaused(ctx, true)
	w.waitPaused(ctx, name, true)
	m := &clusterv1.Machine{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
		t.Fatal(err)
	}
	// Patches, not updates: CAPI core writes these objects too.
	from := client.MergeFrom(m.DeepCopy())
	m.Spec.Bootstrap.DataSecretName = ptr.To(name + "-bootstrap")
	if err := w.c.Patch(ctx, m, from); err != nil {
		t.Fatal(err)
	}
	w.hold(func() error {
		if st, err := host.Status(ns, name); err != nil || st.Running {
			return fmt.Errorf("machine %s started while paused: %+v (%v)", name, st, err)
		}
		if _, err := os.Stat(host.Dir(ns, name)); !os.IsNotExist(err) {
			return fmt.Errorf("machine %s has a directory while paused (%v)", name, err)
		}
		return nil
	})
	w.setPaused(ctx, false)
	w.waitPaused(ctx, name, false)
	pid := w.runningPID(ctx, name)
	lbPID := int(w.processCluster(ctx).Status.LoadBalancerPID)
	if lbPID < 1 {
		t.Fatalf("ProcessCluster %s reports load balancer pid %d", w.cluster, lbPID)
	}

	w.setPaused(ctx, true)
	w.waitPaused(ctx, name, true)
	pm := &infrav1.ProcessMachine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	pc := &infrav1.ProcessCluster{ObjectMeta: metav1.ObjectMeta{Name: w.cluster, Namespace: ns}}
	for _, obj := range []client.Object{pm, pc} {
		if err := w.c.Delete(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	w.hold(func() error {
		if st, err := host.Status(ns, name); err != nil || !st.Running {
			return fmt.Errorf("machine %s stopped while paused: %+v (%v)", name, st, err)
		}
		if st, err := host.LBStatus(ns, w.cluster); err != nil || !st.Running {
			return fmt.Errorf("load balancer of %s stopped while paused: %+v (%v)", w.cluster, st, err)
		}
		for _, obj := range []client.Object{pm, pc} {
			if err := w.c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return fmt.Errorf("%T %s let go while paused: %w", obj, obj.GetName(), err)
			}
		}
		return nil
	})
	w.setPaused(ctx, false)
	w.waitGone(ctx, pm)
	w.waitGone(ctx, pc)
	for _, p := range []int{pid, lbPID} {
		if procs, err := machinehost.GroupProcesses(p); err != nil || len(procs) != 0 {
			t.Errorf("processes remain after resuming: %v (%v)", procs, err)
		}
	}
	if _, err := os.Stat(host.Dir(ns, name)); !os.IsNotExist(err) {
		t.Errorf("%s's directory remains (%v)", name, err)
	}
	w.deleteAndWait(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: w.cluster, Namespace: ns}})
}

// pauseWindow is how long a paused object is watched for being acted on:
// unpaused, the provider reacts to the change that wakes it within a second
// or two, even on a loaded host.
const pauseWindow = process.LivenessPeriod

// hold checks that check keeps passing for pauseWindow.
func (w *world) hold(check func() error) {
	w.t.Helper()
	for deadline := time.Now().Add(pauseWindow); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if err := check(); err != nil {
			w.t.Fatal(err)
		}
	}
}

func (w *world) setPaused(ctx context.Context, paused bool) {
	cluster := &clusterv1.Cluster{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, cluster); err != nil {
		w.t.Fatal(err)
	}
	from := client.MergeFrom(cluster.DeepCopy())
	cluster.Spec.Paused = ptr.To(paused)
	if err := w.c.Patch(ctx, cluster, from); err != nil {
		w.t.Fatal(err)
	}
}

// waitPaused waits for the ProcessMachine's Paused condition to say paused.
func (w *world) waitPaused(ctx context.Context, name string, paused bool) {
	want, reason := metav1.ConditionFalse, clusterv1.NotPausedReason
	if paused {
		want, reason = metav1.ConditionTrue, clusterv1.PausedReason
	}
	w.eventually(ctx, fmt.Sprintf("ProcessMachine %s Paused=%s", name, want), func(ctx context.Context) error {
		pm := &infrav1.ProcessMachine{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pm); err != nil {
			return err
		}
		if c := conditions.Get(pm, clusterv1.PausedCondition); c == nil || c.Status != want || c.Reason != reason {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
}

// checkNotStarted fails if the machine has a directory or a running agent.
func (w *world) checkNotStarted(name string) {
	host := &machinehost.Host{Root: w.host()}
	if _, err := os.Stat(host.Dir(ns, name)); !os.IsNotExist(err) {
		w.t.Errorf("machine %s has a directory (%v) while it waits", name, err)
	}
	if st, _ := host.Status(ns, name); st.Running {
		w.t.Errorf("machine %s runs while it waits", name)
	}
}

func (w *world) processCluster(ctx context.Context) *infrav1.ProcessCluster {
	pc := &infrav1.ProcessCluster{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, pc); err != nil {
		w.t.Fatal(err)
	}
	return pc
}

// waitLBCondition waits for the ProcessCluster's LoadBalancerReady reason.
func (w *world) waitLBCondition(ctx context.Context, reason string) *metav1.Condition {
	var cond *metav1.Condition
	w.eventually(ctx, "ProcessCluster "+w.cluster+" LoadBalancerReady reason "+reason, func(ctx context.Context) error {
		pc := &infrav1.ProcessCluster{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, pc); err != nil {
			return err
		}
		cond = conditions.Get(pc, process.LoadBalancerReadyCondition)
		if cond == nil || cond.Reason != reason {
			return fmt.Errorf("condition %+v", cond)
		}
		return nil
	})
	return cond
}

func (w *world) waitInfrastructureProvisioned(ctx context.Context) {
	w.eventually(ctx, "Cluster "+w.cluster+" infrastructure provisioned", func(ctx context.Context) error {
		cluster := &clusterv1.Cluster{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, cluster); err != nil {
			return err
		}
		if !ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) {
			return fmt.Errorf("infrastructure provisioned = %v", cluster.Status.Initialization.InfrastructureProvisioned)
		}
		return nil
	})
}

// lbEndpoint is host:port of the ProcessCluster's load balancer.
func (w *world) lbEndpoint(ctx context.Context) string {
	ep := w.processCluster(ctx).Spec.ControlPlaneEndpoint
	if ep.Host == "" {
		w.t.Fatalf("ProcessCluster %s has no endpoint", w.cluster)
	}
	return net.JoinHostPort(ep.Host, fmt.Sprint(ep.Port))
}

func (w *world) deleteAndWait(ctx context.Context, obj client.Object) {
	w.t.Helper()
	if err := w.c.Delete(ctx, obj); err != nil {
		w.t.Fatal(err)
	}
	w.waitGone(ctx, obj)
}

func (w *world) waitGone(ctx context.Context, obj client.Object) {
	w.t.Helper()
	w.eventually(ctx, fmt.Sprintf("%T %s gone", obj, obj.GetName()), func(ctx context.Context) error {
		err := w.c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}

// dial fails unless something accepts connections on addr.
func dial(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	return conn.Close()
}
