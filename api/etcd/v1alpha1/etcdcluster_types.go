package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// EtcdClusterSpec defines the desired state of an EtcdCluster.
type EtcdClusterSpec struct {
	// replicas is the number of etcd members; odd numbers tolerate the most
	// failures for their size.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=7
	Replicas *int32 `json:"replicas,omitempty"`

	// version is the etcd version, e.g. v3.6.16. Changing it rolls the
	// members one at a time.
	// +required
	// +kubebuilder:validation:Pattern=`^v\d+\.\d+\.\d+$`
	// +kubebuilder:validation:MaxLength=64
	Version string `json:"version"`

	// infrastructureRef names the infrastructure machine template the
	// members' machines are cloned from.
	// +required
	InfrastructureRef clusterv1.ContractVersionedObjectReference `json:"infrastructureRef"`

	// unhealthyMemberTimeoutSeconds is how long a member may stay unhealthy
	// before it is replaced.
	// +optional
	// +kubebuilder:validation:Minimum=10
	UnhealthyMemberTimeoutSeconds *int32 `json:"unhealthyMemberTimeoutSeconds,omitempty"`
}

// EtcdClusterInitializationStatus reports when the cluster first served.
// +kubebuilder:validation:MinProperties=1
type EtcdClusterInitializationStatus struct {
	// provisioned is true once the first member serves.
	// +optional
	Provisioned *bool `json:"provisioned,omitempty"`
}

// EtcdClusterStatus defines the observed state of an EtcdCluster.
type EtcdClusterStatus struct {
	// conditions follow the CAPI v1beta2 conventions.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// initialization reports when the cluster first served.
	// +optional
	Initialization EtcdClusterInitializationStatus `json:"initialization,omitempty,omitzero"`

	// ready is true when every member is healthy.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// endpoints are the members' client URLs.
	// +optional
	// +listType=atomic
	Endpoints []string `json:"endpoints,omitempty"`

	// replicas is the number of members.
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// lastDecision is the quorum engine's latest step and why.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	LastDecision string `json:"lastDecision,omitempty"`

	// observedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=etcdclusters,scope=Namespaced,categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
// +kubebuilder:printcolumn:name="Ready",type="boolean",JSONPath=".status.ready"
// +kubebuilder:printcolumn:name="Replicas",type="integer",JSONPath=".status.replicas"
// +kubebuilder:printcolumn:name="Version",type="string",JSONPath=".spec.version"
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
