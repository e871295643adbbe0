package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/controllers/process"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// handoverAddressRange is the loopback range of TestOtherInfrastructureKind's
// management cluster.
const handoverAddressRange = "127.29.0.0/16"

// handoverKind is the infrastructure machine kind TestOtherInfrastructureKind
// defines, in the group every infrastructure provider uses.
const handoverKind = "HandoverMachine"

// TestOtherInfrastructureKind: nothing in QCP names the process provider. A
// management cluster without the process provider's CRDs runs qcp-manager
// with the control plane and EtcdCluster controllers only, limited to one
// namespace and one watch-filter label value, as the clusterctl contract
// asks (control planes outside either stay untouched). The test
// registers an infrastructure machine kind of its own (HandoverMachine and
// its template, CRDs made here) whose controller, a few lines below, hands
// each HandoverMachine a process machine on this host. A QuorumControlPlane
// on HandoverMachineTemplate is created with one machine and scaled to
// three under writes, with the invariant monitor running; every Machine is
// a HandoverMachine's.
func TestOtherInfrastructureKind(t *testing.T) {
	requireShared(t)
	parallel(t, 3*time.Minute)
	mgmt := ownManagementWith(t, handoverAddressRange,
		[]string{"--controllers=controlplane", "--namespace=" + ns, "--watch-filter=" + handoverWatchFilter},
		localenv.Options{WithoutProcessProvider: true})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := workerClient(t, mgmt)
	if err := c.List(ctx, &infrav1.ProcessMachineList{}, client.InNamespace(ns)); !meta.IsNoMatchError(err) {
		t.Fatalf("listing ProcessMachines: %v; want no such kind in this management cluster", err)
	}
	installInfrastructureKinds(ctx, t, c, infrav1.GroupVersion.Group, handoverKind, handoverKind+"Template")

	const name = "handover"
	binDir, err := binaries.Dir()
	if err != nil {
		t.Fatal(err)
	}
	prefix := netip.MustParsePrefix(handoverAddressRange)
	h := &handover{c: c, host: &machinehost.Host{Root: mgmt.env.MachineRoot(), BinDir: binDir, AgentPath: filepath.Join(mgmt.binDir, "qcp-agent")},
		addrs: &process.Addresses{Dir: filepath.Join(mgmt.env.MachineRoot(), ".addresses"), Prefix: prefix}}
	// The Cluster has no infrastructure object (CAPI core then counts its
	// infrastructure provisioned) and the first machine's address as its
	// endpoint: a load balancer is another provider's business.
	if h.endpoint, err = h.addrs.Allocate("endpoint/" + ns + "/" + name); err != nil {
		t.Fatal(err)
	}
	handoverCtx, stopHandover := context.WithCancel(context.Background())
	handedOver := make(chan struct{})
	go func() { defer close(handedOver); h.run(handoverCtx) }()
	t.Cleanup(func() { stopHandover(); <-handedOver })

	s := beginScenario(t, mgmt, name, 1, 1)
	watched := map[string]string{clusterv1.WatchLabel: handoverWatchFilter}
	cp := newControlPlane(name, 1)
	cp.Labels = watched
	cp.Spec.MachineTemplate.Spec.InfrastructureRef.Kind = handoverKind + "Template"
	tmpl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": infrav1.GroupVersion.String(), "kind": handoverKind + "Template",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{}}},
	}}
	s.create(ctx, tmpl, &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: watched},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: h.endpoint.String(), Port: process.APIServerPort},
			ControlPlaneRef:      clusterv1.ContractVersionedObjectReference{APIGroup: controlplanev1.GroupVersion.Group, Kind: "QuorumControlPlane", Name: name},
		},
	}, cp)
	// Control planes this manager must leave alone: one without the
	// watch-filter label, one in another namespace.
	ignored := []*controlplanev1.QuorumControlPlane{
		ignoredControlPlane(ctx, t, c, ns, "unlabelled", nil),
		ignoredControlPlane(ctx, t, c, "elsewhere", "labelled", watched),
	}
	s.startTraffic(1)
	s.waitAvailable(convergeTimeout, 1)
	s.scale(ctx, 3)
	s.waitAvailable(convergeTimeout, 3)

	machines, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		if ref := m.Spec.InfrastructureRef; ref.Kind != handoverKind || ref.APIGroup != infrav1.GroupVersion.Group {
			t.Errorf("machine %s runs on %s %s; want a %s", m.Name, ref.APIGroup, ref.Kind, handoverKind)
		}
		if m.Status.NodeRef.Name == "" || m.Spec.ProviderID != handoverProviderID(m.Namespace, m.Spec.InfrastructureRef.Name) {
			t.Errorf("machine %s: node %q, provider ID %q; want its Node, and the HandoverMachine's ID", m.Name, m.Status.NodeRef.Name, m.Spec.ProviderID)
		}
	}
	// The manager reconciled the control plane it watches all along; had
	// it reconciled the others, their paused Clusters would have given them
	// its finalizer and a Paused condition.
	for _, o := range ignored {
		got := &controlplanev1.QuorumControlPlane{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			t.Fatal(err)
		}
		if len(got.Finalizers) > 0 || len(got.Status.Conditions) > 0 {
			t.Errorf("QuorumControlPlane %s/%s (labels %v), which --namespace=%s --watch-filter=%s leave out, was reconciled: finalizers %v, conditions %v",
				got.Namespace, got.Name, got.Labels, ns, handoverWatchFilter, got.Finalizers, got.Status.Conditions)
		}
	}
	s.finish()
}

