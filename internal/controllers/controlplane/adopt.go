package controlplane

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// EtcdBootstrappedAnnotation on a control plane records that its etcd
// holds data QCP may never have seen: it adopted a machine that runs a
// member. The planner's Bootstrapped is otherwise "initialized, or a
// member seen", and an adopted machine carries no records of QCP's; if QCP
// cannot read its etcd (a migration from KCP where the manager reaches
// only the API server's port), the machine would look like a first
// machine that failed to bootstrap, and be deleted with its etcd data.
// With the annotation the planner reports that it cannot see the
// membership instead. Remove it by hand only when no machine holds etcd
// data worth keeping: QCP may then bootstrap a new etcd cluster.
const EtcdBootstrappedAnnotation = "controlplane.cluster.x-k8s.io/qcp-etcd-bootstrapped"

// adoptMachines makes cp the controller of the cluster's control plane
// Machines that have none (made by hand, or left behind by another
// provider), as KCP adopts its machines. An adopted machine keeps running
// as it is: without QCP's spec record it rolls out only for its version
// (see rollout.go). A machine QCP cannot adopt stops the round with an
// error that names it: creating machines beside it would start a second
// etcd cluster.
//
// It returns every Machine of the cluster, read live, the adopted ones as
// their adoption left them: the round observes them without listing them
// again: one live list of Machines a round instead of two (a live list is
// decoded from etcd by the management API server; docs/measurements.md,
// stop 63).
func (r *Reconciler) adoptMachines(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane) (collections.Machines, error) {
	all, err := collections.GetFilteredMachinesForCluster(ctx, r.APIReader, cluster)
	if err != nil {
		return nil, fmt.Errorf("listing the machines of cluster %s: %w", klogRef(cluster), err)
	}
	orphans := all.Filter(collections.AdoptableControlPlaneMachines(cluster.Name))
	var refused []error
	for _, m := range engine.SortedByName(orphans.UnsortedList()) {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		if why := adoptionRefusal(m, cp); why != "" {
			r.Recorder.Eventf(cp, corev1.EventTypeWarning, "AdoptionRefused", "Not adopting machine %s: %s", m.Name, why)
			refused = append(refused, fmt.Errorf("not adopting machine %s: %s", m.Name, why))
			continue
		}
		if err := r.markEtcdBootstrapped(ctx, cp, m); err != nil {
			return nil, err
		}
		if err := r.adopt(ctx, cp, m); err != nil {
			return nil, err
		}
		log.FromContext(ctx).Info("Adopted machine", "Machine", klogRef(m))
		r.Recorder.Eventf(cp, corev1.EventTypeNormal, "Adopted", "Adopted machine %s", m.Name)
	}
	return all, errors.Join(refused...)
}

// markEtcdBootstrapped writes EtcdBootstrappedAnnotation on cp before m is
// adopted, not with the round's deferred status patch: a crash in between
// would leave an adopted machine that the next round takes for a first
// machine that never bootstrapped. With external etcd the machines run no
// member, and there is nothing to protect.
func (r *Reconciler) markEtcdBootstrapped(ctx context.Context, cp *controlplanev1.QuorumControlPlane, m *clusterv1.Machine) error {
	if _, ok := cp.Annotations[EtcdBootstrappedAnnotation]; ok || !cp.Spec.Etcd.IsStacked() {
		return nil
	}
	if err := r.annotateNow(ctx, cp, EtcdBootstrappedAnnotation, "adopted machine "+m.Name); err != nil {
		return fmt.Errorf("recording on QuorumControlPlane %s that etcd holds data, before adopting machine %s: %w", cp.Name, m.Name, err)
	}
	return nil
}

