package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/contract"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/scheme"
	"github.com/qcp-dev/qcp/internal/testkit"
)

const (
	waitReason = "learner demo-cp-4 is catching up: revision 12 of 40"
	etcdHook   = clusterv1.PreTerminateDeleteHookAnnotationPrefix + "/qcp-etcd"
	// drainHook is etcdHook's pre-drain twin, as QCP's quorum hook has.
	drainHook = clusterv1.PreDrainDeleteHookAnnotationPrefix + "/qcp-etcd"
)

// scaleUp is demo mid scale-up from 3 to 5 machines: the fourth machine's
// member is a learner catching up, and the controller waits for it. Times are
// relative to now and far enough back that ages do not tick during a test.
func scaleUp(now time.Time) []client.Object {
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d).Truncate(time.Second)) }
	cond := func(typ string, status metav1.ConditionStatus, reason string) []metav1.Condition {
		return []metav1.Condition{{Type: typ, Status: status, Reason: reason, LastTransitionTime: at(3 * time.Hour)}}
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo"}}
	cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessCluster", Name: "demo"}
	cluster.Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: controlplanev1.GroupVersion.Group, Kind: "QuorumControlPlane", Name: "demo-control-plane"}
	cluster.Status.Conditions = cond(clusterv1.AvailableCondition, metav1.ConditionTrue, "Available")

	pc := &infrav1.ProcessCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo"}}
	pc.Status.Conditions = cond(clusterv1.ReadyCondition, metav1.ConditionTrue, "Ready")

	qcp := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo-control-plane"}}
	qcp.Spec.Replicas, qcp.Spec.Version = ptr.To[int32](5), "v1.36.3"
	qcp.Status.Replicas, qcp.Status.ReadyReplicas, qcp.Status.UpToDateReplicas = ptr.To[int32](4), ptr.To[int32](3), ptr.To[int32](4)
	qcp.Status.Version = "v1.36.3"
	qcp.Status.Conditions = cond(controlplanev1.AvailableCondition, metav1.ConditionTrue, "Available")
	qcp.Status.Etcd.Members = []controlplanev1.EtcdMemberStatus{
		{ID: "a1", Name: "demo-cp-1", Machine: "demo-cp-1", Role: controlplanev1.EtcdMemberRoleLeader, Healthy: true,
			Database: &controlplanev1.EtcdDatabaseStatus{Size: resource.MustParse("100Mi"), InUse: resource.MustParse("40Mi"), Quota: ptr.To(resource.MustParse("2Gi"))}},
		{ID: "a2", Name: "demo-cp-2", Machine: "demo-cp-2", Role: controlplanev1.EtcdMemberRoleVoter, Healthy: true,
			Database: &controlplanev1.EtcdDatabaseStatus{Size: resource.MustParse("64Mi"), InUse: resource.MustParse("60Mi")}},
		{ID: "a3", Name: "demo-cp-3", Machine: "demo-cp-3", Role: controlplanev1.EtcdMemberRoleVoter, Healthy: true},
		{ID: "a4", Name: "demo-cp-4", Machine: "demo-cp-4", Role: controlplanev1.EtcdMemberRoleLearner, Healthy: false, Revision: 12},
	}
	qcp.Status.LastOperation = controlplanev1.LastOperation{
		Kind: controlplanev1.OperationWait, Target: "demo-cp-4", Reason: waitReason, StartTime: at(2 * time.Minute)}

	objs := []client.Object{cluster, pc, qcp}
	machine := func(name, clusterName, domain string, controlPlane bool) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels: map[string]string{clusterv1.ClusterNameLabel: clusterName}}}
		if controlPlane {
			m.Labels[clusterv1.MachineControlPlaneLabel] = ""
		}
		m.Spec.ClusterName, m.Spec.FailureDomain, m.Spec.Version = clusterName, domain, "v1.36.3"
		m.Status.Conditions = cond(clusterv1.MachineReadyCondition, metav1.ConditionTrue, "Ready")
		objs = append(objs, m)
		return m
	}
	// Listed out of order: describe sorts them.
	machine("demo-cp-3", "demo", "fd-3", true)
	machine("demo-cp-1", "demo", "fd-1", true).Annotations = map[string]string{etcdHook: "", drainHook: "", "unrelated": "x"}
	machine("demo-cp-2", "demo", "fd-2", true)
	machine("demo-cp-4", "demo", "fd-1", true).Status.Conditions = cond(clusterv1.MachineReadyCondition, metav1.ConditionFalse, "EtcdMemberNotPromoted")
	machine("demo-worker-1", "demo", "fd-1", false) // not a control plane machine
	machine("other-cp-1", "other", "fd-1", true)    // another cluster's
	return objs
}

