package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// restoring reports whether cp's etcd is still to be restored from
// spec.restore: set, and etcd never had data (the control plane is not
// initialized, and no machine was adopted).
func restoring(cp *controlplanev1.QuorumControlPlane) bool {
	return cp.Spec.Restore != nil && cp.Spec.Etcd.IsStacked() && !ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false) && !etcdBootstrapped(cp)
}

// resolveRestore is engine.PrepareRestore for cp while its etcd is still
// to be restored; nil, nil when there is nothing to restore.
func (r *Reconciler) resolveRestore(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane) (*engine.Restore, error) {
	if !restoring(cp) {
		return nil, nil
	}
	return engine.PrepareRestore(ctx, r.Client, r.Recorder, cp, controlPlaneOwnerRef(cp), "QuorumControlPlane", cluster, cp.Spec.Restore, cp.Spec.Backup, r.Now())
}

// removeDepartedNodes deletes the workload Nodes that the restored data
// brought along: created before the restore, and no Machine of the cluster
// has them. Their Leases in kube-node-lease go with them. The names are
// added to the restore's record.
func (r *Reconciler) removeDepartedNodes(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, obs *observation) error {
	var restoredAt *metav1.Time
	if rec := engine.ReadRestoreRecord(cp); rec != nil {
		restoredAt = rec.Time
	}
	if rec := engine.ReadRecovery(cp); rec != nil && rec.Snapshot != "" && rec.FinishTime != nil {
		restoredAt = rec.StartTime // a recovery from a backup restored data from before it too
	}
	if restoredAt == nil || !obs.initialized || obs.nodes == nil {
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
		if !kept[name] && n.CreationTimestamp.Before(restoredAt) {
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
	rec := engine.ReadRestoreRecord(cp)
	if rec == nil {
		return nil // a recovery's: its event and log name them
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

// authoritySecrets are the Secrets of cluster's authorities by purpose,
// which an encrypted backup stores beside each snapshot.
func authoritySecrets(cluster string) map[string]string {
	out := map[string]string{}
	for _, p := range []secret.Purpose{secret.ClusterCA, secret.EtcdCA, secret.FrontProxyCA, secret.ServiceAccount} {
		out[string(p)] = secret.Name(cluster, p)
	}
	return out
}