// annotateNow writes one annotation on cp at once, not with the round's
// deferred status patch, for records that must survive a crash right after
// the step they precede. Only the annotation is patched, from copies, so
// that neither the answer nor the patch touches this round's status in cp;
// the deferred patch then finds the annotation already written. No
// optimistic lock: the record is QCP's own and only the elected manager
// writes it, while cp's resourceVersion moves with every status patch.
func (r *Reconciler) annotateNow(ctx context.Context, cp *controlplanev1.QuorumControlPlane, key, value string) error {
	mark := map[string]string{key: value}
	before, marked := cp.DeepCopy(), cp.DeepCopy()
	marked.Annotations = mergeInto(marked.Annotations, mark)
	if err := r.Client.Patch(ctx, marked, client.MergeFrom(before)); err != nil {
		return err
	}
	cp.Annotations = mergeInto(cp.Annotations, mark)
	return nil
}

// etcdBootstrapped reports whether cp's etcd held data before QCP saw a
// member of it (see EtcdBootstrappedAnnotation).
func etcdBootstrapped(cp *controlplanev1.QuorumControlPlane) bool {
	_, ok := cp.Annotations[EtcdBootstrappedAnnotation]
	return ok
}

// adoptionRefusal says why QCP may not adopt m, or "" if it may: it must
// bootstrap from a data Secret, as QCP's machines do, and run a version
// within one minor of spec.version, the skew a rollout can close.
func adoptionRefusal(m *clusterv1.Machine, cp *controlplanev1.QuorumControlPlane) string {
	if name, ok := m.Labels[clusterv1.MachineControlPlaneNameLabel]; ok && name != cp.Name {
		return fmt.Sprintf("its label %s names control plane %q, not %q; fix the label or delete the machine", clusterv1.MachineControlPlaneNameLabel, name, cp.Name)
	}
	if m.Spec.Bootstrap.DataSecretName == nil || *m.Spec.Bootstrap.DataSecretName == "" {
		return "it has no spec.bootstrap.dataSecretName; QCP adopts machines that bootstrap from a qcp-agent data Secret"
	}
	have, err := utilversion.ParseSemantic(m.Spec.Version)
	if err != nil {
		return fmt.Sprintf("its spec.version %q is not a semantic version", m.Spec.Version)
	}
	want, err := utilversion.ParseSemantic(cp.Spec.Version)
	if err != nil {
		return fmt.Sprintf("the control plane's spec.version %q is not a semantic version", cp.Spec.Version)
	}
	if have.Major() != want.Major() || max(have.Minor(), want.Minor())-min(have.Minor(), want.Minor()) > 1 {
		return fmt.Sprintf("its spec.version %s is more than one minor version from spec.version %s; upgrade it by hand first", m.Spec.Version, cp.Spec.Version)
	}
	return ""
}

// adopt makes cp m's controller and gives m the control plane's name
// label, which the control plane's MachineHealthCheck selects on; an
// unowned bootstrap data Secret goes to m, to be deleted with it.
func (r *Reconciler) adopt(ctx context.Context, cp *controlplanev1.QuorumControlPlane, m *clusterv1.Machine) error {
	before := m.DeepCopy()
	m.OwnerReferences = append(m.OwnerReferences, controlPlaneOwnerRef(cp))
	m.Labels = mergeInto(m.Labels, map[string]string{clusterv1.MachineControlPlaneNameLabel: cp.Name})
	// Optimistic: a machine another controller took meanwhile is not
	// taken from it.
	if err := r.Client.Patch(ctx, m, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("adopting machine %s: %w", m.Name, err)
	}
	data := &corev1.Secret{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: *m.Spec.Bootstrap.DataSecretName}, data); err != nil {
		return client.IgnoreNotFound(err) // the machine has bootstrapped; its data may be gone
	}
	if len(data.OwnerReferences) > 0 {
		return nil
	}
	beforeData := data.DeepCopy()
	data.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(m, clusterv1.GroupVersion.WithKind("Machine"))}
	if err := r.Client.Patch(ctx, data, client.MergeFrom(beforeData)); err != nil {
		return fmt.Errorf("handing the bootstrap data of adopted machine %s to it: %w", m.Name, err)
	}
	return nil
}
