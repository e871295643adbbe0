package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/drone/envsubst/v2"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	capiyaml "sigs.k8s.io/cluster-api/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/controllers/controlplane"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// clusterClassFile is the ClusterClass QCP ships, with its templates.
const clusterClassFile = "../../config/templates/clusterclass-qcp.yaml"

// clusterClassName is the class clusterClassFile defines.
const clusterClassName = "qcp-process"

var (
	installClass    sync.Once
	installClassErr error
)

// installClusterClass applies clusterClassFile to the scenarios' namespace,
// once per package: scenarios made from the class share it, as clusters
// made from one class do. Every scenario fails if it could not be applied.
func (s *scenario) installClusterClass(ctx context.Context) {
	s.t.Helper()
	installClass.Do(func() { installClassErr = applyFile(ctx, s.c, clusterClassFile) })
	if installClassErr != nil {
		s.t.Fatal(installClassErr)
	}
}

// applyFile creates every object of a multi-document YAML file in ns.
func applyFile(ctx context.Context, c client.Client, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	objs, err := capiyaml.ToUnstructured(data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for i := range objs {
		objs[i].SetNamespace(ns)
		if err := c.Create(ctx, &objs[i]); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: creating %s %s: %w", path, objs[i].GetKind(), objs[i].GetName(), err)
		}
	}
	return nil
}

// clusterTemplateFile is the template of a Cluster made from the class.
const clusterTemplateFile = "../../config/templates/cluster-template-topology.yaml"

// renderClusterTemplate is the Cluster clusterTemplateFile describes, its
// variables substituted as clusterctl substitutes them (the same library),
// from vars and the template's defaults.
func renderClusterTemplate(vars map[string]string) (*clusterv1.Cluster, error) {
	data, err := os.ReadFile(clusterTemplateFile)
	if err != nil {
		return nil, err
	}
	rendered, err := envsubst.Eval(string(data), func(key string) string { return vars[key] })
	if err != nil {
		return nil, fmt.Errorf("%s: %w", clusterTemplateFile, err)
	}
	objs, err := capiyaml.ToUnstructured([]byte(rendered))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", clusterTemplateFile, err)
	}
	if len(objs) != 1 || objs[0].GetKind() != "Cluster" {
		return nil, fmt.Errorf("%s: want one Cluster, got %d objects", clusterTemplateFile, len(objs))
	}
	cluster := &clusterv1.Cluster{}
	return cluster, runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(objs[0].Object, cluster, true)
}

// newTopologyScenario creates a Cluster from cluster-template-topology.yaml,
// with CLUSTER_NAME=name and vars (the template's defaults for the rest):
// CAPI core's topology controller makes its QuorumControlPlane and
// ProcessCluster from the class's templates. A class edit makes a class of
// the scenario's own, named after it, from the shipped one, and the Cluster
// names it instead.
func newTopologyScenario(t *testing.T, mgmt *management, name string, vars map[string]string, classEdit func(*clusterv1.ClusterClass)) *scenario {
	t.Helper()
	all := map[string]string{"CLUSTER_NAME": name}
	maps.Copy(all, vars)
	cluster, err := renderClusterTemplate(all)
	if err != nil {
		t.Fatal(err)
	}
	s := beginScenario(t, mgmt, name, int(ptr.Deref(cluster.Spec.Topology.ControlPlane.Replicas, 1)), 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.installClusterClass(ctx)
	if classEdit != nil {
		cluster.Spec.Topology.ClassRef.Name = s.createClass(ctx, classEdit)
	}
	cluster.Namespace = ns
	s.create(ctx, cluster)
	return s
}

// createClass creates a ClusterClass named after the scenario: the shipped
// class, changed by edit. It uses the shipped class's templates.
func (s *scenario) createClass(ctx context.Context, edit func(*clusterv1.ClusterClass)) string {
	s.t.Helper()
	shipped := &clusterv1.ClusterClass{}
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: clusterClassName}, shipped); err != nil {
		s.t.Fatal(err)
	}
	own := &clusterv1.ClusterClass{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.name}, Spec: *shipped.Spec.DeepCopy()}
	edit(own)
	s.create(ctx, own)
	return own.Name
}

