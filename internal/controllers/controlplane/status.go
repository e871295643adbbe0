package controlplane

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// ownedConditions are the conditions this controller writes; the patch
// helper lets them win over a concurrent writer.
var ownedConditions = []string{
	controlplanev1.AvailableCondition, controlplanev1.InitializedCondition, controlplanev1.CertificatesAvailableCondition,
	controlplanev1.EtcdClusterHealthyCondition, controlplanev1.ControlPlaneComponentsHealthyCondition,
	controlplanev1.MachinesReadyCondition, controlplanev1.MachinesUpToDateCondition,
	controlplanev1.ScalingUpCondition, controlplanev1.ScalingDownCondition, controlplanev1.RollingOutCondition, controlplanev1.RemediatingCondition,
	controlplanev1.DeletingCondition,
}

// setStatusBasics sets what needs no observation: the generation seen and
// the scale subresource's selector.
func setStatusBasics(cp *controlplanev1.QuorumControlPlane) {
	cp.Status.ObservedGeneration = cp.Generation
	cp.Status.Selector = fmt.Sprintf("%s,%s=%s", clusterv1.MachineControlPlaneLabel, clusterv1.MachineControlPlaneNameLabel, cp.Name)
}

// setWaitingForInfrastructure reports that nothing can start before the
// infrastructure provider has provisioned the cluster: its failure domains
// and the control plane endpoint its load balancer serves.
func setWaitingForInfrastructure(cp *controlplanev1.QuorumControlPlane, cluster *clusterv1.Cluster) {
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.InitializedCondition, Status: metav1.ConditionFalse,
		Reason:  controlplanev1.WaitingForControlPlaneEndpointReason,
		Message: fmt.Sprintf("Waiting for Cluster %s's infrastructure to be provisioned, with its failure domains and the spec.controlPlaneEndpoint its load balancer serves", cluster.Name)})
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.AvailableCondition, Status: metav1.ConditionFalse,
		Reason: controlplanev1.NotAvailableReason, Message: "Control plane not initialized: the cluster's infrastructure is not provisioned yet"})
}

// setStatus reports an observation and the planner's decision on it.
func setStatus(cp *controlplanev1.QuorumControlPlane, obs *observation, d quorum.Decision, acted bool, now time.Time) {
	setReplicas(cp, obs)
	cp.Status.Etcd.Members = engine.MemberStatuses(&obs.Observation)
	if !acted {
		engine.RecordDecision(&cp.Status.LastOperation, d, now)
	}
	setInitialized(cp, obs)
	setAvailable(cp, obs)
	if obs.external != nil {
		setExternalEtcdHealthy(cp, obs.external)
	} else {
		engine.SetEtcdHealthy(cp, &obs.Observation, d)
	}
	setComponentsHealthy(cp, obs)
	machines := collections.FromMachines(obs.Machines...).UnsortedList()
	setAggregate(cp, machines, clusterv1.ReadyCondition, controlplanev1.MachinesReadyCondition, controlplanev1.MachinesReadyNoReplicasReason)
	setAggregate(cp, machines, clusterv1.MachineUpToDateCondition, controlplanev1.MachinesUpToDateCondition, controlplanev1.MachinesUpToDateNoReplicasReason)
	engine.SetScaling(cp, &obs.Observation, int(ptr.Deref(cp.Spec.Replicas, 1)), d)
	engine.SetRollingOut(cp, &obs.Observation, obs.rollout.outdated, d)
	setRemediating(cp, obs, d)
	engine.SetBackupStatus(cp, cp.Spec.Backup, &obs.Observation, &cp.Status.Backup)
	cp.Status.Recovery = engine.ReadRecovery(cp)
	engine.SetRestoreStatus(cp, cp.Spec.Restore != nil, ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false), obs.restoreErr, &cp.Status.Restore)
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.DeletingCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.NotDeletingReason})
}

func setReplicas(cp *controlplanev1.QuorumControlPlane, obs *observation) {
	var ready, available, upToDate int32
	versions := collections.FromMachines(obs.Machines...)
	for _, m := range obs.Machines {
		if conditions.IsTrue(m, clusterv1.ReadyCondition) {
			ready++
		}
		if conditions.IsTrue(m, clusterv1.AvailableCondition) {
			available++
		}
		if conditions.IsTrue(m, clusterv1.MachineUpToDateCondition) {
			upToDate++
		}
	}
	cp.Status.Replicas = ptr.To(int32(len(obs.Machines)))
	cp.Status.ReadyReplicas, cp.Status.AvailableReplicas, cp.Status.UpToDateReplicas = &ready, &available, &upToDate
	cp.Status.Version = versions.LowestVersion()
	cp.Status.Versions = statusVersions(obs.Machines)
}

