package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// EtcdClusterFinalizer lets the controller remove the members' machines
// before the EtcdCluster goes.
const EtcdClusterFinalizer = "etcdcluster.etcd.cluster.x-k8s.io"

// EtcdClusterNameLabel is on every machine of an EtcdCluster, with its
// name; status.selector selects on it.
const EtcdClusterNameLabel = "etcd.cluster.x-k8s.io/etcd-cluster-name"

// MaxReplicas bounds an EtcdCluster: every voter slows each write.
const MaxReplicas = 7

// DefaultUnhealthyMemberTimeoutSeconds is how long a member may stay
// unhealthy before it is replaced, when the spec does not say.
const DefaultUnhealthyMemberTimeoutSeconds = 300

// EtcdClusterSpec defines the desired state of an EtcdCluster.
type EtcdClusterSpec struct {
	// replicas is the number of etcd members: 1, 3, 5 or 7. Defaults to 3.
	// Changing it adds or removes members one at a time, new members as
	// learners first.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=7
	Replicas *int32 `json:"replicas,omitempty"`

	// version is the etcd version, e.g. v3.6.16; machines run
	// bin/etcd-<version>. Changing it replaces the members one at a time.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Version string `json:"version"`

	// infrastructureRef names the infrastructure machine template the
	// members' machines are cloned from.
	// +required
	InfrastructureRef clusterv1.ContractVersionedObjectReference `json:"infrastructureRef"`

	// extraArgs are added to every member's etcd command line. The backend
	// quota is set by quotaBackendBytes, not here.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	ExtraArgs []controlplanev1.Arg `json:"extraArgs,omitempty"`

	// unhealthyMemberTimeoutSeconds is how long a member may stay unhealthy
	// (its machine's process down, or the member not answering) before it
	// is removed and then replaced. A member that recovers sooner is left
	// alone. Defaults to 300.
	// +optional
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=86400
	UnhealthyMemberTimeoutSeconds *int32 `json:"unhealthyMemberTimeoutSeconds,omitempty"`

	// rollout controls when members are replaced although nothing in the
	// spec changed.
	// +optional
	Rollout EtcdRolloutSpec `json:"rollout,omitempty,omitzero"`

	// maintenance is QCP's upkeep of the members' databases.
	// +optional
	Maintenance controlplanev1.EtcdMaintenance `json:"maintenance,omitempty,omitzero"`

	// quotaBackendBytes is the size, in bytes, a member's database may
	// reach before etcd raises NOSPACE and refuses writes. Unset means
	// etcd's default, 2 GiB; at least 16 MiB. Above 8 GiB etcd warns at
	// startup. A change restarts each member in place, one at a time,
	// without replacing machines; it works while NOSPACE is raised too, so
	// a raised quota gives a full database room again.
	// +optional
	// +kubebuilder:validation:Minimum=16777216
	QuotaBackendBytes *int64 `json:"quotaBackendBytes,omitempty"`

	// backup takes scheduled, verified snapshots of the cluster to an
	// object store.
	// +optional
	Backup *controlplanev1.BackupSpec `json:"backup,omitempty"`

	// restore builds a new EtcdCluster from a snapshot instead of an
	// empty etcd: the first member restores it, the others join. It
	// cannot be added, changed or removed once the EtcdCluster exists.
	// +optional
	Restore *controlplanev1.RestoreSpec `json:"restore,omitempty"`

	// quorumLossRecovery says what QCP does when a majority of the members
	// is lost for good.
	// +optional
	QuorumLossRecovery *controlplanev1.QuorumLossRecovery `json:"quorumLossRecovery,omitempty"`
}

// EtcdRolloutSpec controls rollouts of an EtcdCluster.
// +kubebuilder:validation:MinProperties=1
type EtcdRolloutSpec struct {
	// after replaces every member whose machine was created before this
	// time, one at a time.
	// +optional
	After metav1.Time `json:"after,omitempty,omitzero"`
}

