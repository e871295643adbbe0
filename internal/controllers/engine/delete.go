package engine

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// ReleaseAndDelete removes the quorum hook from m (the whole etcd cluster
// goes with its owner, so no member needs protecting) and deletes it; what
// names the owner's kind in the event.
func ReleaseAndDelete(ctx context.Context, c client.Client, rec record.EventRecorder, m *clusterv1.Machine, what string) error {
	if quorum.HasHook(m.Annotations) {
		before := m.DeepCopy()
		for _, hook := range quorum.HookAnnotations {
			delete(m.Annotations, hook)
		}
		if err := c.Patch(ctx, m, client.MergeFrom(before)); err != nil {
			return fmt.Errorf("releasing the hook of machine %s: %w", m.Name, err)
		}
	}
	if !m.DeletionTimestamp.IsZero() {
		return nil
	}
	if err := c.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting machine %s: %w", m.Name, err)
	}
	rec.Eventf(m, corev1.EventTypeNormal, "DeletingMachine", "Deleting %s machine %s with its %s", what, m.Name, what)
	return nil
}

// EtcdMachines selects the machines of an EtcdCluster.
func EtcdMachines(m *clusterv1.Machine) bool {
	_, ok := m.Labels[etcdv1.EtcdClusterNameLabel]
	return ok
}