// handoverWatchFilter is the --watch-filter of TestOtherInfrastructureKind's
// manager.
const handoverWatchFilter = "handover"

// ignoredControlPlane creates, in namespace, a paused Cluster name and a
// QuorumControlPlane it owns, labelled with labels: one that a manager which
// reconciled it would at once give a finalizer and a Paused condition.
func ignoredControlPlane(ctx context.Context, t *testing.T, c client.Client, namespace, name string, labels map[string]string) *controlplanev1.QuorumControlPlane {
	t.Helper()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: clusterv1.ClusterSpec{Paused: ptr.To(true),
			ControlPlaneRef: clusterv1.ContractVersionedObjectReference{APIGroup: controlplanev1.GroupVersion.Group, Kind: "QuorumControlPlane", Name: name}}}
	if err := c.Create(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	cp := newControlPlane(name, 1)
	cp.Namespace, cp.Labels = namespace, labels
	cp.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(cluster, clusterv1.GroupVersion.WithKind("Cluster"))}
	if err := c.Create(ctx, cp); err != nil {
		t.Fatal(err)
	}
	return cp
}

// handover is the HandoverMachine controller: it starts a process machine
// for every HandoverMachine whose Machine has bootstrap data, and reports
// its provider ID, addresses and provisioning as the infrastructure
// machine contract asks. The first machine gets the endpoint's address.
// The machines stop with the management cluster.
type handover struct {
	c        client.Client
	host     *machinehost.Host
	addrs    *process.Addresses
	endpoint netip.Addr
	first    string
}

func handoverProviderID(namespace, name string) string { return "handover://" + namespace + "/" + name }

func (h *handover) run(ctx context.Context) {
	_ = wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion(infrav1.GroupVersion.String())
		list.SetKind(handoverKind + "List")
		if err := h.c.List(ctx, list, client.InNamespace(ns)); err != nil {
			return false, nil
		}
		for i := range list.Items {
			_ = h.reconcile(ctx, &list.Items[i]) // tried again on the next tick
		}
		return false, nil
	})
}

func (h *handover) reconcile(ctx context.Context, hm *unstructured.Unstructured) error {
	owner := metav1.GetControllerOf(hm)
	if owner == nil || owner.Kind != "Machine" || !hm.GetDeletionTimestamp().IsZero() {
		return nil
	}
	m := &clusterv1.Machine{}
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: hm.GetNamespace(), Name: owner.Name}, m); err != nil || m.Spec.Bootstrap.DataSecretName == nil {
		return err
	}
	data := &corev1.Secret{}
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: *m.Spec.Bootstrap.DataSecretName}, data); err != nil {
		return err
	}
	if h.first == "" {
		h.first = hm.GetName()
	}
	addr := h.endpoint
	if hm.GetName() != h.first {
		var err error
		if addr, err = h.addrs.Allocate("machine/" + hm.GetNamespace() + "/" + hm.GetName()); err != nil {
			return err
		}
	}
	id := handoverProviderID(hm.GetNamespace(), hm.GetName())
	spec := machinehost.MachineSpec{Namespace: hm.GetNamespace(), Name: hm.GetName(), Cluster: m.Spec.ClusterName, Address: addr.String(), ProviderID: id}
	if err := h.host.StartBootstrap(spec, string(data.Data["format"]), data.Data["value"]); err != nil {
		return err
	}
	if st, err := h.host.Status(spec.Namespace, spec.Name); err != nil || !st.Running {
		return fmt.Errorf("machine %s not running: %v", spec.Name, err)
	}
	if got, _, _ := unstructured.NestedString(hm.Object, "spec", "providerID"); got != id {
		return h.c.Patch(ctx, hm, client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"spec":{"providerID":%q}}`, id)))
	}
	if done, _, _ := unstructured.NestedBool(hm.Object, "status", "initialization", "provisioned"); done {
		return nil
	}
	status := fmt.Appendf(nil, `{"status":{"initialization":{"provisioned":true},"addresses":[{"type":%q,"address":%q},{"type":%q,"address":%q}]}}`,
		clusterv1.MachineInternalIP, addr, clusterv1.MachineHostName, hm.GetName())
	return h.c.Status().Patch(ctx, hm, client.RawPatch("application/merge-patch+json", status))
}
