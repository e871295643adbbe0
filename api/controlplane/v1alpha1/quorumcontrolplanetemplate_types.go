package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// QuorumControlPlaneTemplateSpec holds the template.
type QuorumControlPlaneTemplateSpec struct {
	// template is what every QuorumControlPlane made from this template
	// starts from.
	// +required
	Template QuorumControlPlaneTemplateResource `json:"template"`
}

// QuorumControlPlaneTemplateResource is a QuorumControlPlane as a template
// describes it.
type QuorumControlPlaneTemplateResource struct {
	// metadata (labels and annotations) is copied to each QuorumControlPlane.
	// +optional
	ObjectMeta clusterv1.ObjectMeta `json:"metadata,omitempty,omitzero"`
	// spec of each QuorumControlPlane.
	// +optional
	Spec QuorumControlPlaneTemplateResourceSpec `json:"spec,omitempty,omitzero"`
}

// QuorumControlPlaneTemplateResourceSpec is a QuorumControlPlane's spec
// without what CAPI's topology controller sets from the Cluster and its
// ClusterClass. Those fields exist here only so that the webhook can refuse
// them with a message that says where their value comes from; they must be
// left unset.
type QuorumControlPlaneTemplateResourceSpec struct {
	// replicas must be unset: it comes from the Cluster's
	// spec.topology.controlPlane.replicas.
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// version must be unset: it comes from the Cluster's
	// spec.topology.version.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Version string `json:"version,omitempty"`

	// machineTemplate shapes the control plane machines.
	// +optional
	MachineTemplate QuorumControlPlaneTemplateMachineTemplate `json:"machineTemplate,omitempty,omitzero"`

	// The rest is how the components run, as in a QuorumControlPlane.
	QuorumControlPlaneConfig `json:",inline"`
}

// QuorumControlPlaneTemplateMachineTemplate is how the machines are shaped.
type QuorumControlPlaneTemplateMachineTemplate struct {
	// metadata (labels and annotations) is propagated to the machines in
	// place. The topology controller adds the ClusterClass's and the
	// Cluster's control plane metadata.
	// +optional
	ObjectMeta clusterv1.ObjectMeta `json:"metadata,omitempty,omitzero"`
	// spec of the control plane machines.
	// +optional
	Spec QuorumControlPlaneTemplateMachineTemplateSpec `json:"spec,omitempty,omitzero"`
}

// QuorumControlPlaneTemplateMachineTemplateSpec is the machines' spec.
type QuorumControlPlaneTemplateMachineTemplateSpec struct {
	// infrastructureRef must be unset: it comes from the ClusterClass's
	// spec.controlPlane.machineInfrastructure.templateRef, which the
	// topology controller clones for each Cluster.
	// +optional
	InfrastructureRef *clusterv1.ContractVersionedObjectReference `json:"infrastructureRef,omitempty"`

	// The rest is what QCP sets on the Machines in place.
	QuorumControlPlaneMachineSettings `json:",inline"`
}

// +kubebuilder:object:root=true
// +kubebuilder:resource:path=quorumcontrolplanetemplates,scope=Namespaced,categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp",description="Time since creation"

// QuorumControlPlaneTemplate is what a ClusterClass makes each cluster's
// QuorumControlPlane from. Its spec cannot change: make a new template and
// point the ClusterClass at it.
type QuorumControlPlaneTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec holds the template.
	// +required
	Spec QuorumControlPlaneTemplateSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// QuorumControlPlaneTemplateList is a list of QuorumControlPlaneTemplates.
type QuorumControlPlaneTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []QuorumControlPlaneTemplate `json:"items"`
}

func init() {
	SchemeBuilder.Register(&QuorumControlPlaneTemplate{}, &QuorumControlPlaneTemplateList{})
}