// fakeClient is a management cluster with QCP's CRDs and objs. It gives each
// object a UID, as the API server does, because clusterctl's object tree
// tells objects apart by UID.
func fakeClient(objs ...client.Object) client.Client {
	s := scheme.New()
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	for _, o := range objs {
		if o.GetUID() == "" {
			o.SetUID(uuid.NewUUID())
		}
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).WithObjects(
		contractCRD(infrav1.GroupVersion.WithKind("ProcessCluster")),
		contractCRD(controlplanev1.GroupVersion.WithKind("QuorumControlPlane")),
	).Build()
}

// contractCRD is what clusterctl's discovery reads of a provider's CRD: the
// label that names the API version serving the Cluster API contract.
func contractCRD(gvk schema.GroupVersionKind) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{
		Name:   contract.CalculateCRDName(gvk.Group, gvk.Kind),
		Labels: map[string]string{clusterv1.GroupVersion.String(): gvk.Version},
	}}
}

func runDescribe(t *testing.T, c client.Client, args ...string) (string, error) {
	t.Helper()
	cmd := newDescribeCommand(func() (client.Client, error) { return c, nil })
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// line returns the line of out that contains s, failing if none or several do.
func line(t *testing.T, out, s string) (int, string) {
	t.Helper()
	idx, found := -1, ""
	for i, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			if idx >= 0 {
				t.Fatalf("%q is on more than one line:\n%s", s, out)
			}
			idx, found = i, l
		}
	}
	if idx < 0 {
		t.Fatalf("no line contains %q:\n%s", s, out)
	}
	return idx, found
}

// column returns the rune offset of word in l; tabwriter aligns by runes.
func column(t *testing.T, l, word string) int {
	t.Helper()
	i := strings.Index(l, " "+word+" ")
	if i < 0 {
		t.Fatalf("%q is not a cell of %q", word, l)
	}
	return utf8.RuneCountInString(l[:i+1])
}

