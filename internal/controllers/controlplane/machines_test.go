package controlplane

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// TestPropagateLeavesAdmittedMachineAlone: a machine as the API server
// stores it, after CAPI's Machine webhook defaulted its node deletion
// timeout (to 10 s, when unset), is what propagate wants, so an unchanged
// control plane patches no machine. (The timeout, unset in the control
// plane and defaulted by the webhook, once made every reconcile patch every
// machine.) A timeout the control plane sets is still propagated.
func TestPropagateLeavesAdmittedMachineAlone(t *testing.T) {
	for _, set := range []*int32{nil, ptr.To[int32](30)} {
		cp := rolloutControlPlane()
		cp.Spec.MachineTemplate.Spec.Deletion = controlplanev1.QuorumControlPlaneMachineTemplateDeletionSpec{NodeDeletionTimeoutSeconds: set, NodeDrainTimeoutSeconds: ptr.To[int32](5)}
		m := &clusterv1.Machine{Spec: clusterv1.MachineSpec{Deletion: machineDeletion(cp)}}
		// What CAPI's Machine webhook does on create and update.
		if m.Spec.Deletion.NodeDeletionTimeoutSeconds == nil {
			m.Spec.Deletion.NodeDeletionTimeoutSeconds = ptr.To[int32](10)
		}
		propagate(m, cp, nil)
		admitted := m.DeepCopy()
		propagate(m, cp, nil)
		if !apiequality.Semantic.DeepEqual(admitted, m) {
			t.Errorf("with timeout %v: propagate changed the admitted machine's deletion %+v to %+v", ptr.Deref(set, -1), admitted.Spec.Deletion, m.Spec.Deletion)
		}
		if want := ptr.Deref(set, 10); ptr.Deref(m.Spec.Deletion.NodeDeletionTimeoutSeconds, 0) != want {
			t.Errorf("node deletion timeout %v, want %d", ptr.Deref(m.Spec.Deletion.NodeDeletionTimeoutSeconds, 0), want)
		}
	}
}

// TestPropagateReadinessGatesAndTaints: the template's readiness gates and
// taints reach the machines in place, and so does their removal, as CAPI's
// contract expects of fields the topology controller writes.
func TestPropagateReadinessGatesAndTaints(t *testing.T) {
	cp := rolloutControlPlane()
	cp.Spec.MachineTemplate.Spec.ReadinessGates = []clusterv1.MachineReadinessGate{{ConditionType: "example.com/Ready"}}
	cp.Spec.MachineTemplate.Spec.Taints = []clusterv1.MachineTaint{{Key: "example.com/dedicated", Effect: corev1.TaintEffectNoSchedule, Propagation: clusterv1.MachineTaintPropagationAlways}}
	m := &clusterv1.Machine{}
	propagate(m, cp, nil)
	if !apiequality.Semantic.DeepEqual(m.Spec.ReadinessGates, cp.Spec.MachineTemplate.Spec.ReadinessGates) ||
		!apiequality.Semantic.DeepEqual(m.Spec.Taints, cp.Spec.MachineTemplate.Spec.Taints) {
		t.Errorf("machine has readiness gates %+v and taints %+v; want the template's", m.Spec.ReadinessGates, m.Spec.Taints)
	}
	cp.Spec.MachineTemplate.Spec.ReadinessGates, cp.Spec.MachineTemplate.Spec.Taints = nil, nil
	propagate(m, cp, nil)
	if len(m.Spec.ReadinessGates) != 0 || len(m.Spec.Taints) != 0 {
		t.Errorf("after their removal from the template the machine keeps readiness gates %+v and taints %+v", m.Spec.ReadinessGates, m.Spec.Taints)
	}
}
