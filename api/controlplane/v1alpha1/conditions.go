package v1alpha1

import clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

// Condition types and reasons of a QuorumControlPlane. They follow CAPI's
// v1beta2 conventions and reuse CAPI's names where CAPI has one, so that
// tooling that knows KubeadmControlPlane reads QCP the same way. Messages are
// sentences that name what is waited on.

// Available: the control plane serves, and etcd has quorum. CAPI core mirrors
// it into the Cluster's ControlPlaneAvailable condition.
const (
	AvailableCondition           = clusterv1.AvailableCondition
	AvailableReason              = clusterv1.AvailableReason
	NotAvailableReason           = clusterv1.NotAvailableReason
	AvailableInternalErrorReason = clusterv1.InternalErrorReason
)

// Initialized: the first API server has answered; the contract's
// status.initialization.controlPlaneInitialized says the same.
const (
	InitializedCondition                 = "Initialized"
	InitializedReason                    = "Initialized"
	NotInitializedReason                 = "NotInitialized"
	WaitingForControlPlaneEndpointReason = "WaitingForControlPlaneEndpoint"
)

// CertificatesAvailable: the cluster's CAs, service-account key and
// kubeconfig Secrets exist.
const (
	CertificatesAvailableCondition  = "CertificatesAvailable"
	CertificatesAvailableReason     = clusterv1.AvailableReason
	CertificatesNotAvailableReason  = clusterv1.NotAvailableReason
	CertificatesInternalErrorReason = clusterv1.InternalErrorReason
	// CertificateAuthorityInvalidReason: a certificate authority's Secret
	// exists but cannot be used (its certificate or key is missing or does
	// not parse, or they do not match); QCP changes nothing until it can.
	CertificateAuthorityInvalidReason = "CertificateAuthorityInvalid"
	// CertificateAuthorityReplacedReason: a certificate authority's Secret
	// holds another authority than the one the control plane was built
	// from, as when it is replaced by hand. That is a rotation without its
	// stages, which would cut every machine off from the others: QCP does
	// not use it, and changes nothing until the recorded authority is back.
	CertificateAuthorityReplacedReason = "CertificateAuthorityReplaced"
	// CertificateAuthorityRotatingReason: a rotation of an authority runs;
	// the message names its stage and which clients it affects (the
	// condition stays True: every certificate in use is valid).
	CertificateAuthorityRotatingReason = "CertificateAuthorityRotating"
)

// ClusterNetworkApplied: the control plane's machines run the network the
// Cluster's spec.clusterNetwork asks for. QCP records that network before the
// first machine and keeps it: a change after creation is reported here (which
// field, and why it is not applied), and nothing rolls.
const (
	ClusterNetworkAppliedCondition = "ClusterNetworkApplied"
	ClusterNetworkAppliedReason    = "Applied"
	// ClusterNetworkChangeNotSupportedReason: the Cluster's network changed
	// after the control plane was built.
	ClusterNetworkChangeNotSupportedReason = "ChangeNotSupported"
	// ClusterNetworkInvalidReason: the Cluster's network cannot be used
	// (for example dual-stack services); no machine is built until it is
	// fixed.
	ClusterNetworkInvalidReason = "Invalid"
)

// EtcdClusterHealthy: every member is healthy, every member reports the same
// member list, and there are no alarms.
const (
	EtcdClusterHealthyCondition       = "EtcdClusterHealthy"
	EtcdClusterHealthyReason          = "Healthy"
	EtcdClusterNotHealthyReason       = "NotHealthy"
	EtcdClusterHealthUnknownReason    = "HealthUnknown"
	EtcdClusterInspectionFailedReason = clusterv1.InspectionFailedReason
	// EtcdClusterExternalReason: QCP does not run this etcd; an EtcdCluster
	// or whoever runs the endpoints reports its health.
	EtcdClusterExternalReason = "External"
	// EtcdClusterWaitingReason: the control plane waits for its external
	// etcd (an EtcdCluster not creationComplete yet, or a contract Secret)
	// before it starts; the message names what it waits for.
	EtcdClusterWaitingReason = "WaitingForExternalEtcd"
)

// ControlPlaneComponentsHealthy: kube-apiserver, kube-controller-manager,
// kube-scheduler and (stacked) etcd are healthy on every machine. A failing
// check names the machine and the component.
const (
	ControlPlaneComponentsHealthyCondition       = "ControlPlaneComponentsHealthy"
	ControlPlaneComponentsHealthyReason          = "Healthy"
	ControlPlaneComponentsNotHealthyReason       = "NotHealthy"
	ControlPlaneComponentsHealthUnknownReason    = "HealthUnknown"
	ControlPlaneComponentsConnectionDownReason   = clusterv1.ConnectionDownReason
	ControlPlaneComponentsInspectionFailedReason = clusterv1.InspectionFailedReason
)

