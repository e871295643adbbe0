package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// restoring reports whether cp's etcd is still to be restored from
// spec.restore: set, and etcd never had data (the control plane is not
// initialized, and no machine was adopted).
func restoring(cp *controlplanev1.QuorumControlPlane) bool {
	return cp.Spec.Restore != nil && cp.Spec.Etcd.IsStacked() && !ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false) && !etcdBootstrapped(cp)
}

// resolveRestore finds and checks cp's snapshot while etcd is still to be
// restored, and puts its certificate authorities, if the backup holds
// them, in place before any are generated. It returns nil, nil when there
// is nothing to restore; an error is the source's fault, and is set in the
// Restored condition.
func (r *Reconciler) resolveRestore(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane) (*engine.Restore, error) {
	if !restoring(cp) {
		return nil, nil
	}
	res, err := engine.ResolveRestore(ctx, r.Client, cp, "QuorumControlPlane", cp.Spec.Restore, cp.Spec.Backup, r.Now())
	if err == nil && res.Authorities != nil {
		err = r.restoreAuthorities(ctx, cluster, cp, res.Authorities)
	}
	if err != nil {
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionFalse,
			Reason: controlplanev1.RestoreSourceInvalidReason, Message: "No machine is created until the snapshot can be restored: " + err.Error()})
		return nil, err
	}
	if engine.ReadRestoreRecord(cp) == nil {
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.RestoringReason,
			Message: fmt.Sprintf("Snapshot %s (revision %d) is found and checked; the first machine restores it", res.Manifest.Snapshot, res.Manifest.Revision)})
	}
	return res, nil
}

// restoreAuthorities creates the cluster's authority Secrets from a
// backup's, so that the restored cluster keeps its credentials: CAPI's
// names, type and label, owned by cp, as EnsureCertificateAuthorities makes
// them. A Secret that exists must hold the backup's authority: the restore
// never replaces one, nor starts beside another.
func (r *Reconciler) restoreAuthorities(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, cas backup.Authorities) error {
	for _, purpose := range slices.Sorted(maps.Keys(cas)) {
		name := secret.Name(cluster.Name, secret.Purpose(purpose))
		var have corev1.Secret
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, &have)
		switch {
		case err == nil:
			if !bytes.Equal(have.Data[secret.TLSCrtDataName], cas[purpose][secret.TLSCrtDataName]) {
				return fmt.Errorf("Secret %s/%s holds another certificate authority than the backup's: the restore would cut the old credentials off; delete the Secret, and QCP puts the backup's in its place",
					cluster.Namespace, name)
			}
			continue
		case !apierrors.IsNotFound(err):
			return err
		}
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: name,
				Labels:          map[string]string{clusterv1.ClusterNameLabel: cluster.Name},
				OwnerReferences: []metav1.OwnerReference{controlPlaneOwnerRef(cp)}},
			Type: clusterv1.ClusterSecretType,
			Data: cas[purpose],
		}
		if err := r.Client.Create(ctx, s); err != nil {
			return fmt.Errorf("creating Secret %s/%s from the backup's certificate authority: %w", cluster.Namespace, name, err)
		}
		r.Recorder.Eventf(cp, corev1.EventTypeNormal, "AuthorityRestored", "Created Secret %s from the certificate authority in the backup", name)
	}
	return nil
}

// recordRestore writes the restore the first machine is created with on
// cp, before the machine exists.
func (r *Reconciler) recordRestore(ctx context.Context, cp *controlplanev1.QuorumControlPlane, res *engine.Restore) error {
	b, err := json.Marshal(res.Record(r.Now()))
	if err != nil {
		return err
	}
	if err := r.annotateNow(ctx, cp, engine.RestoreRecordAnnotation, string(b)); err != nil {
		return fmt.Errorf("recording the restore of snapshot %s before creating the first machine: %w", res.Manifest.Snapshot, err)
	}
	r.Recorder.Eventf(cp, corev1.EventTypeNormal, "Restoring", "Creating the first machine from snapshot %s (revision %d)", res.Manifest.Snapshot, res.Manifest.Revision)
	return nil
}