func TestDescribeTreeShowsEtcdRolesHooksAndWait(t *testing.T) {
	now := time.Now()
	tree, err := collect(context.Background(), fakeClient(scaleUp(now)...), "default", "demo", now)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := renderTree(&b, tree, false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "\x1b") {
		t.Errorf("colour without a terminal:\n%q", out)
	}
	for _, gone := range []string{"demo-worker-1", "other-cp-1"} {
		if strings.Contains(out, gone) {
			t.Errorf("%s is not a control plane machine of demo but is shown:\n%s", gone, out)
		}
	}
	_, header := line(t, out, "NAME")
	cpAt, cp := line(t, out, "QuorumControlPlane/demo-control-plane")
	if !strings.Contains(cp, " 4/5 ") {
		t.Errorf("control plane row lacks replicas 4/5: %q", cp)
	}
	waitAt, wait := line(t, out, "Waiting for:")
	if want := "Waiting for: demo-cp-4: " + waitReason + " (since 2m)"; !strings.Contains(wait, want) || waitAt != cpAt+1 {
		t.Errorf("want %q right under the control plane row, got line %d %q:\n%s", want, waitAt, wait, out)
	}

	// demo-cp-3 and the learner have not reported their databases.
	want := []struct{ machine, role, member, revision, size, inUse, frag, hooks string }{
		{"demo-cp-1", "leader", "healthy", "", "100Mi", "40Mi", "60%", "qcp-etcd"},
		{"demo-cp-2", "voter", "healthy", "", "64Mi", "60Mi", "6%", ""},
		{"demo-cp-3", "voter", "healthy", "", "", "", "", ""},
		{"demo-cp-4", "learner", "unhealthy", "12", "", "", "", ""},
	}
	prev := waitAt
	for _, w := range want {
		at, row := line(t, out, "Machine/"+w.machine+" ")
		if at <= prev {
			t.Errorf("machine %s is not after the previous one (sorted by name):\n%s", w.machine, out)
		}
		prev = at
		row += " "
		for _, cell := range []struct{ head, value string }{
			{"ROLE", w.role}, {"MEMBER", w.member}, {"REVISION", w.revision},
			{"DB SIZE", w.size}, {"IN USE", w.inUse}, {"FRAG", w.frag}, {"HOOKS", w.hooks},
		} {
			if cell.value == "" {
				continue
			}
			if got, head := column(t, row, cell.value), column(t, header+" ", cell.head); got != head {
				t.Errorf("%s: %q at column %d, want under %s at %d:\n%s", w.machine, cell.value, got, cell.head, head, out)
			}
		}
	}
	if _, cp4 := line(t, out, "Machine/demo-cp-4"); !strings.Contains(cp4, "EtcdMemberNotPromoted") {
		t.Errorf("the learner's row lacks its Ready reason: %q", cp4)
	}
}

func TestRenderTreeColourKeepsColumnsAligned(t *testing.T) {
	now := time.Now()
	tree, err := collect(context.Background(), fakeClient(scaleUp(now)...), "default", "demo", now)
	if err != nil {
		t.Fatal(err)
	}
	var plain, coloured bytes.Buffer
	if err := renderTree(&plain, tree, false); err != nil {
		t.Fatal(err)
	}
	if err := renderTree(&coloured, tree, true); err != nil {
		t.Fatal(err)
	}
	_, cp4 := line(t, coloured.String(), "Machine/demo-cp-4")
	if !strings.Contains(cp4, "\x1b[31mFalse\x1b[0m") {
		t.Errorf("the learner's False status is not red: %q", cp4)
	}
	stripped := regexp.MustCompile("\x1b\\[[0-9;]*m").ReplaceAllString(coloured.String(), "")
	if stripped != plain.String() {
		t.Errorf("colour moved the columns; without escapes:\n%s\nwant:\n%s", stripped, plain.String())
	}
}

