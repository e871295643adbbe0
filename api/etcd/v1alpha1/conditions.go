package v1alpha1

import (
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// Condition types and reasons of an EtcdCluster. They follow CAPI's v1beta2
// conventions, and share the control plane's names wherever the meaning is
// the same, so that one reading of QCP's status serves both.

// Available: etcd has quorum, and the members agree on the member list.
const (
	AvailableCondition = controlplanev1.AvailableCondition
	AvailableReason    = controlplanev1.AvailableReason
	NotAvailableReason = controlplanev1.NotAvailableReason
)

// EtcdCACertificatesAvailable: the etcd CA (<cluster>-etcd), the API
// server's client certificate (<cluster>-apiserver-etcd-client) and QCP's
// own client certificate exist.
const (
	EtcdCACertificatesAvailableCondition  = "EtcdCACertificatesAvailable"
	EtcdCACertificatesAvailableReason     = controlplanev1.CertificatesAvailableReason
	EtcdCACertificatesNotAvailableReason  = controlplanev1.CertificatesNotAvailableReason
	EtcdCACertificatesInternalErrorReason = controlplanev1.CertificatesInternalErrorReason
	// EtcdCACertificateInvalidReason: the etcd CA's Secret exists but
	// cannot be used; nothing is written until it can.
	EtcdCACertificateInvalidReason = controlplanev1.CertificateAuthorityInvalidReason
)

// EtcdInitialized: the first member runs; status.initialized says the same.
const (
	EtcdInitializedCondition       = "EtcdInitialized"
	EtcdInitializedReason          = "Initialized"
	EtcdNotInitializedReason       = "NotInitialized"
	WaitingForInfrastructureReason = "WaitingForInfrastructure"
)

// EtcdClusterHealthy, MachinesReady, ScalingUp, ScalingDown, RollingOut,
// Deleting and Paused mean what they mean for a QuorumControlPlane; an etcd
// machine has no Node, so its health is its member's health and its
// process.
const (
	EtcdClusterHealthyCondition    = controlplanev1.EtcdClusterHealthyCondition
	EtcdClusterHealthyReason       = controlplanev1.EtcdClusterHealthyReason
	EtcdClusterNotHealthyReason    = controlplanev1.EtcdClusterNotHealthyReason
	EtcdClusterHealthUnknownReason = controlplanev1.EtcdClusterHealthUnknownReason

	MachinesReadyCondition = controlplanev1.MachinesReadyCondition
	ScalingUpCondition     = controlplanev1.ScalingUpCondition
	ScalingDownCondition   = controlplanev1.ScalingDownCondition
	RollingOutCondition    = controlplanev1.RollingOutCondition
	DeletingCondition      = controlplanev1.DeletingCondition
	PausedCondition        = clusterv1.PausedCondition
)

// DeletingWaitingForControlPlaneReason: an EtcdCluster being deleted waits
// for the QuorumControlPlanes that store their data in it.
const DeletingWaitingForControlPlaneReason = "WaitingForControlPlaneDeletion"