// TestTopology creates a cluster from the shipped ClusterClass, scales it
// 3 → 5 → 3 through the Cluster's topology, and changes a class variable
// that needs a rollout and one that needs none, with the writer and the
// monitor running throughout. The topology controller's patches must
// behave as the same patches made by hand: learners, one membership change
// at a time, never more than desired + 1 machines, and no machine replaced
// for the variable that needs no rollout.
func TestTopology(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 4*time.Minute)
	// The template's defaults: the pinned version, 3 machines.
	s := newTopologyScenario(t, mgmt, "topology", nil, nil)
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

	s.checkVariableRollout()
	s.checkVariableInPlace(ctx)
	s.finish()
}

// checkVariableRollout sets the class's etcdSnapshotCount variable on the
// Cluster: the flag reaches the control plane's etcd extraArgs through the
// class's patch, and every machine rolls out under the usual rules (one at
// a time, never more than desired + 1).
func (s *scenario) checkVariableRollout() {
	s.t.Helper()
	s.rollOutBy(func(ctx context.Context) {
		s.patchCluster(ctx, func(c *clusterv1.Cluster) { setVariable(c, "etcdSnapshotCount", "20000") })
	}, nil)
	cp, err := s.controlPlane(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	if want := []controlplanev1.Arg{{Name: "snapshot-count", Value: "20000"}}; !slices.Equal(cp.Spec.Etcd.Stacked.ExtraArgs, want) {
		s.t.Errorf("etcd extraArgs %v after the variable changed; want %v", cp.Spec.Etcd.Stacked.ExtraArgs, want)
	}
}

// setVariable sets a Cluster's value of a class variable, as JSON.
func setVariable(c *clusterv1.Cluster, name, value string) {
	v := clusterv1.ClusterVariable{Name: name, Value: apiextensionsv1.JSON{Raw: []byte(value)}}
	for i := range c.Spec.Topology.Variables {
		if c.Spec.Topology.Variables[i].Name == name {
			c.Spec.Topology.Variables[i] = v
			return
		}
	}
	c.Spec.Topology.Variables = append(c.Spec.Topology.Variables, v)
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
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, pc); err != nil {
		s.t.Fatalf("reading the ProcessCluster the class names after the Cluster: %v", err)
	}
	if _, ok := pc.Labels[clusterv1.ClusterTopologyOwnedLabel]; !ok || !slices.Equal(pc.Spec.FailureDomains, failureDomains) {
		s.t.Errorf("ProcessCluster %s: labels %v, failure domains %v; want the topology's, with the template's %v", pc.Name, pc.Labels, pc.Spec.FailureDomains, failureDomains)
	}
	ref := cp.Spec.MachineTemplate.Spec.InfrastructureRef
	tmpl := &infrav1.ProcessMachineTemplate{}
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, tmpl); err != nil {
		s.t.Fatalf("reading the control plane's machine template %s: %v", ref.Name, err)
	}
	if from := tmpl.Annotations[clusterv1.TemplateClonedFromNameAnnotation]; from != "qcp-process-control-plane" {
		s.t.Errorf("machine template %s cloned from %q; want the class's qcp-process-control-plane", ref.Name, from)
	}
	if got := ptr.Deref(cp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge, -1); got != 1 {
		s.t.Errorf("maxSurge %d; want 1, the default of the class's controlPlaneMaxSurge", got)
	}
	if want := []controlplanev1.Arg{{Name: "snapshot-count", Value: "10000"}}; !slices.Equal(cp.Spec.Etcd.Stacked.ExtraArgs, want) {
		s.t.Errorf("etcd extraArgs %v; want %v, from the default of the class's etcdSnapshotCount", cp.Spec.Etcd.Stacked.ExtraArgs, want)
	}
	if want := []clusterv1.StatusVersion{{Version: version, Replicas: 3}}; !slices.Equal(cp.Status.Versions, want) {
		s.t.Errorf("status.versions %v; want %v", cp.Status.Versions, want)
	}
	s.eventually(time.Minute, "the Cluster's topology reconciled", func(ctx context.Context) error {
		cluster := &clusterv1.Cluster{}
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, cluster); err != nil {
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
	patchObject(ctx, s, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.name}}, edit)
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
	s.patchCluster(ctx, func(c *clusterv1.Cluster) { setVariable(c, "controlPlaneMaxSurge", "0") })
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

