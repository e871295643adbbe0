package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
)

// clusterClassFile is the ClusterClass QCP ships, with its templates.
const clusterClassFile = "../../config/templates/clusterclass-qcp.yaml"

// clusterClassName is the class clusterClassFile defines.
const clusterClassName = "qcp-process"

var installClass sync.Once

// installClusterClass applies clusterClassFile to the scenarios' namespace,
// once per package: scenarios made from the class share it, as clusters
// made from one class do.
func (s *scenario) installClusterClass(ctx context.Context) {
	s.t.Helper()
	var err error
	installClass.Do(func() { err = applyFile(ctx, s.c, clusterClassFile) })
	if err != nil {
		s.t.Fatal(err)
	}
}

// applyFile creates every object of a multi-document YAML file in ns.
func applyFile(ctx context.Context, c client.Client, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		obj.SetNamespace(ns)
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: creating %s %s: %w", path, obj.GetKind(), obj.GetName(), err)
		}
	}
}

// newTopologyScenario creates a Cluster named name from the shipped
// ClusterClass with replicas control plane machines: CAPI core's topology
// controller makes its QuorumControlPlane and ProcessCluster from the
// class's templates.
func newTopologyScenario(t *testing.T, mgmt *management, name string, replicas int32) *scenario {
	t.Helper()
	s := beginScenario(t, mgmt, name, int(replicas), 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.installClusterClass(ctx)
	s.create(ctx, &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: clusterv1.ClusterSpec{Topology: clusterv1.Topology{
			ClassRef:     clusterv1.ClusterClassRef{Name: clusterClassName},
			Version:      version,
			ControlPlane: clusterv1.ControlPlaneTopology{Replicas: ptr.To(replicas)},
		}},
	})
	return s
}

// TestTopology creates a cluster from the shipped ClusterClass, scales it
// 3 → 5 → 3 through the Cluster's topology, and changes a class variable
// that needs no rollout, with the writer and the monitor running
// throughout. The topology controller's patches must behave as the same
// patches made by hand: learners, one membership change at a time, never
// more than desired + 1 machines, and no machine replaced for the
// variable.
func TestTopology(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 4*time.Minute)
	s := newTopologyScenario(t, mgmt, "topology", 3)
	s.startTraffic(3)
	cp := s.waitAvailable(convergeTimeout, 3)
	s.checkCreated(cp)
	s.checkMadeFromClass(cp)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s.scaleTopology(ctx, 5)
	s.waitAvailable(convergeTimeout, 5)
	if got := domainCounts(s.settled(5*time.Minute, 5)); !slices.Equal(got, []int{2, 2, 1}) {
		t.Errorf("5 machines spread %v over fd-a, fd-b, fd-c; want 2/2/1", got)
	}
	s.scaleTopology(ctx, 3)
	s.waitAvailable(convergeTimeout, 3)
	if got := domainCounts(s.settled(5*time.Minute, 3)); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("3 machines spread %v over fd-a, fd-b, fd-c; want 1/1/1", got)
	}

	s.checkVariableInPlace(ctx)
	s.finish()
}