// statusVersions counts the machines per Kubernetes version, oldest first,
// as the control plane contract asks: CAPI's topology controller takes the
// control plane to be upgrading while any entry is older than spec.version.
func statusVersions(machines []*clusterv1.Machine) []clusterv1.StatusVersion {
	count := map[string]int32{}
	for _, m := range machines {
		if m.Spec.Version != "" {
			count[m.Spec.Version]++
		}
	}
	if len(count) == 0 {
		return nil
	}
	versions := make([]clusterv1.StatusVersion, 0, len(count))
	for v, n := range count {
		versions = append(versions, clusterv1.StatusVersion{Version: v, Replicas: n})
	}
	slices.SortFunc(versions, func(a, b clusterv1.StatusVersion) int {
		va, errA := utilversion.ParseSemantic(a.Version)
		vb, errB := utilversion.ParseSemantic(b.Version)
		if errA != nil || errB != nil {
			return strings.Compare(a.Version, b.Version)
		}
		switch {
		case va.LessThan(vb):
			return -1
		case vb.LessThan(va):
			return 1
		}
		return 0
	})
	return versions
}

func setInitialized(cp *controlplanev1.QuorumControlPlane, obs *observation) {
	if obs.initialized {
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.InitializedCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.InitializedReason})
		return
	}
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.InitializedCondition, Status: metav1.ConditionFalse,
		Reason: controlplanev1.NotInitializedReason, Message: "Waiting for the first machine's API server to answer through the control plane endpoint"})
}

// setAvailable: the control plane serves when it is initialized and etcd
// has quorum, shown by the linearizable member list it served (external
// etcd: it can be used).
func setAvailable(cp *controlplanev1.QuorumControlPlane, obs *observation) {
	voters, healthy := 0, 0
	for _, mb := range obs.Members {
		if mb.Voter() {
			voters++
			if mb.Healthy {
				healthy++
			}
		}
	}
	msg := ""
	switch {
	case !obs.initialized:
		msg = "Control plane not initialized yet"
	case obs.external != nil:
		msg = obs.external.problem
	case obs.MembersErr != nil:
		msg = "etcd membership cannot be read: " + obs.MembersErr.Error()
	case voters == 0:
		msg = "etcd has no voter"
	}
	if msg != "" {
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.AvailableCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.NotAvailableReason, Message: msg})
		return
	}
	// etcd served the observation's linearizable member list, so a quorum
	// confirmed it (see engine.QuorumMessage).
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.AvailableCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.AvailableReason,
		Message: engine.QuorumMessage(healthy, voters)})
}

// setComponentsHealthy reads each machine's component conditions, which the
// agent sets on its Node, and names every machine and component that is
// not healthy.
func setComponentsHealthy(cp *controlplanev1.QuorumControlPlane, obs *observation) {
	if obs.nodes == nil {
		reason, msg := controlplanev1.ControlPlaneComponentsHealthUnknownReason, "Waiting for the control plane to be initialized"
		if obs.nodesErr != nil {
			reason, msg = controlplanev1.ControlPlaneComponentsConnectionDownReason, obs.nodesErr.Error()
		}
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.ControlPlaneComponentsHealthyCondition, Status: metav1.ConditionUnknown, Reason: reason, Message: msg})
		return
	}
	components := []bootstrap.Component{bootstrap.Etcd, bootstrap.KubeAPIServer, bootstrap.KubeControllerManager, bootstrap.KubeScheduler}
	if obs.external != nil {
		components = components[1:] // the machines run no etcd
	}
	var problems []string
	for _, m := range obs.Machines {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		node := obs.node(m)
		if node == nil {
			problems = append(problems, fmt.Sprintf("* Machine %s: no Node yet", m.Name))
			continue
		}
		for _, c := range components {
			cond := agent.NodeCondition(node, agent.ComponentConditionTypes[c])
			switch {
			case cond == nil:
				problems = append(problems, fmt.Sprintf("* Machine %s: %s not reported yet", m.Name, c))
			case cond.Status != corev1.ConditionTrue:
				problems = append(problems, fmt.Sprintf("* Machine %s: %s: %s", m.Name, c, cond.Message))
			}
		}
	}
	if len(problems) > 0 {
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.ControlPlaneComponentsHealthyCondition, Status: metav1.ConditionFalse,
			Reason: controlplanev1.ControlPlaneComponentsNotHealthyReason, Message: strings.Join(problems, "\n")})
		return
	}
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.ControlPlaneComponentsHealthyCondition, Status: metav1.ConditionTrue,
		Reason: controlplanev1.ControlPlaneComponentsHealthyReason})
}

// setAggregate sets target from the machines' source conditions, with CAPI's
// aggregation (the merge strategy KCP uses for MachinesReady).
func setAggregate(cp *controlplanev1.QuorumControlPlane, machines []*clusterv1.Machine, source, target, noReplicas string) {
	if len(machines) == 0 {
		conditions.Set(cp, metav1.Condition{Type: target, Status: metav1.ConditionTrue, Reason: noReplicas})
		return
	}
	if err := conditions.SetAggregateCondition(machines, cp, source, conditions.TargetConditionType(target)); err != nil {
		conditions.Set(cp, metav1.Condition{Type: target, Status: metav1.ConditionUnknown, Reason: clusterv1.InternalErrorReason,
			Message: "Please check controller logs for errors"})
	}
}