// classHealthCheck is a control plane health check a ClusterClass defines:
// QCP's own checks on Node Ready, and at most one machine marked at a time.
func classHealthCheck() clusterv1.ControlPlaneClassHealthCheck {
	timeout := ptr.To(int32(controlplane.DefaultHealthCheckTimeout / time.Second))
	return clusterv1.ControlPlaneClassHealthCheck{
		Checks: clusterv1.ControlPlaneClassHealthCheckChecks{
			NodeStartupTimeoutSeconds: ptr.To[int32](300),
			UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: timeout},
				{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: timeout},
			},
		},
		Remediation: clusterv1.ControlPlaneClassHealthCheckRemediation{TriggerIf: clusterv1.ControlPlaneClassHealthCheckRemediationTriggerIf{
			UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromInt(1)),
		}},
	}
}

// TestTopologyHealthCheck: a class that defines the control plane's health
// check yields exactly one MachineHealthCheck, the topology controller's,
// whose spec and metadata neither controller rewrites while the cluster is
// idle. A voter
// killed under it is remediated by QCP with the quorum rules. Removing the
// check from the class brings back QCP's own, and adding it again removes
// QCP's: one object after each change settles.
func TestTopologyHealthCheck(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 5*time.Minute)
	s := newTopologyScenario(t, mgmt, "topology-mhc", nil, func(c *clusterv1.ClusterClass) {
		c.Spec.ControlPlane.HealthCheck = classHealthCheck()
	})
	s.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	mhc := s.settledHealthCheck(true)
	s.holds(time.Minute, "one MachineHealthCheck, unchanged while the cluster is idle", func(ctx context.Context) error {
		mine, err := s.healthChecks(ctx)
		if err != nil {
			return nil //nolint:nilerr // the management cluster's answer, not the controllers'
		}
		now, err := onlyHealthCheck(mine)
		if err != nil {
			return err
		}
		// CAPI's MachineHealthCheck controller writes the status; what
		// the topology controller or QCP would rewrite is the spec and the
		// metadata they set.
		if now.UID != mhc.UID || now.Generation != mhc.Generation || !equality.Semantic.DeepEqual(now.Spec, mhc.Spec) ||
			!maps.Equal(now.Labels, mhc.Labels) || !maps.Equal(now.Annotations, mhc.Annotations) ||
			!equality.Semantic.DeepEqual(now.OwnerReferences, mhc.OwnerReferences) {
			return fmt.Errorf("MachineHealthCheck %s (uid %s) at generation %d, labels %v, annotations %v, owners %v; was %s (uid %s) at generation %d, labels %v, annotations %v, owners %v",
				now.Name, now.UID, now.Generation, now.Labels, now.Annotations, now.OwnerReferences,
				mhc.Name, mhc.UID, mhc.Generation, mhc.Labels, mhc.Annotations, mhc.OwnerReferences)
		}
		return nil
	})

	machines, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := machines[0].Name
	if err := (&machinehost.Host{Root: mgmt.env.MachineRoot()}).Kill(ns, victim); err != nil {
		t.Fatal(err)
	}
	replacement := s.waitRemediated(victim)
	if got := s.replacementOf(ctx, victim); got != replacement {
		t.Errorf("machine %s records replacing %s; want %s, the machine QCP created for it", got, victim, replacement)
	}
	t.Logf("machine %s, marked by the class's health check, replaced by %s", victim, replacement)

	s.patchClass(ctx, func(c *clusterv1.ClusterClass) {
		c.Spec.ControlPlane.HealthCheck = clusterv1.ControlPlaneClassHealthCheck{}
	})
	s.settledHealthCheck(false)
	s.patchClass(ctx, func(c *clusterv1.ClusterClass) { c.Spec.ControlPlane.HealthCheck = classHealthCheck() })
	s.settledHealthCheck(true)
	s.finish()
}

// healthChecks lists the cluster's MachineHealthChecks.
func (s *scenario) healthChecks(ctx context.Context) ([]clusterv1.MachineHealthCheck, error) {
	var list clusterv1.MachineHealthCheckList
	if err := s.reader(ctx).List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(m clusterv1.MachineHealthCheck) bool { return m.Spec.ClusterName != s.name }), nil
}

