package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// reconcileDelete deletes the control plane: first it waits until the
// cluster's worker machines are gone (they need the API server to drain),
// then it releases its machines' hooks and deletes them, and only when
// they are gone does it let the QuorumControlPlane go.
func (r *Reconciler) reconcileDelete(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane) (ctrl.Result, error) {
	all, err := collections.GetFilteredMachinesForCluster(ctx, r.APIReader, cluster)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the machines of cluster %s: %w", klogRef(cluster), err)
	}
	// An EtcdCluster's machines are not workers: they go after the
	// control plane, whose data they hold.
	if workers := all.Filter(collections.Not(collections.ControlPlaneMachines(cluster.Name)), collections.Not(engine.EtcdMachines)); workers.Len() > 0 {
		setDeleting(cp, controlplanev1.DeletingWaitingForWorkersReason,
			fmt.Sprintf("Waiting for worker machines to be deleted: %s", strings.Join(sortedNames(workers), ", ")))
		return ctrl.Result{}, nil
	}
	mine := all.Filter(collections.ControlPlaneMachines(cluster.Name), collections.OwnedMachines(cp, controlplanev1.GroupVersion.WithKind("QuorumControlPlane").GroupKind()))
	for _, m := range mine.UnsortedList() {
		if err := engine.ReleaseAndDelete(ctx, r.Client, r.Recorder, m, "control plane"); err != nil {
			return ctrl.Result{}, err
		}
	}
	if mine.Len() > 0 {
		setDeleting(cp, controlplanev1.DeletingWaitingForMachinesReason,
			fmt.Sprintf("Waiting for control plane machines to be deleted: %s", strings.Join(sortedNames(mine), ", ")))
		return ctrl.Result{}, nil
	}
	if err := errors.Join(r.Etcd.Forget(klogRef(cluster)), r.Etcd.Forget(externalPoolKey(cluster))); err != nil {
		return ctrl.Result{}, err
	}
	r.agentClients.Forget(klogRef(cluster))
	r.externalPairs.Delete(externalPoolKey(cluster))
	setDeleting(cp, controlplanev1.DeletionCompletedReason, "")
	controllerutil.RemoveFinalizer(cp, controlplanev1.QuorumControlPlaneFinalizer)
	r.Recorder.Event(cp, corev1.EventTypeNormal, "Deleted", "Every control plane machine is gone")
	return ctrl.Result{}, nil
}

func setDeleting(cp *controlplanev1.QuorumControlPlane, reason, msg string) {
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.DeletingCondition, Status: metav1.ConditionTrue, Reason: reason, Message: msg})
}

func sortedNames(ms collections.Machines) []string {
	out := []string{}
	for _, m := range engine.SortedByName(ms.UnsortedList()) {
		out = append(out, m.Name)
	}
	return out
}
