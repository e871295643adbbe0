package etcdcluster

import (
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// ownedConditions are the conditions this controller writes.
var ownedConditions = []string{
	etcdv1.AvailableCondition, etcdv1.EtcdCACertificatesAvailableCondition, etcdv1.EtcdInitializedCondition,
	etcdv1.EtcdClusterHealthyCondition, etcdv1.ScalingUpCondition, etcdv1.ScalingDownCondition, etcdv1.RollingOutCondition,
	etcdv1.DeletingCondition,
}

// setStatus reports an observation and the planner's decision on it,
// including the contract fields control plane providers read.
func setStatus(ec *etcdv1.EtcdCluster, obs *observation, d quorum.Decision, acted bool, now time.Time) {
	if !acted {
		engine.RecordDecision(&ec.Status.LastOperation, d, now)
	}
	desired := int(ptr.Deref(ec.Spec.Replicas, 3))
	var ready, upToDate int32
	var lowest *utilversion.Version
	for _, m := range obs.Machines {
		if mb, ok := obs.MemberOn(m); ok && mb.Voter() && mb.Healthy {
			ready++
		}
		if len(obs.rollout.outdated(m)) == 0 {
			upToDate++
		}
		if had, ok := recordedSpec(m); ok {
			if v, err := utilversion.ParseSemantic(had.Version); err == nil && (lowest == nil || v.LessThan(lowest)) {
				lowest, ec.Status.Version = v, had.Version
			}
		}
	}
	ec.Status.Replicas = ptr.To(int32(len(obs.Machines)))
	ec.Status.ReadyReplicas, ec.Status.UpToDateReplicas = &ready, &upToDate
	if obs.MembersErr == nil {
		ec.Status.Members = engine.MemberStatuses(&obs.Observation)
		setContract(ec, obs, desired)
	} else {
		// Nothing answers: not ready, and availability unknown, until a
		// member does. initialized, creationComplete and the endpoints stay.
		ec.Status.Ready = false
		conditions.Set(ec, metav1.Condition{Type: etcdv1.AvailableCondition, Status: metav1.ConditionUnknown, Reason: etcdv1.NotAvailableReason,
			Message: "Cannot observe etcd: " + obs.MembersErr.Error()})
		setInitialized(ec)
	}
	engine.SetEtcdHealthy(ec, &obs.Observation, d)
	engine.SetScaling(ec, &obs.Observation, desired, d)
	engine.SetRollingOut(ec, &obs.Observation, obs.rollout.outdated, d)
	engine.SetBackupStatus(ec, ec.Spec.Backup, &obs.Observation, &ec.Status.Backup)
	ec.Status.Recovery = engine.ReadRecovery(ec)
	engine.SetRestoreStatus(ec, ec.Spec.Restore != nil, ec.Status.Initialized, obs.restore.err, &ec.Status.Restore)
	conditions.Set(ec, metav1.Condition{Type: etcdv1.DeletingCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.NotDeletingReason})
}

// setContract sets initialized (a member runs), ready (as many healthy
// voters as desired, no learner), creationComplete (ready once; it stays
// true) and endpoints (the voters' client URLs), with EtcdInitialized and
// Available. It runs only on an observation whose linearizable member list
// etcd served, which a quorum must confirm: etcd is then available, even
// if fewer voters answered their status requests (see
// engine.QuorumMessage).
func setContract(ec *etcdv1.EtcdCluster, obs *observation, desired int) {
	var endpoints []string
	voters, healthy, learners := 0, 0, 0
	for _, m := range obs.Machines {
		mb, ok := obs.MemberOn(m)
		switch {
		case !ok:
		case mb.Learner:
			learners++
		default:
			voters++
			if mb.Healthy {
				healthy++
			}
			if mb.Started() {
				endpoints = append(endpoints, engine.ClientURL(m))
			}
		}
	}
	slices.Sort(endpoints)
	ec.Status.Endpoints = strings.Join(endpoints, ",")
	if len(endpoints) > 0 {
		ec.Status.Initialized = true
	}
	ec.Status.Ready = voters == desired && healthy == desired && learners == 0 && len(obs.Machines) == desired
	if ec.Status.Ready {
		ec.Status.CreationComplete = true
	}
	setInitialized(ec)
	if voters == 0 {
		conditions.Set(ec, metav1.Condition{Type: etcdv1.AvailableCondition, Status: metav1.ConditionFalse, Reason: etcdv1.NotAvailableReason,
			Message: "No voter runs on the EtcdCluster's machines yet"})
		return
	}
	conditions.Set(ec, metav1.Condition{Type: etcdv1.AvailableCondition, Status: metav1.ConditionTrue, Reason: etcdv1.AvailableReason,
		Message: engine.QuorumMessage(healthy, voters)})
}

// setInitialized reports status.initialized in EtcdInitialized.
func setInitialized(ec *etcdv1.EtcdCluster) {
	if ec.Status.Initialized {
		conditions.Set(ec, metav1.Condition{Type: etcdv1.EtcdInitializedCondition, Status: metav1.ConditionTrue, Reason: etcdv1.EtcdInitializedReason})
		return
	}
	conditions.Set(ec, metav1.Condition{Type: etcdv1.EtcdInitializedCondition, Status: metav1.ConditionFalse, Reason: etcdv1.EtcdNotInitializedReason,
		Message: "Waiting for the first member to start"})
}