// onlyHealthCheck returns the one MachineHealthCheck of mine, or an error
// naming every one there is.
func onlyHealthCheck(mine []clusterv1.MachineHealthCheck) (*clusterv1.MachineHealthCheck, error) {
	if len(mine) != 1 {
		var names []string
		for _, m := range mine {
			names = append(names, fmt.Sprintf("%s (labels %v, owners %v)", m.Name, m.Labels, m.OwnerReferences))
		}
		return nil, fmt.Errorf("%d MachineHealthChecks for the cluster, want 1: %v", len(mine), names)
	}
	return &mine[0], nil
}

// settledHealthCheck waits until the cluster's one MachineHealthCheck is the
// topology controller's (topology) or QCP's, then checks that it stays the
// only one for 15 s, and returns it.
func (s *scenario) settledHealthCheck(topology bool) *clusterv1.MachineHealthCheck {
	s.t.Helper()
	owner := "QCP's"
	if topology {
		owner = "the topology controller's"
	}
	isWanted := func(mine []clusterv1.MachineHealthCheck) (*clusterv1.MachineHealthCheck, error) {
		mhc, err := onlyHealthCheck(mine)
		if err != nil {
			return nil, err
		}
		_, byTopology := mhc.Labels[clusterv1.ClusterTopologyOwnedLabel]
		i := slices.IndexFunc(mhc.OwnerReferences, func(o metav1.OwnerReference) bool {
			return o.Kind == "QuorumControlPlane" && ptr.Deref(o.Controller, false)
		})
		byQCP := i >= 0
		if byTopology != topology || byQCP == topology {
			return nil, fmt.Errorf("MachineHealthCheck %s: labels %v, owners %v; want %s", mhc.Name, mhc.Labels, mhc.OwnerReferences, owner)
		}
		// QCP's has a name of its own: the topology controller's is named
		// after the control plane, and deletes by name.
		if byQCP {
			if want := controlplane.HealthCheckName(mhc.OwnerReferences[i].Name); mhc.Name != want {
				return nil, fmt.Errorf("QCP's MachineHealthCheck is named %s; want %s", mhc.Name, want)
			}
		}
		return mhc, nil
	}
	var mhc *clusterv1.MachineHealthCheck
	s.eventually(2*time.Minute, "one MachineHealthCheck, "+owner, func(ctx context.Context) error {
		mine, err := s.healthChecks(ctx)
		if err != nil {
			return err
		}
		mhc, err = isWanted(mine)
		return err
	})
	s.holds(15*time.Second, "one MachineHealthCheck, "+owner, func(ctx context.Context) error {
		mine, err := s.healthChecks(ctx)
		if err != nil {
			return nil //nolint:nilerr // the management cluster's answer, not the controllers'
		}
		_, err = isWanted(mine)
		return err
	})
	return mhc
}

// patchClass changes the scenario's own ClusterClass.
func (s *scenario) patchClass(ctx context.Context, edit func(*clusterv1.ClusterClass)) {
	s.t.Helper()
	patchObject(ctx, s, &clusterv1.ClusterClass{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.name}}, edit)
}

