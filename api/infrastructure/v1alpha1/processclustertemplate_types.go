package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// ProcessClusterTemplateSpec holds the template.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a ProcessClusterTemplate's spec cannot change, because the clusters made from it would not follow; create a new template and point the ClusterClass's spec.infrastructure.templateRef at it"
type ProcessClusterTemplateSpec struct {
	// template is what every ProcessCluster made from this template starts
	// from.
	// +required
	Template ProcessClusterTemplateResource `json:"template"`
}

// ProcessClusterTemplateResource is a ProcessCluster as a template describes
// it.
type ProcessClusterTemplateResource struct {
	// metadata (labels and annotations) is copied to each ProcessCluster.
	// +optional
	ObjectMeta clusterv1.ObjectMeta `json:"metadata,omitempty,omitzero"`
	// spec of each ProcessCluster.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.controlPlaneEndpoint)",message="spec.template.spec.controlPlaneEndpoint would give every cluster made from this template the same address; remove it, and each ProcessCluster gets a load balancer address of its own"
	Spec ProcessClusterSpec `json:"spec,omitempty,omitzero"`
}

// +kubebuilder:object:root=true
// +kubebuilder:resource:path=processclustertemplates,scope=Namespaced,categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// ProcessClusterTemplate is what a ClusterClass makes each cluster's
// ProcessCluster from.
type ProcessClusterTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec holds the template.
	// +required
	Spec ProcessClusterTemplateSpec `json:"spec"`
}

// +kubebuilder:object:root=true

// ProcessClusterTemplateList is a list of ProcessClusterTemplates.
type ProcessClusterTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProcessClusterTemplate `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ProcessClusterTemplate{}, &ProcessClusterTemplateList{})
}
