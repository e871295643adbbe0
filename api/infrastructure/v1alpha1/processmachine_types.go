package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// ProcessMachineFinalizer lets the controller stop a machine's processes and
// remove its directory before the ProcessMachine goes away.
const ProcessMachineFinalizer = "infrastructure.cluster.x-k8s.io/processmachine"

// ProcessMachineSpec defines the desired state of a ProcessMachine.
type ProcessMachineSpec struct {
	// providerID is process://<namespace>/<name>, set by the controller.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	ProviderID string `json:"providerID,omitempty"`

	// memory is the machine's size: every process of the machine together
	// (its agent, etcd and the Kubernetes components) may use at most this
	// much memory, and the kernel kills one that goes past it, as on a VM
	// of that size. It needs a qcp-manager that gives machines cgroups of
	// their own (as root, with cgroup v1's memory controller), and takes
	// effect when the machine starts. At least 128Mi. Unset, the machine's
	// memory is not limited.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
}

// ProcessMachineInitializationStatus reports provisioning per the CAPI
// InfraMachine contract.
// +kubebuilder:validation:MinProperties=1
type ProcessMachineInitializationStatus struct {
	// provisioned is true once the machine's agent runs.
	// +optional
	Provisioned *bool `json:"provisioned,omitempty"`
}

// ProcessMachineStatus defines the observed state of a ProcessMachine.
type ProcessMachineStatus struct {
	// conditions follow the CAPI v1beta2 conventions.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// initialization reports when the machine is provisioned.
	// +optional
	Initialization ProcessMachineInitializationStatus `json:"initialization,omitempty,omitzero"`

	// addresses are the machine's loopback address and host name.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Addresses []clusterv1.MachineAddress `json:"addresses,omitempty"`

	// failureDomain is where the machine was placed.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	FailureDomain string `json:"failureDomain,omitempty"`

	// pid is the process ID of the machine's agent.
	// +optional
	PID int32 `json:"pid,omitempty"`

	// observedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=processmachines,scope=Namespaced,categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
// +kubebuilder:printcolumn:name="Address",type="string",JSONPath=".status.addresses[0].address"
// +kubebuilder:printcolumn:name="Domain",type="string",JSONPath=".status.failureDomain"
// +kubebuilder:printcolumn:name="Provisioned",type="boolean",JSONPath=".status.initialization.provisioned"
// +kubebuilder:printcolumn:name="PID",type="integer",JSONPath=".status.pid"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// ProcessMachine is one machine: a qcp-agent process tree on its own
// loopback address that outlives the manager, as a VM outlives a controller.
type ProcessMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ProcessMachineSpec   `json:"spec,omitempty"`
	Status ProcessMachineStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ProcessMachineList is a list of ProcessMachines.
type ProcessMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProcessMachine `json:"items"`
}

// ProcessMachineTemplateResource is the shape of machines made from a template.
type ProcessMachineTemplateResource struct {
	// metadata is copied to machines created from this template.
	// +optional
	ObjectMeta clusterv1.ObjectMeta `json:"metadata,omitempty,omitzero"`
	// spec is the machine spec.
	Spec ProcessMachineSpec `json:"spec"`
}

// ProcessMachineTemplateSpec defines a ProcessMachineTemplate.
type ProcessMachineTemplateSpec struct {
	Template ProcessMachineTemplateResource `json:"template"`
}

// +kubebuilder:object:root=true
// +kubebuilder:resource:path=processmachinetemplates,scope=Namespaced,categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"

// ProcessMachineTemplate is the template control planes clone machines from.
type ProcessMachineTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ProcessMachineTemplateSpec `json:"spec,omitempty"`
}

// +kubebuilder:object:root=true

// ProcessMachineTemplateList is a list of ProcessMachineTemplates.
type ProcessMachineTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProcessMachineTemplate `json:"items"`
}

// GetConditions returns the conditions, for CAPI's conditions utilities.
func (m *ProcessMachine) GetConditions() []metav1.Condition { return m.Status.Conditions }

// SetConditions sets the conditions, for CAPI's conditions utilities.
func (m *ProcessMachine) SetConditions(conds []metav1.Condition) { m.Status.Conditions = conds }

func init() {
	SchemeBuilder.Register(&ProcessMachine{}, &ProcessMachineList{}, &ProcessMachineTemplate{}, &ProcessMachineTemplateList{})
}
