package process

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/paused"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// pausedWhileDeleting is paused.EnsurePausedCondition for an object being
// deleted: a paused cluster's processes are not stopped either, as CAPI's
// contract asks of every provider. The Cluster is looked up by name because
// the object's owner (a Machine) may already be gone; a Cluster that is gone
// pauses nothing.
func pausedWhileDeleting(ctx context.Context, c client.Client, namespace, clusterName string, obj paused.ConditionSetter) (isPaused, requeue bool, err error) {
	if clusterName == "" {
		return false, false, nil
	}
	cluster := &clusterv1.Cluster{}
	err = c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: clusterName}, cluster)
	if apierrors.IsNotFound(err) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("reading cluster %s of deleted %s: %w", clusterName, obj.GetName(), err)
	}
	return paused.EnsurePausedCondition(ctx, c, cluster, obj)
}
