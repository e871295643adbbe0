package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// ProcessClusterFinalizer lets the controller stop the load balancer before
// the ProcessCluster goes away.
const ProcessClusterFinalizer = "infrastructure.cluster.x-k8s.io/processcluster"

// ProcessClusterSpec defines the desired state of a ProcessCluster.
type ProcessClusterSpec struct {
	// controlPlaneEndpoint is the load balancer's address. It is set by the
	// controller when empty; a user may set it to pin the address.
	// +optional
	ControlPlaneEndpoint clusterv1.APIEndpoint `json:"controlPlaneEndpoint,omitempty,omitzero"`

	// failureDomains are the names of the failure domains machines of this
	// cluster are spread across, e.g. fd-a, fd-b, fd-c. All are eligible for
	// control plane machines.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	FailureDomains []string `json:"failureDomains,omitempty"`
}

// ProcessClusterInitializationStatus reports provisioning per the CAPI
// InfraCluster contract.
// +kubebuilder:validation:MinProperties=1
type ProcessClusterInitializationStatus struct {
	// provisioned is true when the load balancer serves the endpoint.
	// +optional
	Provisioned *bool `json:"provisioned,omitempty"`
}

// ProcessClusterStatus defines the observed state of a ProcessCluster.
type ProcessClusterStatus struct {
	// conditions follow the CAPI v1beta2 conventions.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// initialization reports when the infrastructure is ready.
	// +optional
	Initialization ProcessClusterInitializationStatus `json:"initialization,omitempty,omitzero"`

	// failureDomains are the failure domains, as the CAPI contract reports them.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	FailureDomains []clusterv1.FailureDomain `json:"failureDomains,omitempty"`

	// loadBalancerPID is the process ID of the load balancer.
	// +optional
	LoadBalancerPID int32 `json:"loadBalancerPID,omitempty"`

	// backends are the API server addresses the load balancer forwards to.
	// +optional
	// +listType=atomic
	Backends []string `json:"backends,omitempty"`

	// observedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=processclusters,scope=Namespaced,categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
// +kubebuilder:printcolumn:name="Endpoint",type="string",JSONPath=".spec.controlPlaneEndpoint.host"
// +kubebuilder:printcolumn:name="Provisioned",type="boolean",JSONPath=".status.initialization.provisioned"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// ProcessCluster is the infrastructure of a cluster whose machines are
// processes on this host: failure domains and a load balancer process.
type ProcessCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProcessClusterSpec   `json:"spec,omitempty"`
	Status ProcessClusterStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ProcessClusterList is a list of ProcessClusters.
type ProcessClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProcessCluster `json:"items"`
}

// GetConditions returns the conditions, for CAPI's conditions utilities.
func (c *ProcessCluster) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions sets the conditions, for CAPI's conditions utilities.
func (c *ProcessCluster) SetConditions(conds []metav1.Condition) { c.Status.Conditions = conds }

func init() {
	SchemeBuilder.Register(&ProcessCluster{}, &ProcessClusterList{})
}
