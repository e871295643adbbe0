package process_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/process"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// addressRange keeps this package's machines apart from other packages'
// tests running at the same time.
const addressRange = "127.21.0.0/16"

const ns = "default"

// world is one management cluster with qcp-manager and one workload cluster.
type world struct {
	t        *testing.T
	env      *localenv.Env
	c        client.Client
	binDir   string
	manager  *localenv.Process
	metrics  string // host:port of the manager's metrics endpoint
	cluster  string
	cas      *certs.ClusterCAs
	endpoint string // host:port of the load balancer
	// leaks remembers every key it has seen, so that a deleted machine's
	// keys are still looked for at the end.
	leaks *testkit.KeyLeakCheck
	// machineBins is the manager's --bin-dir: links to the pinned binaries,
	// so that a test can install a binary while the manager runs.
	machineBins string
}

// machineMemory is every test machine's spec.memory but too-small's: a
// VM's size, far above what a machine uses.
const machineMemory = "4Gi"

func buildQCP(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := testkit.BuildQCP(dir, "qcp-manager", "qcp-agent"); err != nil {
		t.Fatal(err)
	}
	return dir
}

func newWorld(t *testing.T) *world {
	env := localenv.StartForTest(t, localenv.Options{})
	w := &world{t: t, env: env, c: env.Client, binDir: buildQCP(t), machineBins: linkPinnedBinaries(t), cluster: "c1"}
	w.leaks = &testkit.KeyLeakCheck{Client: env.Client, Dirs: []string{env.Dir}, MachineDirs: []string{env.MachineRoot()}}
	w.startManager()
	t.Cleanup(w.dumpOnFailure)
	return w
}

func (w *world) startManager() {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := w.env.StartManager(ctx, localenv.ManagerOptions{
		Path: filepath.Join(w.binDir, "qcp-manager"),
		// The test plays the control plane provider itself. auto, not the
		// test harness's loopback: the loopback range makes auto fall back.
		ExtraArgs: []string{"--address-range=" + addressRange, "--controllers=process", "--bin-dir=" + w.machineBins, "--machine-network=auto"},
	})
	if err != nil {
		w.t.Fatal(err)
	}
	w.manager, w.metrics = p, p.MetricsAddr
}

