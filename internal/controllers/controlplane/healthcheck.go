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

// ensureHealthCheck keeps the control plane's own MachineHealthCheck, named
// after it and owned by it, while spec.remediation.autorepair is on, and
// deletes it when it is off. It checks Node Ready and the agent's
// component conditions, and its trigger never asks for more unhealthy
// machines than etcd tolerates: the control plane remediates itself (no
// remediation template), one machine at a time.
func (r *Reconciler) ensureHealthCheck(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane) error {
	mhc := &clusterv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Name: cp.Name, Namespace: cp.Namespace}}
	if !ptr.Deref(cp.Spec.Remediation.Autorepair, true) {
		if err := r.Client.Get(ctx, client.ObjectKeyFromObject(mhc), mhc); err != nil {
			return client.IgnoreNotFound(err)
		}
		if !metav1.IsControlledBy(mhc, cp) {
			return nil
		}
		return client.IgnoreNotFound(r.Client.Delete(ctx, mhc))
	}
	op, err := controllerutil.CreateOrPatch(ctx, r.Client, mhc, func() error {
		if err := controllerutil.SetControllerReference(cp, mhc, r.Client.Scheme()); err != nil {
			return err
		}
		mhc.Spec = healthCheckSpec(cluster, cp, r.healthCheckTimeout())
		return nil
	})
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("a MachineHealthCheck named %s exists and QCP does not own it: rename it, or set spec.remediation.autorepair to false", cp.Name)
		}
		return fmt.Errorf("keeping the control plane's MachineHealthCheck: %w", err)
	}
	if op != controllerutil.OperationResultNone {
		r.Recorder.Eventf(cp, corev1.EventTypeNormal, "HealthCheck", "MachineHealthCheck %s %s", mhc.Name, op)
	}
	return nil
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