// TestTopologyUpgrade upgrades a cluster made from the shipped class from
// the previous Kubernetes minor to the pinned one through
// spec.topology.version, under writes: every machine rolls, with leadership
// moved off each leader's machine before it goes. While machines of both
// versions run, status.versions lists both, and the Cluster's topology
// condition says the control plane is upgrading; it says done only once no
// machine of the old version is left.
func TestTopologyUpgrade(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 3*time.Minute, "kube-previous")
	requirePreviousKube(t, mgmt)
	from := binaries.PreviousKubeVersion
	s := newTopologyScenario(t, mgmt, "topology-upgrade", map[string]string{"KUBERNETES_VERSION": from}, nil)
	s.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)
	s.checkAPIServerVersions(from)

	sawBoth, sawUpgrading := false, false
	s.rollOutBy(func(ctx context.Context) {
		s.patchCluster(ctx, func(c *clusterv1.Cluster) { c.Spec.Topology.Version = version })
	}, func(cp *controlplanev1.QuorumControlPlane, ms []clusterv1.Machine) error {
		older := slices.ContainsFunc(ms, func(m clusterv1.Machine) bool { return m.Spec.Version == from && m.DeletionTimestamp.IsZero() })
		newer := slices.ContainsFunc(ms, func(m clusterv1.Machine) bool { return m.Spec.Version == version })
		if n := len(cp.Status.Versions); older && newer && n == 2 {
			if cp.Status.Versions[0].Version != from || cp.Status.Versions[1].Version != version {
				return fmt.Errorf("status.versions %v while machines run %s and %s; want them oldest first", cp.Status.Versions, from, version)
			}
			sawBoth = true
		}
		cluster := &clusterv1.Cluster{}
		if err := s.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: s.name}, cluster); err != nil {
			return nil // a failed read proves nothing
		}
		c := conditions.Get(cluster, clusterv1.ClusterTopologyReconciledCondition)
		if c == nil {
			return nil
		}
		if c.Reason == clusterv1.ClusterTopologyReconciledClusterUpgradingReason {
			sawUpgrading = true
		}
		// Before the topology controller has seen the new version the
		// condition is still the one from before; once it said upgrading,
		// done while an old machine runs would be wrong.
		if sawUpgrading && older && c.Status == metav1.ConditionTrue {
			return fmt.Errorf("the Cluster's %s is True (%s) while a machine still runs %s", c.Type, c.Reason, from)
		}
		return nil
	})
	if !sawBoth {
		t.Error("status.versions never listed both versions while machines of both ran")
	}
	if !sawUpgrading {
		t.Errorf("the Cluster's %s never said %s during the upgrade", clusterv1.ClusterTopologyReconciledCondition, clusterv1.ClusterTopologyReconciledClusterUpgradingReason)
	}
	s.eventually(2*time.Minute, "the Cluster's topology reconciled, upgrade done", func(ctx context.Context) error {
		cluster := &clusterv1.Cluster{}
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, cluster); err != nil {
			return err
		}
		if !conditions.IsTrue(cluster, clusterv1.ClusterTopologyReconciledCondition) {
			return fmt.Errorf("%s: %s", clusterv1.ClusterTopologyReconciledCondition, conditions.GetMessage(cluster, clusterv1.ClusterTopologyReconciledCondition))
		}
		return nil
	})
	cp, err := s.controlPlane(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := []clusterv1.StatusVersion{{Version: version, Replicas: 3}}; !slices.Equal(cp.Status.Versions, want) {
		t.Errorf("after the upgrade status.versions is %v; want %v", cp.Status.Versions, want)
	}
	s.checkAPIServerVersions(version)
	s.checkLeaderMovedBeforeRemoval()
	s.finish()
}

// TestClusterTemplateDefaults: cluster-template-topology.yaml, given only
// CLUSTER_NAME, is a Cluster of the shipped class at the pinned version
// with 3 control plane machines; the variables it is given replace the
// defaults.
func TestClusterTemplateDefaults(t *testing.T) {
	c, err := renderClusterTemplate(map[string]string{"CLUSTER_NAME": "c1"})
	if err != nil {
		t.Fatal(err)
	}
	top := c.Spec.Topology
	if c.Name != "c1" || top.ClassRef.Name != clusterClassName || top.Version != version || ptr.Deref(top.ControlPlane.Replicas, 0) != 3 {
		t.Errorf("rendered Cluster %s: class %q, version %q, replicas %v; want c1, %s, %s, 3",
			c.Name, top.ClassRef.Name, top.Version, top.ControlPlane.Replicas, clusterClassName, version)
	}
	c, err = renderClusterTemplate(map[string]string{"CLUSTER_NAME": "c2", "KUBERNETES_VERSION": "v1.35.4", "CONTROL_PLANE_MACHINE_COUNT": "5"})
	if err != nil {
		t.Fatal(err)
	}
	if top := c.Spec.Topology; top.Version != "v1.35.4" || ptr.Deref(top.ControlPlane.Replicas, 0) != 5 {
		t.Errorf("rendered with variables: version %q, replicas %v; want v1.35.4 and 5", top.Version, top.ControlPlane.Replicas)
	}
}