// checkMadeFromClass: the control plane and the infrastructure cluster are
// the topology controller's, made from the class's templates, the machine
// template is its clone, the class's variable reached the control plane
// through its patch, and status.versions counts the machines.
func (s *scenario) checkMadeFromClass(cp *controlplanev1.QuorumControlPlane) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, ok := cp.Labels[clusterv1.ClusterTopologyOwnedLabel]; !ok {
		s.t.Errorf("QuorumControlPlane %s lacks %s: not made by the topology controller", cp.Name, clusterv1.ClusterTopologyOwnedLabel)
	}
	pc := &infrav1.ProcessCluster{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, pc); err != nil {
		s.t.Fatalf("reading the ProcessCluster the class names after the Cluster: %v", err)
	}
	if _, ok := pc.Labels[clusterv1.ClusterTopologyOwnedLabel]; !ok || !slices.Equal(pc.Spec.FailureDomains, failureDomains) {
		s.t.Errorf("ProcessCluster %s: labels %v, failure domains %v; want the topology's, with the template's %v", pc.Name, pc.Labels, pc.Spec.FailureDomains, failureDomains)
	}
	ref := cp.Spec.MachineTemplate.Spec.InfrastructureRef
	tmpl := &infrav1.ProcessMachineTemplate{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, tmpl); err != nil {
		s.t.Fatalf("reading the control plane's machine template %s: %v", ref.Name, err)
	}
	if from := tmpl.Annotations[clusterv1.TemplateClonedFromNameAnnotation]; from != "qcp-process-control-plane" {
		s.t.Errorf("machine template %s cloned from %q; want the class's qcp-process-control-plane", ref.Name, from)
	}
	if got := ptr.Deref(cp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge, -1); got != 1 {
		s.t.Errorf("maxSurge %d; want 1, the default of the class's controlPlaneMaxSurge", got)
	}
	if want := []clusterv1.StatusVersion{{Version: version, Replicas: 3}}; !slices.Equal(cp.Status.Versions, want) {
		s.t.Errorf("status.versions %v; want %v", cp.Status.Versions, want)
	}
	s.eventually(time.Minute, "the Cluster's topology reconciled", func(ctx context.Context) error {
		cluster := &clusterv1.Cluster{}
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, cluster); err != nil {
			return err
		}
		if !conditions.IsTrue(cluster, clusterv1.ClusterTopologyReconciledCondition) {
			return fmt.Errorf("TopologyReconciled: %s", conditions.GetMessage(cluster, clusterv1.ClusterTopologyReconciledCondition))
		}
		return nil
	})
}

// scaleTopology sets the Cluster's spec.topology.controlPlane.replicas, and
// the machine bound's and the monitor's desired count with it.
func (s *scenario) scaleTopology(ctx context.Context, replicas int32) {
	s.t.Helper()
	s.bound.setDesired(int(replicas))
	if s.traffic != nil {
		s.traffic.monitor.SetDesired(int(replicas))
	}
	s.patchCluster(ctx, func(c *clusterv1.Cluster) { c.Spec.Topology.ControlPlane.Replicas = ptr.To(replicas) })
}

// patchCluster changes the scenario's Cluster with edit.
func (s *scenario) patchCluster(ctx context.Context, edit func(*clusterv1.Cluster)) {
	s.t.Helper()
	cluster := &clusterv1.Cluster{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, cluster); err != nil {
		s.t.Fatal(err)
	}
	patch := client.MergeFrom(cluster.DeepCopy())
	edit(cluster)
	if err := s.c.Patch(ctx, cluster, patch); err != nil {
		s.t.Fatalf("patching Cluster %s: %v", s.name, err)
	}
}

// checkVariableInPlace sets the class's controlPlaneMaxSurge variable to 0
// on the Cluster: the control plane's maxSurge follows, and no machine is
// replaced, because the field needs no rollout.
func (s *scenario) checkVariableInPlace(ctx context.Context) {
	s.t.Helper()
	before, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	s.bound.setSurge(0)
	s.patchCluster(ctx, func(c *clusterv1.Cluster) {
		c.Spec.Topology.Variables = []clusterv1.ClusterVariable{{Name: "controlPlaneMaxSurge", Value: apiextensionsv1.JSON{Raw: []byte("0")}}}
	})
	s.eventually(2*time.Minute, "the control plane's maxSurge set to 0 by the class's patch", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if got := ptr.Deref(cp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge, -1); got != 0 {
			return fmt.Errorf("maxSurge %d", got)
		}
		return nil
	})
	names := func(ms []clusterv1.Machine) []string {
		var n []string
		for _, m := range ms {
			n = append(n, m.Name)
		}
		return n
	}
	s.holds(30*time.Second, "the same machines after a variable that needs no rollout", func(ctx context.Context) error {
		after, err := s.machines(ctx)
		if err != nil {
			return nil // a read that failed proves nothing either way
		}
		if !slices.Equal(names(after), names(before)) {
			return fmt.Errorf("machines %v, were %v", names(after), names(before))
		}
		return nil
	})
}