// linkPinnedBinaries returns a new directory of links to the pinned binaries.
func linkPinnedBinaries(t *testing.T) string {
	t.Helper()
	pinned, err := binaries.Dir()
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(pinned)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, e := range entries {
		if err := os.Symlink(filepath.Join(pinned, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func (w *world) host() string { return w.env.MachineRoot() }

func (w *world) dumpOnFailure() {
	if !w.t.Failed() {
		return
	}
	for _, f := range []string{"qcp-manager.log", "capi-manager.log"} {
		data, _ := os.ReadFile(filepath.Join(w.env.Dir, f))
		lines := strings.Split(string(data), "\n")
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		w.t.Logf("--- tail of %s ---\n%s", f, strings.Join(lines, "\n"))
	}
}

func (w *world) create(ctx context.Context, objs ...client.Object) {
	w.t.Helper()
	for _, o := range objs {
		if err := w.c.Create(ctx, o); err != nil {
			w.t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

func (w *world) eventually(ctx context.Context, what string, cond func(context.Context) error) {
	w.t.Helper()
	if err := testkit.Eventually(ctx, 250*time.Millisecond, what, cond); err != nil {
		w.t.Fatal(err)
	}
}

// createCluster writes the cluster's CA Secrets, a ProcessCluster with three
// failure domains and a Cluster, waits for the load balancer, then writes the
// kubeconfig Secret CAPI core reaches the workload cluster through.
func (w *world) createCluster(ctx context.Context) {
	var err error
	if w.cas, err = certs.NewClusterCAs(time.Now()); err != nil {
		w.t.Fatal(err)
	}
	for _, s := range certs.Secrets(ns, w.cluster, w.cas) {
		w.create(ctx, s)
	}
	w.create(ctx,
		&infrav1.ProcessCluster{
			ObjectMeta: metav1.ObjectMeta{Name: w.cluster, Namespace: ns},
			Spec:       infrav1.ProcessClusterSpec{FailureDomains: []string{"fd-a", "fd-b", "fd-c"}},
		},
		// The test plays the control plane provider: no controller runs
		// for this QuorumControlPlane, the test sets its status.
		&controlplanev1.QuorumControlPlane{
			ObjectMeta: metav1.ObjectMeta{Name: w.cluster, Namespace: ns},
			Spec: controlplanev1.QuorumControlPlaneSpec{
				Replicas: ptr.To(int32(3)), Version: "v1.36.3",
				MachineTemplate: controlplanev1.QuorumControlPlaneMachineTemplate{
					Spec: controlplanev1.QuorumControlPlaneMachineTemplateSpec{
						InfrastructureRef: clusterv1.ContractVersionedObjectReference{
							APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachineTemplate", Name: w.cluster,
						},
					},
				},
			},
		},
		&clusterv1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Name: w.cluster, Namespace: ns},
			Spec: clusterv1.ClusterSpec{
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessCluster", Name: w.cluster,
				},
				ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: controlplanev1.GroupVersion.Group, Kind: "QuorumControlPlane", Name: w.cluster,
				},
			},
		},
	)
	cluster := &clusterv1.Cluster{}
	w.eventually(ctx, "Cluster infrastructure provisioned with an endpoint", func(ctx context.Context) error {
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, cluster); err != nil {
			return err
		}
		if !ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) || cluster.Spec.ControlPlaneEndpoint.Host == "" {
			return fmt.Errorf("infrastructure provisioned=%v endpoint=%q", cluster.Status.Initialization.InfrastructureProvisioned, cluster.Spec.ControlPlaneEndpoint.Host)
		}
		return nil
	})
	w.endpoint = fmt.Sprintf("%s:%d", cluster.Spec.ControlPlaneEndpoint.Host, cluster.Spec.ControlPlaneEndpoint.Port)
	// The control plane provider writes the kubeconfig Secret CAPI core
	// reaches the workload cluster through.
	kubeconfig, err := certs.AdminKubeconfig(w.cluster, "https://"+w.endpoint, w.cas.Cluster, time.Now())
	if err != nil {
		w.t.Fatal(err)
	}
	w.create(ctx, certs.KubeconfigSecret(ns, w.cluster, kubeconfig))

	pc := &infrav1.ProcessCluster{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, pc); err != nil {
		w.t.Fatal(err)
	}
	var names []string
	for _, fd := range pc.Status.FailureDomains {
		names = append(names, fd.Name)
	}
	if strings.Join(names, ",") != "fd-a,fd-b,fd-c" {
		w.t.Errorf("ProcessCluster reports failure domains %v, want fd-a, fd-b, fd-c", names)
	}
}

// createMachine creates a control plane Machine, its ProcessMachine and its
// bootstrap data Secret, as a control plane provider would.
func (w *world) createMachine(ctx context.Context, name, fd string, data []byte) {
	w.createMachineFormat(ctx, name, fd, bootstrap.Format, data)
}

// createMachineFormat is createMachine with bootstrap data of format.
func (w *world) createMachineFormat(ctx context.Context, name, fd, format string, data []byte) {
	w.create(ctx,
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-bootstrap", Namespace: ns,
				Labels: map[string]string{clusterv1.ClusterNameLabel: w.cluster}},
			Type: clusterv1.ClusterSecretType,
			Data: map[string][]byte{"value": data, "format": []byte(format)},
		},
		&infrav1.ProcessMachine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{clusterv1.ClusterNameLabel: w.cluster}},
			Spec: infrav1.ProcessMachineSpec{Memory: ptr.To(resource.MustParse(cmp.Or(map[string]string{"too-small": "64Mi"}[name], machineMemory)))}},
		&clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
				clusterv1.ClusterNameLabel: w.cluster, clusterv1.MachineControlPlaneLabel: "",
			}},
			Spec: clusterv1.MachineSpec{
				ClusterName:   w.cluster,
				Version:       "v1.36.3",
				FailureDomain: fd,
				Bootstrap:     clusterv1.Bootstrap{DataSecretName: ptr.To(name + "-bootstrap")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachine", Name: name,
				},
			},
		},
	)
}

func (w *world) bootstrapDoc(etcd bootstrap.LocalEtcd, mutate ...func(*bootstrap.Document)) []byte {
	return w.marshal(bootstrap.NewStacked(w.cluster, w.cas, w.endpoint, etcd), mutate...)
}

// marshal applies mutate to doc and returns its bytes.
func (w *world) marshal(doc *bootstrap.Document, mutate ...func(*bootstrap.Document)) []byte {
	for _, m := range mutate {
		m(doc)
	}
	data, err := bootstrap.Marshal(doc)
	if err != nil {
		w.t.Fatal(err)
	}
	return data
}

