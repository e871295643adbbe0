package process

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
)

// DeletingReason is the Ready reason while an object is being deleted.
const DeletingReason = "Deleting"

// setReady sets the Ready condition CAPI core mirrors into the Machine's or
// Cluster's InfrastructureReady: a copy of the condition that says what the
// object waits for, or Deleting while it is deleted, so that a user reading
// the Machine sees the provider's own reason and message.
func setReady(obj conditions.Setter, from string, deleting bool) {
	ready := metav1.Condition{Type: clusterv1.ReadyCondition, Status: metav1.ConditionUnknown, Reason: "Unknown",
		Message: "Not reconciled yet"}
	if c := conditions.Get(obj, from); c != nil {
		ready.Status, ready.Reason, ready.Message = c.Status, c.Reason, c.Message
	}
	if deleting {
		ready = metav1.Condition{Type: clusterv1.ReadyCondition, Status: metav1.ConditionFalse, Reason: DeletingReason,
			Message: "Stopping the processes and removing the directory"}
	}
	conditions.Set(obj, ready)
}
