package localenv_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestCAPICoreReconcilesClusterOfQCPObjects proves CAPI core runs against
// QCP's CRDs: it adopts the infrastructure and control plane objects a
// v1beta2 Cluster references.
func TestCAPICoreReconcilesClusterOfQCPObjects(t *testing.T) {
	env := localenv.StartForTest(t, localenv.Options{})
	// Room for a restart as slow as the start's ceiling on a starved host.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	c := env.Client
	ns := "default"

	pc, qcp, cluster := processCluster("c1", ns, "c1-cp", 3)
	pc.Spec.FailureDomains = []string{"fd-a", "fd-b", "fd-c"}
	for _, obj := range []client.Object{pc, qcp, cluster} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T: %v", obj, err)
		}
	}

	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); err != nil {
			return false, err
		}
		if len(cluster.Finalizers) == 0 {
			return false, nil
		}
		for _, obj := range []client.Object{pc, qcp} {
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return false, err
			}
			if !ownedByCluster(obj, cluster) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("CAPI core did not reconcile the Cluster (finalizers %v, ProcessCluster owners %v, QuorumControlPlane owners %v): %v",
			cluster.Finalizers, pc.OwnerReferences, qcp.OwnerReferences, err)
	}
	if got := cluster.Finalizers; !contains(got, clusterv1.ClusterFinalizer) {
		t.Errorf("Cluster finalizers = %v, want %s", got, clusterv1.ClusterFinalizer)
	}

	// A restarted kube-apiserver keeps its data, address and certificates:
	// CAPI core, which ran through the restart with its kubeconfig,
	// reconciles a Cluster created after it.
	if err := env.StopAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); err == nil {
		t.Fatal("the stopped kube-apiserver still answers")
	}
	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); err != nil {
		t.Fatalf("reading the Cluster after the restart: %v", err)
	}
	// A restart that fails quotes this log; envtest would discard it.
	if tail := localenv.LogTail(filepath.Join(env.Dir, "kube-apiserver.log"), 1); strings.TrimSpace(tail) == "" || strings.Contains(tail, "no such file") {
		t.Errorf("the management kube-apiserver's output is not in its log: %q", tail)
	}
	later := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "after-restart", Namespace: ns},
		Spec: clusterv1.ClusterSpec{InfrastructureRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessCluster", Name: "after-restart",
		}}}
	if err := c.Create(ctx, later); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(later), later); err != nil {
			return false, err
		}
		return contains(later.Finalizers, clusterv1.ClusterFinalizer), nil
	})
	if err != nil {
		t.Fatalf("CAPI core did not reconcile a Cluster created after the kube-apiserver restarted (finalizers %v): %v", later.Finalizers, err)
	}
	// The CAPI core manager has no --version flag; the version stamped into
	// it is what it reports when it starts.
	logData, err := os.ReadFile(filepath.Join(env.Dir, "capi-manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "Version: " + binaries.CAPIVersion; !strings.Contains(string(logData), want) {
		t.Errorf("CAPI core manager did not report %q at start-up", want)
	}
}

// TestStopLeavesNoProcess checks that stopping the environment ends every
// process it started: envtest's etcd and kube-apiserver, the CAPI core
// manager and a qcp-manager, and anything they started in turn.
func TestStopLeavesNoProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a management cluster; not run with -short")
	}
	manager := buildManager(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := localenv.Start(ctx, localenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkManagersEndingWhileStarting(ctx, t, env)
	if _, err := env.StartManager(ctx, localenv.ManagerOptions{Path: manager}); err != nil {
		_ = env.Stop()
		t.Fatal(err)
	}
	started, err := machinehost.Descendants(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if missing := localenv.MissingProcesses(started); len(missing) > 0 {
		t.Errorf("no %v among the processes the environment started: %v", missing, started)
	}
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}
	left, err := machinehost.StillRunning(started)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range left {
		t.Errorf("%s (pid %d) still running after Stop", p.Comm, p.PID)
	}
	if err := env.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// checkManagersEndingWhileStarting starts managers that end while starting
// (the test binary standing in for them): StartManager must return one
// that was allowed to kill itself, and killed itself, without error, and
// report any other end at once, not after its timeout.
func checkManagersEndingWhileStarting(ctx context.Context, t *testing.T, env *localenv.Env) {
	t.Helper()
	for _, c := range []struct {
		how           string
		mayKillItself bool
		wantErr       bool
	}{
		{localenv.StandInKilledAtStart, true, false},
		{localenv.StandInKilledWhenReady, true, false},
		{localenv.StandInKilledWhenReady, false, true},
		{localenv.StandInFailsWhenReady, true, true},
	} {
		begin := time.Now()
		p, err := env.StartManager(ctx, localenv.ManagerOptions{
			Path:          os.Args[0],
			Env:           []string{localenv.StandInManagerEnv + "=" + c.how},
			MayKillItself: c.mayKillItself,
		})
		took := time.Since(begin)
		switch {
		case c.wantErr && err == nil:
			t.Errorf("a manager %s, allowed to kill itself: %v: started without error", c.how, c.mayKillItself)
		case !c.wantErr && err != nil:
			t.Errorf("a manager %s, allowed to kill itself: %v: %v", c.how, c.mayKillItself, err)
		case !c.wantErr && !(p.Exited() && p.Killed()):
			t.Errorf("a manager %s: StartManager returned it not killed (exited %v, %v)", c.how, p.Exited(), p.Err())
		case took > 30*time.Second:
			t.Errorf("a manager %s, allowed to kill itself: %v: StartManager took %s to see it end", c.how, c.mayKillItself, took)
		}
	}
}

// buildManager builds qcp-manager from this tree, so the test never runs a
// stale binary from bin/.
func buildManager(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := testkit.BuildQCP(dir, "qcp-manager"); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "qcp-manager")
}

// processCluster is a Cluster named name on a ProcessCluster of the same
// name, with a QuorumControlPlane of replicas machines cloned from the
// ProcessMachineTemplate template; nothing is created.
func processCluster(name, ns, template string, replicas int32) (*infrav1.ProcessCluster, *controlplanev1.QuorumControlPlane, *clusterv1.Cluster) {
	pc := &infrav1.ProcessCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	qcp := &controlplanev1.QuorumControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: controlplanev1.QuorumControlPlaneSpec{
			Replicas: ptr(replicas),
			Version:  binaries.KubeVersion,
			MachineTemplate: controlplanev1.QuorumControlPlaneMachineTemplate{
				Spec: controlplanev1.QuorumControlPlaneMachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachineTemplate", Name: template,
					},
				},
			},
		},
	}
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: clusterv1.ClusterSpec{
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessCluster", Name: name,
			},
			ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: controlplanev1.GroupVersion.Group, Kind: "QuorumControlPlane", Name: name,
			},
		},
	}
	return pc, qcp, cluster
}

func ownedByCluster(obj client.Object, cluster *clusterv1.Cluster) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Kind == "Cluster" && ref.Name == cluster.Name && ref.UID == cluster.UID {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }
