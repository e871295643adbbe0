package controlplane

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/exp/topology/scope"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
)

// DefaultHealthCheckTimeout is how long a control plane machine's Node may
// be not Ready, or one of its components unhealthy, before the control
// plane's MachineHealthCheck marks it.
const DefaultHealthCheckTimeout = 40 * time.Second

// healthCheckNodeStartup bounds how long a machine may take to register its
// Node; a process machine's takes seconds.
const healthCheckNodeStartup = 5 * time.Minute

// HealthCheckName is the name of the MachineHealthCheck QCP keeps for a
// control plane. It is not the control plane's own name, which is the one
// CAPI's topology controller gives the health check a ClusterClass defines:
// that controller deletes its object by name, without a UID precondition, so
// a reconcile of its on a stale cache could delete QCP's health check if the
// two shared a name.
func HealthCheckName(controlPlane string) string { return controlPlane + "-qcp" }

// ensureHealthCheck keeps the control plane's own MachineHealthCheck
// (HealthCheckName), owned by it, while spec.remediation.autorepair is on,
// and deletes it when it is off. It checks Node Ready and the agent's
// component conditions, and its trigger never asks for more unhealthy
// machines than etcd tolerates: the control plane remediates itself (no
// remediation template), one machine at a time.
//
// When CAPI's topology controller keeps a health check for the control plane
// (the Cluster's ClusterClass defines one), QCP keeps none: both would
// select its machines, and CAPI forbids overlapping health checks.
// Remediation then consumes the topology's marks as it consumes its own. It
// returns what it waits for, if anything: the ClusterClass to be readable,
// or the topology controller to delete a health check the class no longer
// defines.
func (r *Reconciler) ensureHealthCheck(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane) (string, error) {
	mhc := &clusterv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Name: HealthCheckName(cp.Name), Namespace: cp.Namespace}}
	// Before this name, QCP named its health check after the control plane.
	if err := r.deleteOwnHealthCheck(ctx, cp, cp.Name, "QCP's health check is now named "+mhc.Name); err != nil {
		return "", err
	}
	topology, err := r.topologyKeepsHealthCheck(ctx, cluster)
	if err != nil {
		// Only the health check waits for the class (its watch wakes the
		// control plane); the rest of the control plane goes on.
		return fmt.Sprintf("Leaving MachineHealthCheck %s as it is: %v", mhc.Name, err), nil
	}
	if !ptr.Deref(cp.Spec.Remediation.Autorepair, true) || topology {
		why := "spec.remediation.autorepair is false"
		if topology {
			why = "the Cluster's ClusterClass defines the control plane's health check"
		}
		return "", r.deleteOwnHealthCheck(ctx, cp, mhc.Name, why)
	}
	byTopology := &clusterv1.MachineHealthCheck{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: cp.Name}, byTopology); err == nil {
		if _, ok := byTopology.Labels[clusterv1.ClusterTopologyOwnedLabel]; ok {
			return fmt.Sprintf("Waiting for the topology controller to delete MachineHealthCheck %s, which the ClusterClass no longer defines, before QCP creates its own", cp.Name), nil
		}
	} else if !apierrors.IsNotFound(err) {
		return "", err
	}
	op, err := controllerutil.CreateOrPatch(ctx, r.Client, mhc, func() error {
		if mhc.ResourceVersion != "" && !metav1.IsControlledBy(mhc, cp) {
			return fmt.Errorf("a MachineHealthCheck named %s exists and QCP does not own it: rename it, or set spec.remediation.autorepair to false", mhc.Name)
		}
		if err := controllerutil.SetControllerReference(cp, mhc, r.Client.Scheme()); err != nil {
			return err
		}
		mhc.Spec = healthCheckSpec(cluster, cp, r.healthCheckTimeout())
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("keeping the control plane's MachineHealthCheck: %w", err)
	}
	if op != controllerutil.OperationResultNone {
		r.Recorder.Eventf(cp, corev1.EventTypeNormal, "HealthCheck", "MachineHealthCheck %s %s", mhc.Name, op)
	}
	return "", nil
}

// deleteOwnHealthCheck deletes the MachineHealthCheck called name if the
// control plane controls it, with an event that says why.
func (r *Reconciler) deleteOwnHealthCheck(ctx context.Context, cp *controlplanev1.QuorumControlPlane, name, why string) error {
	mhc := &clusterv1.MachineHealthCheck{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: name}, mhc); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(mhc, cp) {
		return nil
	}
	if err := r.Client.Delete(ctx, mhc, client.Preconditions{UID: &mhc.UID}); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.Recorder.Eventf(cp, corev1.EventTypeNormal, "HealthCheck", "MachineHealthCheck %s deleted: %s", name, why)
	return nil
}

// topologyKeepsHealthCheck reports whether CAPI's topology controller keeps a
// MachineHealthCheck for the cluster's control plane, by CAPI's own rule:
// the ClusterClass or the Cluster's topology defines one, and the Cluster
// does not disable it.
func (r *Reconciler) topologyKeepsHealthCheck(ctx context.Context, cluster *clusterv1.Cluster) (bool, error) {
	t := cluster.Spec.Topology
	if !t.IsDefined() {
		return false, nil
	}
	class := &clusterv1.ClusterClass{}
	key := client.ObjectKey{Namespace: cmp.Or(t.ClassRef.Namespace, cluster.Namespace), Name: t.ClassRef.Name}
	if err := r.Client.Get(ctx, key, class); err != nil {
		return false, fmt.Errorf("reading ClusterClass %s, to tell whether it defines the control plane's health check: %w", key, err)
	}
	blueprint := scope.ClusterBlueprint{Topology: t, ClusterClass: class}
	return blueprint.IsControlPlaneMachineHealthCheckEnabled(), nil
}

func (r *Reconciler) healthCheckTimeout() time.Duration {
	return cmp.Or(r.HealthCheckTimeout, DefaultHealthCheckTimeout)
}

// healthCheckSpec is the MachineHealthCheck QCP wants for cp.
func healthCheckSpec(cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, timeout time.Duration) clusterv1.MachineHealthCheckSpec {
	seconds := ptr.To(int32(timeout / time.Second))
	checks := clusterv1.MachineHealthCheckChecks{NodeStartupTimeoutSeconds: ptr.To(int32(healthCheckNodeStartup / time.Second))}
	for _, status := range []corev1.ConditionStatus{corev1.ConditionFalse, corev1.ConditionUnknown} {
		checks.UnhealthyNodeConditions = append(checks.UnhealthyNodeConditions,
			clusterv1.UnhealthyNodeCondition{Type: corev1.NodeReady, Status: status, TimeoutSeconds: seconds})
	}
	for _, c := range slices.Sorted(maps.Values(agent.ComponentConditionTypes)) {
		checks.UnhealthyNodeConditions = append(checks.UnhealthyNodeConditions,
			clusterv1.UnhealthyNodeCondition{Type: c, Status: corev1.ConditionFalse, TimeoutSeconds: seconds})
	}
	replicas := int(ptr.Deref(cp.Spec.Replicas, 1))
	// etcd tolerates (n-1)/2 failures; marking more at once could only
	// ask for what the control plane would refuse anyway. With external
	// etcd the machines hold no member: all but one may be marked, the
	// planner deleting them one at a time while another serves.
	tolerated := (replicas - 1) / 2
	if !cp.Spec.Etcd.IsStacked() {
		tolerated = replicas - 1
	}
	return clusterv1.MachineHealthCheckSpec{
		ClusterName: cluster.Name,
		Selector: metav1.LabelSelector{MatchLabels: map[string]string{
			clusterv1.ClusterNameLabel: cluster.Name, clusterv1.MachineControlPlaneLabel: "", clusterv1.MachineControlPlaneNameLabel: cp.Name,
		}},
		Checks: checks,
		Remediation: clusterv1.MachineHealthCheckRemediation{TriggerIf: clusterv1.MachineHealthCheckRemediationTriggerIf{
			UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromInt(max(tolerated, 0))),
		}},
	}
}