// removeDepartedNodes deletes the workload Nodes that the restored data
// brought along: created before the restore, and no Machine of the cluster
// has them. Their Leases in kube-node-lease go with them. The names are
// added to the restore's record.
func (r *Reconciler) removeDepartedNodes(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, obs *observation) error {
	rec := engine.ReadRestoreRecord(cp)
	if rec == nil || rec.Time == nil || !obs.initialized || obs.nodes == nil {
		return nil
	}
	var machines clusterv1.MachineList
	if err := r.Client.List(ctx, &machines, client.InNamespace(cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}); err != nil {
		return err
	}
	kept := map[string]bool{}
	for _, m := range machines.Items {
		kept[m.Name] = true
		if m.Status.NodeRef.IsDefined() {
			kept[m.Status.NodeRef.Name] = true
		}
	}
	var departed []string
	for name, n := range obs.nodes {
		if !kept[name] && n.CreationTimestamp.Before(rec.Time) {
			departed = append(departed, name)
		}
	}
	if len(departed) == 0 {
		return nil
	}
	slices.Sort(departed)
	cs, err := r.directWorkloadClient(ctx, cluster)
	if err != nil {
		return err
	}
	for _, name := range departed {
		if err := cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Node %s, of a machine from before the restore: %w", name, err)
		}
		if err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting the Lease of Node %s: %w", name, err)
		}
		log.FromContext(ctx).Info("Deleted a Node of a machine from before the restore", "node", name)
		r.Recorder.Eventf(cp, corev1.EventTypeNormal, "DepartedNodeRemoved", "Deleted Node %s: its machine is from before the restore, and no longer exists", name)
	}
	rec.NodesRemoved = append(rec.NodesRemoved, departed...)
	if len(rec.NodesRemoved) > 100 {
		rec.NodesRemoved = rec.NodesRemoved[len(rec.NodesRemoved)-100:]
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return r.annotateNow(ctx, cp, engine.RestoreRecordAnnotation, string(b))
}

// setRestoreStatus sets status.restore and the Restored condition from
// the record, once the first machine was created to restore; a source
// that cannot be used set the condition already (resolveRestore).
func setRestoreStatus(cp *controlplanev1.QuorumControlPlane) {
	rec := engine.ReadRestoreRecord(cp)
	cp.Status.Restore = rec
	switch {
	case cp.Spec.Restore == nil:
		conditions.Delete(cp, controlplanev1.RestoredCondition)
	case rec == nil:
		// resolveRestore set it: the source's fault, or found.
	case !ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false):
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.RestoringReason,
			Message: fmt.Sprintf("The first machine restores snapshot %s (revision %d) and starts at revision %d", rec.Object, rec.Revision, rec.StartRevision)})
	case rec.Authorities == controlplanev1.RestoredAuthorities:
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.RestoredReason,
			Message: fmt.Sprintf("Restored snapshot %s (revision %d), starting at revision %d, with the certificate authorities from the backup: existing credentials keep working",
				rec.Object, rec.Revision, rec.StartRevision)})
	default:
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.RestoredNewAuthoritiesReason,
			Message: fmt.Sprintf("Restored snapshot %s (revision %d), starting at revision %d, with new certificate authorities: the backup was not encrypted, so it holds none; credentials issued before the restore (client certificates, service-account tokens) no longer work",
				rec.Object, rec.Revision, rec.StartRevision)})
	}
}

// restorePoll is how often a restore whose snapshot cannot be used looks
// again: no watch tells of a fixed store or Secret.
const restorePoll = 15 * time.Second

// authoritySecrets are the Secrets of cluster's authorities by purpose,
// which an encrypted backup stores beside each snapshot.
func authoritySecrets(cluster string) map[string]string {
	out := map[string]string{}
	for _, p := range []secret.Purpose{secret.ClusterCA, secret.EtcdCA, secret.FrontProxyCA, secret.ServiceAccount} {
		out[string(p)] = secret.Name(cluster, p)
	}
	return out
}
