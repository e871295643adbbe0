package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// QuorumControlPlaneStatus defines the observed state of a QuorumControlPlane.
type QuorumControlPlaneStatus struct {
	// conditions follow the CAPI v1beta2 conventions; the types and reasons
	// are the constants in this package.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// initialization reports when the control plane is initialized.
	// +optional
	Initialization QuorumControlPlaneInitializationStatus `json:"initialization,omitempty,omitzero"`

	// selector selects the control plane machines, for the scale subresource.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Selector string `json:"selector,omitempty"`

	// replicas is the number of machines of this control plane.
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// readyReplicas counts machines whose Ready condition is true.
	// +optional
	ReadyReplicas *int32 `json:"readyReplicas,omitempty"`
	// availableReplicas counts machines whose Available condition is true.
	// +optional
	AvailableReplicas *int32 `json:"availableReplicas,omitempty"`
	// upToDateReplicas counts machines whose UpToDate condition is true.
	// +optional
	UpToDateReplicas *int32 `json:"upToDateReplicas,omitempty"`

	// versions are the Kubernetes versions the machines run, oldest first,
	// each with its number of machines. CAPI's topology controller reads
	// them to tell whether an upgrade is in progress.
	// +optional
	// +listType=map
	// +listMapKey=version
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	Versions []clusterv1.StatusVersion `json:"versions,omitempty"`

	// version is the lowest Kubernetes version among the machines.
	//
	// Deprecated: use versions; the next CAPI contract drops this field.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Version string `json:"version,omitempty"`

	// etcd reports the stacked etcd cluster as QCP last observed it.
	// +optional
	Etcd EtcdStatus `json:"etcd,omitempty,omitzero"`

	// certificates are, for each kind of certificate the control plane runs
	// on, the one that expires first, as QCP last read them. The metric
	// qcp_controlplane_certificate_expiry_timestamp_seconds exports them.
	// +optional
	// +listType=map
	// +listMapKey=kind
	// +kubebuilder:validation:MaxItems=16
	Certificates []CertificateExpiry `json:"certificates,omitempty"`

	// certificateRotation is the latest certificate authority rotation: its
	// stage while it runs, Completed once it has finished.
	// +optional
	CertificateRotation *CertificateRotationStatus `json:"certificateRotation,omitempty"`

	// backup reports the etcd backups, when spec.backup is set.
	// +optional
	Backup *BackupStatus `json:"backup,omitempty"`

	// restore reports what spec.restore restored.
	// +optional
	Restore *RestoreStatus `json:"restore,omitempty"`

	// recovery reports the last recovery from a quorum loss.
	// +optional
	Recovery *RecoveryStatus `json:"recovery,omitempty"`

	// lastOperation is the quorum engine's latest step: what, on what, why,
	// and when it started and finished.
	// +optional
	LastOperation LastOperation `json:"lastOperation,omitempty,omitzero"`

	// observedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// QuorumControlPlaneInitializationStatus reports initialization per the CAPI
// control plane contract.
// +kubebuilder:validation:MinProperties=1
type QuorumControlPlaneInitializationStatus struct {
	// controlPlaneInitialized is true once the first machine's API server
	// answers. CAPI core starts watching the workload cluster's Nodes then.
	// +optional
	ControlPlaneInitialized *bool `json:"controlPlaneInitialized,omitempty"`
}

// EtcdStatus reports the etcd cluster's membership.
type EtcdStatus struct {
	// members are the etcd members, as the cluster reports them.
	// +optional
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MaxItems=16
	Members []EtcdMemberStatus `json:"members,omitempty"`
}

// EtcdMemberRole is a member's part in raft.
// +kubebuilder:validation:Enum=Leader;Voter;Learner
type EtcdMemberRole string

// The member roles. A leader is also a voter; a learner gets the log but does
// not vote until it is promoted.
const (
	EtcdMemberRoleLeader  EtcdMemberRole = "Leader"
	EtcdMemberRoleVoter   EtcdMemberRole = "Voter"
	EtcdMemberRoleLearner EtcdMemberRole = "Learner"
)

// EtcdMemberStatus is one etcd member.
type EtcdMemberStatus struct {
	// id is the member ID in hexadecimal, as etcdctl prints it. A string,
	// because member IDs use all 64 bits and JSON numbers do not.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^[0-9a-f]+$`
	ID string `json:"id"`
	// name is the member's name; empty until an added member first starts.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`
	// machine is the Machine hosting the member; empty if none is known.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Machine string `json:"machine,omitempty"`
	// role is Leader, Voter or Learner.
	// +required
	Role EtcdMemberRole `json:"role"`
	// healthy is true when the member answered its last health check.
	// +required
	Healthy bool `json:"healthy"`
	// revision is the key-value store revision a learner has reached, which
	// shows how far it has caught up: it is promoted only once close to the
	// leader's. Unset for voters, whose revisions change with every write: a
	// status that changed with every write would be rewritten, and
	// reconciled again, without end.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Revision int64 `json:"revision,omitempty"`
	// database is the member's backend database as it last reported it, in
	// whole mebibytes rounded up: status then changes when the database
	// grows or shrinks by a mebibyte, not with every write. The exact
	// figures, and every member's revision, are qcp-manager's metrics.
	// Unset until the member answers a status request.
	// +optional
	Database *EtcdDatabaseStatus `json:"database,omitempty"`
}

// EtcdDatabaseStatus is a member's backend database: the file, the part of
// it that holds data, and the quota beyond which etcd refuses writes.
type EtcdDatabaseStatus struct {
	// size is the size of the database file.
	// +required
	Size resource.Quantity `json:"size"`
	// inUse is the part of size that holds data. The rest is free pages,
	// which only defragmentation gives back: 1 - inUse/size is the member's
	// fragmentation.
	// +required
	InUse resource.Quantity `json:"inUse"`
	// quota is the backend quota (--quota-backend-bytes) the member runs
	// with: as it reports it (etcd 3.6 and later), else as QCP configured
	// it. Unset when the quota is off.
	// +optional
	Quota *resource.Quantity `json:"quota,omitempty"`
}

// OperationKind is a step of the quorum engine. The values are the kinds of
// internal/quorum's Decision.
// +kubebuilder:validation:Enum=CreateMachine;AddLearner;Promote;MoveLeader;RemoveMember;AddHook;RemoveHook;DeleteMachine;DisarmAlarm;Defragment;Compact;RestartMember;RenewCertificates;SetAuthority;Snapshot;Recover;RestoreFromBackup;Wait;Degraded
type OperationKind string

// The quorum engine's steps; see internal/quorum for what each one does.
const (
	OperationCreateMachine OperationKind = "CreateMachine"
	OperationAddLearner    OperationKind = "AddLearner"
	OperationPromote       OperationKind = "Promote"
	OperationMoveLeader    OperationKind = "MoveLeader"
	OperationRemoveMember  OperationKind = "RemoveMember"
	OperationAddHook       OperationKind = "AddHook"
	OperationRemoveHook    OperationKind = "RemoveHook"
	OperationDeleteMachine OperationKind = "DeleteMachine"
	OperationDisarmAlarm   OperationKind = "DisarmAlarm"
	OperationDefragment    OperationKind = "Defragment"
	OperationCompact       OperationKind = "Compact"
	OperationRestartMember OperationKind = "RestartMember"
	// OperationRenewCertificates renews a machine's certificates in place.
	OperationRenewCertificates OperationKind = "RenewCertificates"
	// OperationSetAuthority brings a machine to a CA rotation's
	// stage.
	OperationSetAuthority OperationKind = "SetAuthority"
	// OperationSnapshot takes a verified etcd backup.
	OperationSnapshot OperationKind = "Snapshot"
	// OperationRecover rebuilds etcd from a survivor of a quorum loss.
	OperationRecover OperationKind = "Recover"
	// OperationRestoreFromBackup records a recovery from a backup, once
	// no member of a quorum loss answers.
	OperationRestoreFromBackup OperationKind = "RestoreFromBackup"
	OperationWait              OperationKind = "Wait"
	OperationDegraded          OperationKind = "Degraded"
)

// LastOperation records the quorum engine's latest decision.
type LastOperation struct {
	// kind is the step, e.g. AddLearner.
	// +required
	Kind OperationKind `json:"kind"`
	// target is what the step acts on: a machine, a member ("8e9e05c52164694d
	// on c1-abcde") or, for CreateMachine, a failure domain. Empty for Wait
	// and Degraded.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Target string `json:"target,omitempty"`
	// reason is a sentence for humans: why this step, or what is waited for.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Reason string `json:"reason"`
	// startTime is when the step was decided and started.
	// +required
	StartTime metav1.Time `json:"startTime"`
	// finishTime is when the step completed; unset while it is in flight.
	// +optional
	FinishTime metav1.Time `json:"finishTime,omitempty,omitzero"`
}

// CertificateKind is a kind of certificate in status.certificates.
// +kubebuilder:validation:Enum=ClusterCA;EtcdCA;FrontProxyCA;Kubeconfig;EtcdClient;Machines
type CertificateKind string

// The kinds of certificate status.certificates reports.
const (
	// CertificateKindClusterCA is the cluster CA (<cluster>-ca).
	CertificateKindClusterCA CertificateKind = "ClusterCA"
	// CertificateKindEtcdCA is the etcd CA (<cluster>-etcd).
	CertificateKindEtcdCA CertificateKind = "EtcdCA"
	// CertificateKindFrontProxyCA is the front-proxy CA (<cluster>-proxy).
	CertificateKindFrontProxyCA CertificateKind = "FrontProxyCA"
	// CertificateKindKubeconfig is the admin kubeconfig's client
	// certificate (<cluster>-kubeconfig).
	CertificateKindKubeconfig CertificateKind = "Kubeconfig"
	// CertificateKindEtcdClient is the API servers' etcd client certificate
	// on external etcd or an EtcdCluster (<cluster>-apiserver-etcd-client).
	CertificateKindEtcdClient CertificateKind = "EtcdClient"
	// CertificateKindMachines is the certificates each machine issues
	// itself, as its API server serves them (the Machines'
	// machine.cluster.x-k8s.io/certificates-expiry annotation).
	CertificateKindMachines CertificateKind = "Machines"
)

// CertificateExpiry is when the first certificate of a kind expires, and
// where it is.
type CertificateExpiry struct {
	// kind of certificate.
	// +required
	Kind CertificateKind `json:"kind"`
	// notAfter is when it expires.
	// +required
	NotAfter metav1.Time `json:"notAfter"`
	// source is where it is: "Secret <name>" or "Machine <name>".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=300
	Source string `json:"source"`
}

// CertificateRotationStage is a stage of a certificate authority rotation.
// +kubebuilder:validation:Enum=TrustBoth;Reissue;SwitchSigner;Distrust;Completed
type CertificateRotationStage string

// The stages, in order.
const (
	// RotationTrustBoth: every machine trusts the new authority beside the
	// old one, one machine at a time (for the etcd CA, etcd restarts).
	RotationTrustBoth CertificateRotationStage = "TrustBoth"
	// RotationReissue: every certificate is issued again from the new
	// authority. Clients that trust only the old one fail from here on.
	RotationReissue CertificateRotationStage = "Reissue"
	// RotationSwitchSigner: the authority's Secret takes the new one, so
	// machines created from now on issue from it.
	RotationSwitchSigner CertificateRotationStage = "SwitchSigner"
	// RotationDistrust: every machine stops trusting the old authority,
	// one machine at a time (for the etcd CA, etcd restarts again).
	RotationDistrust CertificateRotationStage = "Distrust"
	// RotationCompleted: nothing trusts or holds the old authority.
	RotationCompleted CertificateRotationStage = "Completed"
)

// CertificateRotationStatus is where a rotation stands.
type CertificateRotationStatus struct {
	// kind is the authority rotated.
	Kind CertificateAuthorityKind `json:"kind"`
	// trigger is the spec's trigger that started it.
	// +kubebuilder:validation:MaxLength=63
	Trigger string `json:"trigger"`
	// stage is where it stands.
	Stage CertificateRotationStage `json:"stage"`
	// stageStartTime is when the stage began.
	StageStartTime metav1.Time `json:"stageStartTime"`
	// message says what the stage waits for.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}
