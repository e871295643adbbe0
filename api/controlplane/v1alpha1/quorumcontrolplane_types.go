package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// QuorumControlPlaneFinalizer holds deletion until machines and worker
// machines are gone.
const QuorumControlPlaneFinalizer = "controlplane.cluster.x-k8s.io/quorumcontrolplane"

// RolloutStrategyType is how machines are replaced during a rollout.
// +kubebuilder:validation:Enum=RollingUpdate;OnDelete
type RolloutStrategyType string

const (
	// RollingUpdate replaces outdated machines one at a time.
	RollingUpdate RolloutStrategyType = "RollingUpdate"
	// OnDelete replaces only machines the user deletes.
	OnDelete RolloutStrategyType = "OnDelete"
)

// QuorumControlPlaneSpec defines the desired state of a QuorumControlPlane.
// +kubebuilder:validation:XValidation:rule="!has(self.etcd) || !has(self.etcd.external) || !has(self.etcd.clusterRef)",message="spec.etcd: set at most one of external and clusterRef"
type QuorumControlPlaneSpec struct {
	// replicas is the desired number of control plane machines. Stacked etcd
	// needs an odd number; external etcd takes any number of at least 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=7
	Replicas *int32 `json:"replicas,omitempty"`

	// version is the Kubernetes version of the control plane, e.g. v1.36.3.
	// +required
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^v\d+\.\d+\.\d+([-+].*)?$`
	Version string `json:"version"`

	// machineTemplate shapes the control plane machines.
	// +required
	MachineTemplate QuorumControlPlaneMachineTemplate `json:"machineTemplate"`

	// etcd chooses stacked etcd (the default, empty) or external etcd.
	// +optional
	Etcd EtcdSpec `json:"etcd,omitempty,omitzero"`

	// rollout controls when and how machines are replaced.
	// +optional
	Rollout RolloutSpec `json:"rollout,omitempty,omitzero"`

	// remediation controls automatic repair of unhealthy machines.
	// +optional
	Remediation RemediationSpec `json:"remediation,omitempty,omitzero"`
}

// QuorumControlPlaneMachineTemplate is how control plane machines are shaped.
type QuorumControlPlaneMachineTemplate struct {
	// metadata is propagated to machines without a rollout.
	// +optional
	ObjectMeta clusterv1.ObjectMeta `json:"metadata,omitempty,omitzero"`
	// spec of the control plane machines.
	// +required
	Spec QuorumControlPlaneMachineTemplateSpec `json:"spec"`
}

// QuorumControlPlaneMachineTemplateSpec is the CAPI contract's machine spec.
type QuorumControlPlaneMachineTemplateSpec struct {
	// infrastructureRef names the infrastructure machine template to clone.
	// +required
	InfrastructureRef clusterv1.ContractVersionedObjectReference `json:"infrastructureRef"`
	// deletion configures node drain and deletion timeouts.
	// +optional
	Deletion QuorumControlPlaneMachineTemplateDeletionSpec `json:"deletion,omitempty,omitzero"`
}

// QuorumControlPlaneMachineTemplateDeletionSpec configures machine deletion.
// +kubebuilder:validation:MinProperties=1
type QuorumControlPlaneMachineTemplateDeletionSpec struct {
	// nodeDrainTimeoutSeconds bounds node drain; 0 means no limit.
	// +optional
	// +kubebuilder:validation:Minimum=0
	NodeDrainTimeoutSeconds *int32 `json:"nodeDrainTimeoutSeconds,omitempty"`
	// nodeDeletionTimeoutSeconds bounds node deletion.
	// +optional
	// +kubebuilder:validation:Minimum=0
	NodeDeletionTimeoutSeconds *int32 `json:"nodeDeletionTimeoutSeconds,omitempty"`
}

// EtcdSpec chooses where the control plane's etcd runs.
type EtcdSpec struct {
	// external points the API servers at an etcd cluster QCP does not run.
	// +optional
	External *ExternalEtcd `json:"external,omitempty"`
	// clusterRef names an EtcdCluster in the same namespace; the control
	// plane waits until it is ready and uses its endpoints and Secrets.
	// +optional
	ClusterRef *LocalObjectReference `json:"clusterRef,omitempty"`
}

// ExternalEtcd is an etcd cluster given by endpoints.
type ExternalEtcd struct {
	// endpoints are the etcd client URLs (https://host:2379).
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Pattern=`^https://`
	// +kubebuilder:validation:items:MaxLength=512
	Endpoints []string `json:"endpoints"`
}

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// name of the object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// RolloutSpec controls rollouts.
type RolloutSpec struct {
	// after rolls out every machine created before this time.
	// +optional
	After metav1.Time `json:"after,omitempty,omitzero"`
	// strategy is RollingUpdate (default) or OnDelete.
	// +optional
	Strategy RolloutStrategy `json:"strategy,omitempty,omitzero"`
}