func TestDescribeJSONHasTheTreeData(t *testing.T) {
	out, err := runDescribe(t, fakeClient(scaleUp(time.Now())...), "demo", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var tree ClusterTree
	if err := json.Unmarshal([]byte(out), &tree); err != nil {
		t.Fatalf("-o json is not a ClusterTree: %v\n%s", err, out)
	}
	if tree.ControlPlane == nil || tree.Infrastructure == nil {
		t.Fatalf("the JSON lacks the control plane or infrastructure:\n%s", out)
	}
	if op := tree.ControlPlane.Operation; op == nil || op.Kind != controlplanev1.OperationWait || op.Reason != waitReason {
		t.Errorf("operation = %+v, want Wait: %s", op, waitReason)
	}
	if got := tree.ControlPlane.Replicas; got != "4/5" {
		t.Errorf("control plane replicas = %q, want 4/5", got)
	}
	type machine struct {
		Name, Role, Domain string
		Healthy            bool
		Revision           int64
		Hooks              []string
	}
	var got []machine
	for _, m := range tree.ControlPlane.Machines {
		if m.MemberHealthy == nil {
			t.Fatalf("%s has a member but no memberHealthy", m.Name)
		}
		got = append(got, machine{m.Name, m.EtcdRole, m.FailureDomain, *m.MemberHealthy, m.Revision, m.DeletionHooks})
	}
	want := []machine{
		{"demo-cp-1", "leader", "fd-1", true, 0, []string{drainHook, etcdHook}},
		{"demo-cp-2", "voter", "fd-2", true, 0, nil},
		{"demo-cp-3", "voter", "fd-3", true, 0, nil},
		{"demo-cp-4", "learner", "fd-1", false, 12, nil},
	}
	if !slices.EqualFunc(got, want, func(a, b machine) bool {
		return a.Name == b.Name && a.Role == b.Role && a.Domain == b.Domain && a.Healthy == b.Healthy &&
			a.Revision == b.Revision && slices.Equal(a.Hooks, b.Hooks)
	}) {
		t.Errorf("machines in JSON:\n got %+v\nwant %+v", got, want)
	}
}

func TestDescribeMachineWithoutMemberIsNone(t *testing.T) {
	objs := scaleUp(time.Now())
	objs[2].(*controlplanev1.QuorumControlPlane).Status.Etcd.Members = nil
	tree, err := collect(context.Background(), fakeClient(objs...), "default", "demo", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range tree.ControlPlane.Machines {
		if m.EtcdRole != "none" || m.MemberHealthy != nil {
			t.Errorf("%s without a member: role %q, healthy %v; want none, nil", m.Name, m.EtcdRole, m.MemberHealthy)
		}
	}
}

// The planner's steady state is a Wait with nothing to wait for; describe
// must not say it waits.
func TestDescribeSteadyIsNotWaiting(t *testing.T) {
	objs := scaleUp(time.Now())
	op := &objs[2].(*controlplanev1.QuorumControlPlane).Status.LastOperation
	op.Target, op.Reason = "", "nothing to do: 3 healthy, up-to-date voters as desired"
	tree, err := collect(context.Background(), fakeClient(objs...), "default", "demo", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := renderTree(&b, tree, false); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); strings.Contains(out, "Waiting for:") || !strings.Contains(out, "Steady: nothing to do") {
		t.Errorf("steady state rendered as:\n%s", out)
	}
}

func TestDescribeMissingClusterSaysWhatToDo(t *testing.T) {
	_, err := runDescribe(t, fakeClient(), "demo")
	if err == nil {
		t.Fatal("describing a missing cluster succeeded")
	}
	if want := "cluster default/demo not found: list clusters with 'kubectl get clusters -A'"; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	if !apierrors.IsNotFound(err) {
		t.Errorf("error %v does not wrap the NotFound", err)
	}
}

func TestDescribeWatchRedrawsOnlyOnChange(t *testing.T) {
	for _, tty := range []bool{false, true} {
		c := fakeClient(scaleUp(time.Now())...)
		ctx, cancel := context.WithCancel(context.Background())
		out := &testkit.SyncBuffer{}
		done := make(chan error, 1)
		go func() {
			done <- describer{c: c, namespace: "default", name: "demo"}.watch(ctx, out, tty, 5*time.Millisecond)
		}()
		eventually(t, func() bool { return strings.Contains(out.String(), "Waiting for:") })
		time.Sleep(50 * time.Millisecond) // ten polls of an unchanged cluster

		qcp := &controlplanev1.QuorumControlPlane{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "demo-control-plane"}, qcp); err != nil {
			t.Fatal(err)
		}
		qcp.Status.LastOperation.Kind, qcp.Status.LastOperation.Reason = controlplanev1.OperationPromote, "caught up"
		if err := c.Update(ctx, qcp); err != nil {
			t.Fatal(err)
		}
		eventually(t, func() bool { return strings.Contains(out.String(), "Operation: Promote demo-cp-4: caught up") })
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("watch ended with %v, want nil on cancel", err)
		}

		got := out.String()
		if n := strings.Count(got, "NAME "); n != 2 {
			t.Errorf("tty=%v: %d frames, want 2 (one per change):\n%s", tty, n, got)
		}
		clear := "\x1b[H\x1b[2JNAME "
		if tty && (!strings.HasPrefix(got, clear) || strings.Count(got, clear) != 2) {
			t.Errorf("on a terminal, each frame must clear the screen first:\n%q", got)
		}
		if !tty && (!strings.HasPrefix(got, "NAME ") || !strings.Contains(got, "\n\nNAME ") || strings.Contains(got, "\x1b")) {
			t.Errorf("piped, frames must be plain and separated by a blank line:\n%q", got)
		}
	}
}

