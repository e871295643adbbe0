package engine

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// NewMachine is a machine an owner asks the engine to create.
type NewMachine struct {
	// Owner controls the machine; OwnerRef references it.
	Owner    client.Object
	OwnerRef metav1.OwnerReference
	// InfraOwnerRef owns the infrastructure machine until CAPI core makes
	// the Machine its controller; OwnerRef if unset. CAPI core takes over
	// only from a MachineSet or the cluster's control plane, so any other
	// owner must not be its controller.
	InfraOwnerRef *metav1.OwnerReference
	Cluster       *clusterv1.Cluster
	Name          string
	Labels        map[string]string
	// Annotations go on the Machine; InfraAnnotations on the
	// infrastructure machine.
	Annotations, InfraAnnotations map[string]string
	// InfraTemplate is the infrastructure machine template to clone; its
	// field path names it in errors.
	InfraTemplate     clusterv1.ContractVersionedObjectReference
	InfraTemplatePath string
	Version           string
	FailureDomain     string
	Bootstrap         *bootstrap.Document
	Deletion          clusterv1.MachineDeletionSpec
}

// CreateMachine creates nm: its bootstrap data, its infrastructure machine
// cloned from the template, and the Machine. The first two are owned by
// the owner until the Machine exists, so a crash in between leaves nothing
// that outlives the owner; CAPI core then makes the infrastructure machine
// the Machine's, and the bootstrap Secret is handed to the Machine here.
func CreateMachine(ctx context.Context, c client.Client, fp Failpoints, nm NewMachine) (*clusterv1.Machine, error) {
	data, err := BootstrapDataSecret(&clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: nm.Name, Namespace: nm.Owner.GetNamespace()},
		Spec: clusterv1.MachineSpec{ClusterName: nm.Cluster.Name}}, nm.Bootstrap)
	if err != nil {
		return nil, err
	}
	data.OwnerReferences = []metav1.OwnerReference{nm.OwnerRef}
	if err := c.Create(ctx, data); err != nil {
		return nil, fmt.Errorf("creating the bootstrap data of machine %s: %w", nm.Name, err)
	}
	fp.Hit(FailpointAfterBootstrapData)

	infra, err := cloneInfrastructure(ctx, c, nm)
	if err != nil {
		cleanUp(ctx, c, data)
		return nil, fmt.Errorf("cloning %s %s for machine %s (check %s): %w", nm.InfraTemplate.Kind, nm.InfraTemplate.Name, nm.Name, nm.InfraTemplatePath, err)
	}
	fp.Hit(FailpointAfterInfraMachine)

	machine := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Name: nm.Name, Namespace: nm.Owner.GetNamespace(), Labels: nm.Labels,
			Annotations: withBootstrapHooks(nm.Annotations, nm.Bootstrap), OwnerReferences: []metav1.OwnerReference{nm.OwnerRef},
		},
		Spec: clusterv1.MachineSpec{
			ClusterName:       nm.Cluster.Name,
			Version:           nm.Version,
			FailureDomain:     nm.FailureDomain,
			Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To(data.Name)},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: nm.InfraTemplate.APIGroup, Kind: infra.GetKind(), Name: infra.GetName()},
			MinReadySeconds:   ptr.To[int32](0),
			Deletion:          nm.Deletion,
		},
	}
	if err := c.Create(ctx, machine); err != nil {
		cleanUp(ctx, c, data, infra)
		return nil, fmt.Errorf("creating machine %s: %w", nm.Name, err)
	}
	fp.Hit(FailpointAfterMachine)

	before := data.DeepCopy()
	data.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(machine, clusterv1.GroupVersion.WithKind("Machine"))}
	if err := c.Patch(ctx, data, client.MergeFrom(before)); err != nil {
		return machine, fmt.Errorf("handing the bootstrap data of machine %s to the machine: %w", nm.Name, err)
	}
	return machine, nil
}

// withBootstrapHooks adds the deletion hooks (I5) to the annotations of a
// machine whose bootstrap data starts a new etcd cluster. Its member is a
// voter from its first moment, and the only copy of etcd: deleted before
// the planner's AddHook step, which on a loaded host took minutes to land,
// the machine took etcd with it. Every other machine joins as a learner and
// gets the hooks before its promotion.
func withBootstrapHooks(annotations map[string]string, doc *bootstrap.Document) map[string]string {
	if doc == nil || doc.Etcd.Local == nil || doc.Etcd.Local.Mode != bootstrap.EtcdModeNew {
		return annotations
	}
	out := maps.Clone(annotations)
	if out == nil {
		out = map[string]string{}
	}
	for _, hook := range quorum.HookAnnotations {
		out[hook] = ""
	}
	return out
}

// cloneInfrastructure creates the machine's infrastructure machine from
// the template, owned by the owner (CAPI core moves it to the Machine, as
// it does for KubeadmControlPlane).
func cloneInfrastructure(ctx context.Context, c client.Client, nm NewMachine) (*unstructured.Unstructured, error) {
	tmpl, err := external.GetObjectFromContractVersionedRef(ctx, c, nm.InfraTemplate, nm.Owner.GetNamespace())
	if err != nil {
		return nil, err
	}
	owner := nm.OwnerRef
	if nm.InfraOwnerRef != nil {
		owner = *nm.InfraOwnerRef
	}
	infra, err := external.GenerateTemplate(&external.GenerateTemplateInput{
		Template:    tmpl,
		TemplateRef: &corev1.ObjectReference{APIVersion: tmpl.GetAPIVersion(), Kind: tmpl.GetKind(), Name: tmpl.GetName(), Namespace: tmpl.GetNamespace()},
		Namespace:   nm.Owner.GetNamespace(), Name: nm.Name, ClusterName: nm.Cluster.Name, OwnerRef: &owner,
		Labels: nm.Labels, Annotations: nm.InfraAnnotations,
	})
	if err != nil {
		return nil, err
	}
	if err := c.Create(ctx, infra); err != nil {
		return nil, err
	}
	return infra, nil
}

// cleanUp deletes what a failed CreateMachine made; what it cannot delete
// the owner still owns, and garbage collection takes with it.
func cleanUp(ctx context.Context, c client.Client, objs ...client.Object) {
	for _, o := range objs {
		if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			log.FromContext(ctx).Error(err, "Cleaning up after a failed machine creation", "object", o.GetName())
		}
	}
}

// BootstrapDataSecret returns the bootstrap data Secret of machine: doc in
// the agent's format under CAPI's "value" key, owned by the Machine, named
// after it. The caller names it in the Machine's
// spec.bootstrap.dataSecretName.
func BootstrapDataSecret(machine *clusterv1.Machine, doc *bootstrap.Document) (*corev1.Secret, error) {
	data, err := bootstrap.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("bootstrap data of machine %s: %w", machine.Name, err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: BootstrapDataSecretName(machine.Name), Namespace: machine.Namespace,
			Labels:          map[string]string{clusterv1.ClusterNameLabel: machine.Spec.ClusterName},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(machine, clusterv1.GroupVersion.WithKind("Machine"))},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": data, "format": []byte(bootstrap.Format)},
	}, nil
}

// BootstrapDataSecretName is the name of machine's bootstrap data Secret.
func BootstrapDataSecretName(machine string) string { return machine + "-bootstrap" }