// RolloutStrategy chooses how machines are replaced.
type RolloutStrategy struct {
	// type is RollingUpdate or OnDelete.
	// +optional
	Type RolloutStrategyType `json:"type,omitempty"`
	// rollingUpdate tunes RollingUpdate.
	// +optional
	RollingUpdate RollingUpdateSpec `json:"rollingUpdate,omitempty,omitzero"`
}

// RollingUpdateSpec tunes the RollingUpdate strategy.
type RollingUpdateSpec struct {
	// maxSurge is 1 (create the replacement first, the default) or 0
	// (remove first; needs at least 3 replicas).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1
	MaxSurge *int32 `json:"maxSurge,omitempty"`
}

// RemediationSpec controls automatic repair.
type RemediationSpec struct {
	// autorepair makes QCP own a MachineHealthCheck for its machines. It
	// defaults to true.
	// +optional
	Autorepair *bool `json:"autorepair,omitempty"`
	// maxRetry bounds how many times a machine's replacement is remediated
	// again; unset means no limit.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxRetry *int32 `json:"maxRetry,omitempty"`
	// retryPeriodSeconds is the minimum time between remediations of a
	// machine and its replacement.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RetryPeriodSeconds *int32 `json:"retryPeriodSeconds,omitempty"`
}

// QuorumControlPlaneInitializationStatus reports initialization per the CAPI
// control plane contract.
// +kubebuilder:validation:MinProperties=1
type QuorumControlPlaneInitializationStatus struct {
	// controlPlaneInitialized is true once the first machine's API server
	// serves.
	// +optional
	ControlPlaneInitialized *bool `json:"controlPlaneInitialized,omitempty"`
}

// QuorumControlPlaneStatus defines the observed state of a QuorumControlPlane.
type QuorumControlPlaneStatus struct {
	// conditions follow the CAPI v1beta2 conventions.
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

	// version is the lowest Kubernetes version among the machines.
	// +optional
	Version string `json:"version,omitempty"`

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
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:path=quorumcontrolplanes,shortName=qcp,scope=Namespaced,categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
// +kubebuilder:printcolumn:name="Available",type="string",JSONPath=`.status.conditions[?(@.type=="Available")].status`
// +kubebuilder:printcolumn:name="Desired",type="integer",JSONPath=".spec.replicas"
// +kubebuilder:printcolumn:name="Current",type="integer",JSONPath=".status.replicas"
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas"
// +kubebuilder:printcolumn:name="Up-to-date",type="integer",JSONPath=".status.upToDateReplicas"
// +kubebuilder:printcolumn:name="Initialized",type="boolean",JSONPath=".status.initialization.controlPlaneInitialized"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Version",type="string",JSONPath=".spec.version"

// QuorumControlPlane runs a Kubernetes control plane's machines and its etcd
// cluster as one unit, without ever losing etcd quorum.
type QuorumControlPlane struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   QuorumControlPlaneSpec   `json:"spec,omitempty"`
	Status QuorumControlPlaneStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// QuorumControlPlaneList is a list of QuorumControlPlanes.
type QuorumControlPlaneList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []QuorumControlPlane `json:"items"`
}

// GetConditions returns the conditions, for CAPI's conditions utilities.
func (c *QuorumControlPlane) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions sets the conditions, for CAPI's conditions utilities.
func (c *QuorumControlPlane) SetConditions(conds []metav1.Condition) { c.Status.Conditions = conds }

func init() {
	SchemeBuilder.Register(&QuorumControlPlane{}, &QuorumControlPlaneList{})
}