// MachinesReady aggregates the machines' Ready conditions.
const (
	MachinesReadyCondition        = clusterv1.MachinesReadyCondition
	MachinesReadyReason           = clusterv1.ReadyReason
	MachinesNotReadyReason        = clusterv1.NotReadyReason
	MachinesReadyUnknownReason    = clusterv1.ReadyUnknownReason
	MachinesReadyNoReplicasReason = clusterv1.NoReplicasReason
)

// MachinesUpToDate aggregates the machines' UpToDate conditions.
const (
	MachinesUpToDateCondition        = clusterv1.MachinesUpToDateCondition
	MachinesUpToDateReason           = clusterv1.UpToDateReason
	MachinesNotUpToDateReason        = clusterv1.NotUpToDateReason
	MachinesUpToDateUnknownReason    = clusterv1.UpToDateUnknownReason
	MachinesUpToDateNoReplicasReason = clusterv1.NoReplicasReason
)

// ScalingUp and ScalingDown are true while there are fewer (more) machines
// than desired; a preflight check or the quorum engine holding the step back
// shows in the message and in PreflightChecksFailedReason.
const (
	ScalingUpCondition          = clusterv1.ScalingUpCondition
	ScalingUpReason             = clusterv1.ScalingUpReason
	NotScalingUpReason          = clusterv1.NotScalingUpReason
	ScalingDownCondition        = clusterv1.ScalingDownCondition
	ScalingDownReason           = clusterv1.ScalingDownReason
	NotScalingDownReason        = clusterv1.NotScalingDownReason
	WaitingForReplicasSetReason = clusterv1.WaitingForReplicasSetReason
	PreflightChecksFailedReason = "PreflightChecksFailed"
)

// RollingOut is true while machines that are not up to date are being
// replaced; its message lists why they are outdated and what the rollout
// waits for (a replacement machine whose infrastructure cannot be
// provisioned, such as a missing binary, names the fix). With OnDelete it
// stays false and says which machines wait for a user to delete them.
// Moving machines between failure domains (one was added or removed) is
// reported here too, with RebalancingReason.
const (
	RollingOutCondition    = clusterv1.RollingOutCondition
	RollingOutReason       = clusterv1.RollingOutReason
	NotRollingOutReason    = clusterv1.NotRollingOutReason
	WaitingForDeleteReason = "WaitingForUserDeletion"
	RebalancingReason      = "RebalancingFailureDomains"
)

// Remediating is true while a health check has marked machines; its
// message says, for each, whether QCP remediates it or why it waits or
// refuses (RemediationBlockedReason), as the machine's OwnerRemediated
// condition does.
const (
	RemediatingCondition     = clusterv1.RemediatingCondition
	RemediatingReason        = clusterv1.RemediatingReason
	NotRemediatingReason     = clusterv1.NotRemediatingReason
	RemediationBlockedReason = "RemediationBlocked"
)

// Deleting: the control plane is being deleted; it first waits for the
// cluster's worker machines, then deletes its own.
const (
	DeletingCondition                = clusterv1.DeletingCondition
	NotDeletingReason                = clusterv1.NotDeletingReason
	DeletingWaitingForWorkersReason  = "WaitingForWorkersDeletion"
	DeletingWaitingForMachinesReason = "WaitingForMachineDeletion"
	DeletionCompletedReason          = clusterv1.DeletionCompletedReason
	DeletingInternalErrorReason      = clusterv1.InternalErrorReason
)

// Paused: Cluster.spec.paused or the cluster.x-k8s.io/paused annotation
// stops every action.
const (
	PausedCondition = clusterv1.PausedCondition
	PausedReason    = clusterv1.PausedReason
	NotPausedReason = clusterv1.NotPausedReason
)

// BackupsHealthy: with spec.backup set, whether the newest snapshot was
// stored and verified. False names what failed: the configuration (a
// Secret, the schedule) or the last attempt (the store, the snapshot, its
// verification). Unknown until the first snapshot.
const (
	BackupsHealthyCondition   = "BackupsHealthy"
	BackupsHealthyReason      = "BackupVerified"
	BackupConfigInvalidReason = "BackupConfigInvalid"
	BackupFailedReason        = "BackupFailed"
	BackupPendingReason       = "NoBackupYet"
)

// Restored: with spec.restore set, whether etcd was restored from the
// snapshot. False names why the snapshot cannot be used yet (a Secret, the
// store, no verified snapshot, a checksum or a key that does not match);
// no machine is created until it can. True says whether the certificate
// authorities came from the backup or are new.
const (
	RestoredCondition            = "Restored"
	RestoreSourceInvalidReason   = "RestoreSourceInvalid"
	RestoringReason              = "Restoring"
	RestoredReason               = "Restored"
	RestoredNewAuthoritiesReason = "RestoredWithNewAuthorities"
)