func eventually(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// providerObject is another provider's object, which qcpctl has no Go type
// for, with a Ready condition.
func providerObject(t *testing.T, gvk schema.GroupVersionKind, name, readyReason string, since time.Time) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace("default")
	u.SetName(name)
	if err := unstructured.SetNestedSlice(u.Object, []any{map[string]any{
		"type": clusterv1.ReadyCondition, "status": "False", "reason": readyReason,
		"lastTransitionTime": since.UTC().Format(time.RFC3339),
	}}, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	return u
}

// The infrastructure row is whatever object clusterctl's discovery resolves
// the Cluster's reference to, through its CRD's contract label, here another
// provider's; a walk that assumed QCP's ProcessCluster would call it missing.
func TestDescribeShowsTheInfrastructureDiscoveryFinds(t *testing.T) {
	now := time.Now()
	docker := schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DockerCluster"}
	objs := scaleUp(now)
	objs[0].(*clusterv1.Cluster).Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: docker.Group, Kind: docker.Kind, Name: "demo-lb"}
	infra := providerObject(t, docker, "demo-lb", "LoadBalancerNotReady", now.Add(-time.Hour))
	c := fakeClient(append(objs, infra, contractCRD(docker))...)

	tree, err := collect(context.Background(), c, "default", "demo", now)
	if err != nil {
		t.Fatal(err)
	}
	if got := tree.Infrastructure; got == nil || got.Kind != docker.Kind || got.Reason != "LoadBalancerNotReady" || got.Since != "1h" {
		t.Fatalf("infrastructure = %+v, want the DockerCluster's Ready reason LoadBalancerNotReady since 1h", got)
	}
	var b bytes.Buffer
	if err := renderTree(&b, tree, false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if _, row := line(t, out, "DockerCluster/demo-lb"); !strings.Contains(row, "LoadBalancerNotReady") || strings.Contains(row, "not found") {
		t.Errorf("the infrastructure row lacks the DockerCluster's condition: %q", row)
	}
	// QCP's columns still sit on the machines discovery puts under the control plane.
	if _, cp1 := line(t, out, "Machine/demo-cp-1 "); !strings.Contains(cp1, " leader ") {
		t.Errorf("demo-cp-1 lost its etcd role: %q", cp1)
	}
}

// Another provider's control plane has no etcd status for QCP's columns;
// its row says which tool describes it instead of showing wrong columns.
func TestDescribeOtherControlPlaneSaysWhatToUse(t *testing.T) {
	now := time.Now()
	kubeadm := schema.GroupVersionKind{Group: controlplanev1.GroupVersion.Group, Version: "v1beta2", Kind: "KubeadmControlPlane"}
	objs := scaleUp(now)
	objs[0].(*clusterv1.Cluster).Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: kubeadm.Group, Kind: kubeadm.Kind, Name: "demo-kcp"}
	kcp := providerObject(t, kubeadm, "demo-kcp", "ScalingUp", now.Add(-time.Hour))
	tree, err := collect(context.Background(), fakeClient(append(objs, kcp, contractCRD(kubeadm))...), "default", "demo", now)
	if err != nil {
		t.Fatal(err)
	}
	cp := tree.ControlPlane
	if cp == nil || cp.Kind != kubeadm.Kind || !strings.Contains(cp.Message, "clusterctl describe") || len(cp.Machines) != 0 {
		t.Errorf("control plane = %+v, want a KubeadmControlPlane row pointing to clusterctl describe and no machines", cp)
	}
}