// EtcdClusterStatus defines the observed state of an EtcdCluster. The
// initialized, creationComplete, endpoints and ready fields are the etcd
// provider contract of the managed external etcd proposal: control plane
// providers read them.
type EtcdClusterStatus struct {
	// conditions follow the CAPI v1beta2 conventions; the types and reasons
	// are the constants in this package.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// initialized is true once the first member runs.
	// +optional
	Initialized bool `json:"initialized,omitempty"`

	// creationComplete is true once every member of the initial cluster
	// has passed its health check; it stays true afterwards. A control
	// plane that uses this cluster waits for it.
	// +optional
	CreationComplete bool `json:"creationComplete,omitempty"`

	// endpoints are the voting members' client URLs, comma separated, as
	// the contract has them (https://10.0.0.1:2379,https://10.0.0.2:2379).
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Endpoints string `json:"endpoints,omitempty"`

	// ready is true when every member is a healthy voter and there are as
	// many as spec.replicas.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// selector selects the members' machines, for the scale subresource.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Selector string `json:"selector,omitempty"`

	// replicas is the number of machines.
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// readyReplicas counts machines whose member is a healthy voter.
	// +optional
	ReadyReplicas *int32 `json:"readyReplicas,omitempty"`

	// upToDateReplicas counts machines that match the spec.
	// +optional
	UpToDateReplicas *int32 `json:"upToDateReplicas,omitempty"`

	// version is the lowest etcd version the members report.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Version string `json:"version,omitempty"`

	// members are the etcd members, as the cluster reports them.
	// +optional
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MaxItems=16
	Members []controlplanev1.EtcdMemberStatus `json:"members,omitempty"`

	// lastOperation is the quorum engine's latest step: what, on what, why,
	// and when it started and finished.
	// +optional
	LastOperation controlplanev1.LastOperation `json:"lastOperation,omitempty,omitzero"`

	// backup reports the backups, when spec.backup is set.
	// +optional
	Backup *controlplanev1.BackupStatus `json:"backup,omitempty"`

	// restore reports what spec.restore restored.
	// +optional
	Restore *controlplanev1.RestoreStatus `json:"restore,omitempty"`

	// recovery reports the last recovery from a quorum loss.
	// +optional
	Recovery *controlplanev1.RecoveryStatus `json:"recovery,omitempty"`

	// observedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:path=etcdclusters,scope=Namespaced,categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",description="The Cluster this etcd cluster belongs to"
// +kubebuilder:printcolumn:name="Available",type="string",JSONPath=`.status.conditions[?(@.type=="Available")].status`,description="Whether etcd has quorum"
// +kubebuilder:printcolumn:name="Desired",type="integer",JSONPath=".spec.replicas",description="The desired number of members"
// +kubebuilder:printcolumn:name="Current",type="integer",JSONPath=".status.replicas",description="The number of machines"
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas",description="Machines whose member is a healthy voter"
// +kubebuilder:printcolumn:name="Leader",type="string",JSONPath=`.status.members[?(@.role=="Leader")].machine`,description="The machine of the etcd leader"
// +kubebuilder:printcolumn:name="Version",type="string",JSONPath=".spec.version",description="The desired etcd version"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// EtcdCluster is a managed external etcd cluster on its own CAPI machines.
type EtcdCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   EtcdClusterSpec   `json:"spec,omitempty"`
	Status EtcdClusterStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// EtcdClusterList is a list of EtcdClusters.
type EtcdClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdCluster `json:"items"`
}

// GetConditions returns the conditions, for CAPI's conditions utilities.
func (c *EtcdCluster) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions sets the conditions, for CAPI's conditions utilities.
func (c *EtcdCluster) SetConditions(conds []metav1.Condition) { c.Status.Conditions = conds }

func init() {
	SchemeBuilder.Register(&EtcdCluster{}, &EtcdClusterList{})
}