func (w *world) processMachine(ctx context.Context, name string) *infrav1.ProcessMachine {
	pm := &infrav1.ProcessMachine{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pm); err != nil {
		w.t.Fatal(err)
	}
	return pm
}

// address waits for the machine's allocated address.
func (w *world) address(ctx context.Context, name string) string {
	var addr string
	w.eventually(ctx, "an address for "+name, func(ctx context.Context) error {
		pm := &infrav1.ProcessMachine{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pm); err != nil {
			return err
		}
		for _, a := range pm.Status.Addresses {
			if a.Type == clusterv1.MachineInternalIP {
				addr = a.Address
				return nil
			}
		}
		return errors.New("no InternalIP yet")
	})
	return addr
}

// initializeControlPlane reports the control plane initialized once the
// first API server answers through the load balancer, as a control plane
// provider does; CAPI core watches the workload cluster's Nodes only then.
func (w *world) initializeControlPlane(ctx context.Context) {
	wl := w.workload()
	w.eventually(ctx, "the workload API server answering through the load balancer", func(ctx context.Context) error {
		_, err := wl.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err
	})
	cp := &controlplanev1.QuorumControlPlane{}
	if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, cp); err != nil {
		w.t.Fatal(err)
	}
	cp.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	if err := w.c.Status().Update(ctx, cp); err != nil {
		w.t.Fatal(err)
	}
}

// waitRunning waits until CAPI core reports the Machine Running with a node.
func (w *world) waitRunning(ctx context.Context, name string) {
	w.eventually(ctx, "Machine "+name+" Running with a nodeRef", func(ctx context.Context) error {
		m := &clusterv1.Machine{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
			return err
		}
		if m.Status.Phase != string(clusterv1.MachinePhaseRunning) || !m.Status.NodeRef.IsDefined() {
			return fmt.Errorf("phase %q, nodeRef %q", m.Status.Phase, m.Status.NodeRef.Name)
		}
		return nil
	})
}

// workload returns a client of the workload cluster through the load
// balancer, with a kubeconfig built by internal/certs.
func (w *world) workload() *kubernetes.Clientset {
	kubeconfig, err := certs.AdminKubeconfig(w.cluster, "https://"+w.endpoint, w.cas.Cluster, time.Now())
	if err != nil {
		w.t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		w.t.Fatal(err)
	}
	cfg.Timeout = 5 * time.Second
	return kubernetes.NewForConfigOrDie(cfg)
}

// waitNodeReady waits for the node's Ready condition to have status want.
func (w *world) waitNodeReady(ctx context.Context, name string, want corev1.ConditionStatus) *corev1.Node {
	var node *corev1.Node
	wl := w.workload()
	w.eventually(ctx, fmt.Sprintf("node %s Ready=%s", name, want), func(ctx context.Context) error {
		n, err := wl.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == want {
				node = n
				return nil
			}
		}
		return fmt.Errorf("conditions %v", n.Status.Conditions)
	})
	return node
}

// waitCondition waits for the ProcessMachine condition to be False with reason.
func (w *world) waitCondition(ctx context.Context, name, reason string) *metav1.Condition {
	var cond *metav1.Condition
	w.eventually(ctx, "ProcessMachine "+name+" condition reason "+reason, func(ctx context.Context) error {
		pm := &infrav1.ProcessMachine{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pm); err != nil {
			return err
		}
		cond = conditions.Get(pm, process.ProcessRunningCondition)
		if cond == nil || cond.Reason != reason {
			return fmt.Errorf("condition %+v", cond)
		}
		return nil
	})
	return cond
}

// runningPID waits for the machine to run and report its agent's PID. CAPI's
// patch helper writes conditions before the rest of the status, so a reader
// can see Running before the PID.
func (w *world) runningPID(ctx context.Context, name string) int {
	var pid int
	w.eventually(ctx, "ProcessMachine "+name+" running with its agent's pid", func(ctx context.Context) error {
		pm := &infrav1.ProcessMachine{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pm); err != nil {
			return err
		}
		c := conditions.Get(pm, process.ProcessRunningCondition)
		if c == nil || c.Status != metav1.ConditionTrue || pm.Status.PID < 1 {
			return fmt.Errorf("condition %+v, pid %d", c, pm.Status.PID)
		}
		pid = int(pm.Status.PID)
		return nil
	})
	return pid
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
