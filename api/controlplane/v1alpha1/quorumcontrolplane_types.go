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

// DefaultCertificateValidityPeriodDays is how long machine certificates are
// valid when certificateValidityPeriodDays is unset (kubeadm's one year).
const DefaultCertificateValidityPeriodDays int32 = 365

// MaxReplicas bounds a control plane: every extra etcd voter slows each
// write, and seven already tolerates three failures.
const MaxReplicas = 7

// Rules that need the old object or a message naming the fix (odd replicas
// with stacked etcd, version skew, etcd mode changes) live in the admission
// webhook (internal/webhooks); the schema keeps only structural bounds.

// QuorumControlPlaneSpec defines the desired state of a QuorumControlPlane.
type QuorumControlPlaneSpec struct {
	// replicas is the desired number of control plane machines, 1 to 7. Stacked
	// etcd needs an odd number; external etcd takes any number. Defaults to 1.
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// version is the Kubernetes version of the control plane, e.g. v1.36.3;
	// machines run the binary bin/kube-<version>. A missing leading "v" is
	// added. Upgrades go one minor version at a time; downgrades are refused.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Version string `json:"version"`

	// machineTemplate shapes the control plane machines.
	// +required
	MachineTemplate QuorumControlPlaneMachineTemplate `json:"machineTemplate"`

	// certificates starts operations on the control plane's certificate
	// authorities. A QuorumControlPlaneTemplate has none: they belong to
	// one cluster.
	// +optional
	Certificates CertificatesSpec `json:"certificates,omitempty,omitzero"`

	// backup takes scheduled, verified snapshots of the stacked etcd
	// cluster to an object store. A control plane on external etcd has
	// none: its data belongs to the EtcdCluster (set spec.backup there),
	// or to whoever runs the endpoints.
	// +optional
	Backup *BackupSpec `json:"backup,omitempty"`

	// restore builds a new control plane's etcd from a snapshot instead
	// of an empty one; only with stacked etcd. It cannot be added, changed
	// or removed once the control plane exists.
	// +optional
	Restore *RestoreSpec `json:"restore,omitempty"`

	// quorumLossRecovery says what QCP does when a majority of the
	// stacked etcd members is lost for good; only with stacked etcd.
	// +optional
	QuorumLossRecovery *QuorumLossRecovery `json:"quorumLossRecovery,omitempty"`

	// The rest of the spec is how the components run, which a
	// QuorumControlPlaneTemplate carries too.
	QuorumControlPlaneConfig `json:",inline"`
}

// CertificatesSpec starts operations on certificate authorities.
type CertificatesSpec struct {
	// rotation rotates a certificate authority: a new one is trusted beside
	// the old everywhere, every certificate is issued again from it, it
	// becomes the signer, and the old one is distrusted, each stage on one
	// machine at a time, without replacing a machine. A new trigger starts
	// a rotation; status.certificateRotation follows it. While one runs, this
	// field cannot change.
	// +optional
	Rotation *CertificateRotation `json:"rotation,omitempty"`
}

// CertificateAuthorityKind names an authority a rotation replaces.
// +kubebuilder:validation:Enum=EtcdCA;ClusterCA;FrontProxyCA;ServiceAccountKey
type CertificateAuthorityKind string

const (
	// CertificateAuthorityEtcdCA is the stacked etcd cluster's CA, the
	// <cluster>-etcd Secret: it signs etcd's server, peer and client
	// certificates, among them the API servers' and qcp-manager's.
	CertificateAuthorityEtcdCA CertificateAuthorityKind = "EtcdCA"
	// CertificateAuthorityClusterCA is the cluster's CA, the <cluster>-ca
	// Secret: it signs the API servers' serving certificates, every
	// component's and kubeconfig's client certificate, and the Nodes'
	// (kube-controller-manager signs their CSRs with it).
	CertificateAuthorityClusterCA CertificateAuthorityKind = "ClusterCA"
	// CertificateAuthorityFrontProxyCA is the front-proxy CA, the
	// <cluster>-proxy Secret: it signs the client certificate the API
	// servers present to aggregated API servers, which take the requests'
	// user from their headers only from a client it signed.
	CertificateAuthorityFrontProxyCA CertificateAuthorityKind = "FrontProxyCA"
	// CertificateAuthorityServiceAccountKey is the key pair that signs
	// service-account tokens, the <cluster>-sa Secret. Its stages are the
	// authorities': the API servers take tokens of both keys, then sign
	// with the new one, the Secret takes it, and after the API servers'
	// maximum token lifetime (24h) the old key is no longer taken. Legacy
	// token Secrets the old key signed stop working then.
	CertificateAuthorityServiceAccountKey CertificateAuthorityKind = "ServiceAccountKey"
)

// CertificateRotation asks for a rotation of one authority.
type CertificateRotation struct {
	// kind is the authority to rotate: EtcdCA, ClusterCA, FrontProxyCA or
	// ServiceAccountKey, on a control plane with stacked etcd (on external
	// etcd, none yet).
	// +required
	Kind CertificateAuthorityKind `json:"kind"`

	// trigger starts a rotation whenever it changes: a generation number or
	// a timestamp, as rollout.after is one. A rotation with the trigger of
	// the last completed one does nothing.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Trigger string `json:"trigger"`
}

// QuorumControlPlaneConfig is how a control plane's components run:
// everything in a QuorumControlPlane's spec but its replica count, its
// version and its machines' template. A QuorumControlPlaneTemplate carries
// it for every cluster made from a ClusterClass.
type QuorumControlPlaneConfig struct {
	// etcd chooses stacked etcd (the default: a member on every control plane
	// machine) or external etcd. The choice is fixed at creation.
	// +optional
	Etcd EtcdSpec `json:"etcd,omitempty,omitzero"`

	// apiServer configures kube-apiserver on every machine.
	// +optional
	APIServer APIServerSpec `json:"apiServer,omitempty,omitzero"`

	// controllerManager configures kube-controller-manager on every machine.
	// +optional
	ControllerManager ComponentSpec `json:"controllerManager,omitempty,omitzero"`

	// scheduler configures kube-scheduler on every machine.
	// +optional
	Scheduler ComponentSpec `json:"scheduler,omitempty,omitzero"`

	// rollout controls when and how machines are replaced.
	// +optional
	Rollout RolloutSpec `json:"rollout,omitempty,omitzero"`

	// remediation controls automatic repair of unhealthy machines.
	// +optional
	Remediation RemediationSpec `json:"remediation,omitempty,omitzero"`

	// addons are the addons QCP installs in the workload cluster, as
	// `kubeadm init` does: CoreDNS and kube-proxy, at the versions kubeadm
	// installs for the control plane's Kubernetes version, upgraded with it.
	// +optional
	Addons AddonsSpec `json:"addons,omitempty,omitzero"`

	// certificateValidityPeriodDays is how long the certificates each
	// machine issues itself (serving, client and etcd peer certificates) stay
	// valid, in days. Defaults to 365, as kubeadm. A change applies to
	// machines created afterwards and never rolls machines by itself; use
	// rollout.before.certificatesExpiryDays to replace machines whose
	// certificates are about to expire.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3650
	CertificateValidityPeriodDays *int32 `json:"certificateValidityPeriodDays,omitempty"`
}

// AddonsSpec chooses the addons QCP installs.
type AddonsSpec struct {
	// coreDNS is the cluster DNS: the kube-dns Service on the tenth address
	// of the service range, and the coredns Deployment.
	// +optional
	CoreDNS AddonSpec `json:"coreDNS,omitempty,omitzero"`
	// kubeProxy is the kube-proxy DaemonSet on the workers. Disable it for
	// a network plugin that replaces it, such as Cilium without kube-proxy.
	// +optional
	KubeProxy AddonSpec `json:"kubeProxy,omitempty,omitzero"`
}

// AddonSpec configures one addon.
type AddonSpec struct {
	// disabled: QCP does not install the addon, and deletes what it
	// installed of it, for clusters that bring their own.
	// +optional
	Disabled bool `json:"disabled,omitempty"`
}

// QuorumControlPlaneMachineTemplate is how control plane machines are shaped.
type QuorumControlPlaneMachineTemplate struct {
	// metadata (labels and annotations) is propagated to the machines in
	// place, never by a rollout.
	// +optional
	ObjectMeta clusterv1.ObjectMeta `json:"metadata,omitempty,omitzero"`
	// spec of the control plane machines.
	// +required
	Spec QuorumControlPlaneMachineTemplateSpec `json:"spec"`
}

// QuorumControlPlaneMachineTemplateSpec is the CAPI contract's machine spec.
type QuorumControlPlaneMachineTemplateSpec struct {
	// infrastructureRef names the infrastructure machine template to clone,
	// e.g. a ProcessMachineTemplate.
	// +required
	InfrastructureRef clusterv1.ContractVersionedObjectReference `json:"infrastructureRef"`
	// The rest is what a QuorumControlPlaneTemplate's machine template
	// carries too.
	QuorumControlPlaneMachineSettings `json:",inline"`
}

// QuorumControlPlaneMachineSettings is what QCP sets on its Machines and
// changes in place, without a rollout.
type QuorumControlPlaneMachineSettings struct {
	// deletion configures node drain and deletion timeouts; changes are
	// propagated to the machines in place.
	// +optional
	Deletion QuorumControlPlaneMachineTemplateDeletionSpec `json:"deletion,omitempty,omitzero"`
	// readinessGates are extra conditions CAPI core includes in each
	// Machine's Ready condition; they are copied to the machines in place.
	// +optional
	// +listType=map
	// +listMapKey=conditionType
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	ReadinessGates []clusterv1.MachineReadinessGate `json:"readinessGates,omitempty"`
	// taints are copied to the machines in place. CAPI core puts a
	// Machine's taints on its Node only while its alpha
	// MachineTaintPropagation feature gate is on; otherwise they stay on the
	// Machines.
	// +optional
	// +listType=map
	// +listMapKey=key
	// +listMapKey=effect
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Taints []clusterv1.MachineTaint `json:"taints,omitempty"`
}

// QuorumControlPlaneMachineTemplateDeletionSpec configures machine deletion.
// +kubebuilder:validation:MinProperties=1
type QuorumControlPlaneMachineTemplateDeletionSpec struct {
	// nodeDrainTimeoutSeconds bounds node drain; 0 means no limit.
	// +optional
	// +kubebuilder:validation:Minimum=0
	NodeDrainTimeoutSeconds *int32 `json:"nodeDrainTimeoutSeconds,omitempty"`
	// nodeVolumeDetachTimeoutSeconds bounds the wait for volumes to detach;
	// 0 means no limit.
	// +optional
	// +kubebuilder:validation:Minimum=0
	NodeVolumeDetachTimeoutSeconds *int32 `json:"nodeVolumeDetachTimeoutSeconds,omitempty"`
	// nodeDeletionTimeoutSeconds bounds node deletion; 0 retries forever.
	// +optional
	// +kubebuilder:validation:Minimum=0
	NodeDeletionTimeoutSeconds *int32 `json:"nodeDeletionTimeoutSeconds,omitempty"`
}

// EtcdSpec chooses where the control plane's etcd runs: stacked (neither
// external nor clusterRef set, optionally tuned by stacked), external
// endpoints, or an EtcdCluster.
// +kubebuilder:validation:XValidation:rule="[has(self.stacked), has(self.external), has(self.clusterRef)].filter(x, x).size() <= 1",message="set at most one of stacked, external and clusterRef; remove the others"
type EtcdSpec struct {
	// stacked tunes the etcd member QCP runs on every control plane machine.
	// +optional
	Stacked StackedEtcd `json:"stacked,omitempty,omitzero"`
	// external points the API servers at an etcd cluster QCP does not run.
	// +optional
	External *ExternalEtcd `json:"external,omitempty"`
	// clusterRef names an EtcdCluster in the same namespace; the control
	// plane waits until it is ready and uses its endpoints and Secrets.
	// +optional
	ClusterRef *LocalObjectReference `json:"clusterRef,omitempty"`
}

// IsStacked reports whether QCP runs etcd on the control plane machines.
func (e EtcdSpec) IsStacked() bool { return e.External == nil && e.ClusterRef == nil }

// StackedEtcd tunes stacked etcd members.
// +kubebuilder:validation:MinProperties=1
type StackedEtcd struct {
	// version of etcd, e.g. v3.6.16; machines run bin/etcd-<version>. Empty
	// means the version this QCP release pins.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Version string `json:"version,omitempty"`
	// extraArgs are added to every etcd member's command line. The backend
	// quota is set by quotaBackendBytes, not here.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	ExtraArgs []Arg `json:"extraArgs,omitempty"`
	// maintenance is QCP's upkeep of the members' databases.
	// +optional
	Maintenance EtcdMaintenance `json:"maintenance,omitempty,omitzero"`
	// quotaBackendBytes is the size, in bytes, a member's database may
	// reach before etcd raises NOSPACE and refuses writes. Unset means
	// etcd's default, 2 GiB; at least 16 MiB. Above 8 GiB etcd warns at
	// startup. A change restarts each member in place, one at a time,
	// without replacing machines; it works while NOSPACE is raised too, so
	// a raised quota gives a full database room again.
	// +optional
	// +kubebuilder:validation:Minimum=16777216
	QuotaBackendBytes *int64 `json:"quotaBackendBytes,omitempty"`
}

// DefaultQuotaBackendBytes is etcd's own backend quota, 2 GiB: the quota
// of members whose spec leaves quotaBackendBytes unset.
const DefaultQuotaBackendBytes int64 = 2 << 30

// DefragmentationPolicy says whether QCP defragments etcd members itself.
// +kubebuilder:validation:Enum=Automatic;Disabled
type DefragmentationPolicy string

const (
	// DefragmentationAutomatic defragments a member whose database is
	// mostly free pages, one member at a time, only while the cluster can
	// lose one member, followers first and the leader after a leadership
	// transfer.
	DefragmentationAutomatic DefragmentationPolicy = "Automatic"
	// DefragmentationDisabled leaves defragmentation to someone else.
	DefragmentationDisabled DefragmentationPolicy = "Disabled"
)

// Defaults of EtcdMaintenance.
const (
	DefaultDefragThresholdPercent   int32 = 45
	DefaultDefragMinSizeMiB         int32 = 100
	DefaultDefragMinIntervalSeconds int32 = 3600
	DefaultCompactionRetention      int64 = 1000
)

// EtcdMaintenance is QCP's upkeep of etcd's databases. Compaction frees
// space inside a member's database file; only defragmentation gives it
// back, and the member blocks its reads and writes while it defragments.
// When a member raises NOSPACE, QCP compacts, defragments every member one
// at a time and disarms the alarm by itself, whatever the defragmentation
// policy.
// +kubebuilder:validation:MinProperties=1
type EtcdMaintenance struct {
	// defragmentation is Automatic (the default) or Disabled.
	// +optional
	Defragmentation DefragmentationPolicy `json:"defragmentation,omitempty"`
	// defragThresholdPercent is the share of a member's database, in
	// percent, that must be free pages before it is defragmented. Defaults
	// to 45.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=99
	DefragThresholdPercent *int32 `json:"defragThresholdPercent,omitempty"`
	// defragMinSizeMiB is the database size, in MiB, below which a member is
	// never defragmented: the space is not worth the disruption. Defaults
	// to 100.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1048576
	DefragMinSizeMiB *int32 `json:"defragMinSizeMiB,omitempty"`
	// defragMinIntervalSeconds is the least time between two
	// defragmentations of the same member, so that a database whose data
	// fills it never loops. Defaults to 3600.
	// +optional
	// +kubebuilder:validation:Minimum=60
	// +kubebuilder:validation:Maximum=2592000
	DefragMinIntervalSeconds *int32 `json:"defragMinIntervalSeconds,omitempty"`
	// compactionRetentionRevisions is how many revisions of history QCP
	// keeps when it compacts etcd to recover from a NOSPACE alarm. Watchers
	// further behind must list again. The API servers compact every 5
	// minutes to the revision of 5 minutes before, never more recent than
	// this; so whichever of the two ran last decides, and neither undoes
	// the other. Defaults to 1000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	CompactionRetentionRevisions *int64 `json:"compactionRetentionRevisions,omitempty"`
}

// APIServerSpec configures kube-apiserver.
// +kubebuilder:validation:MinProperties=1
type APIServerSpec struct {
	// extraArgs are added to kube-apiserver's command line.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	ExtraArgs []Arg `json:"extraArgs,omitempty"`
	// certSANs are extra DNS names and IP addresses for the API server's
	// serving certificate, besides the control plane endpoint and the
	// machine's own address.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	CertSANs []string `json:"certSANs,omitempty"`
}

// ComponentSpec configures a control plane component that takes only flags.
// +kubebuilder:validation:MinProperties=1
type ComponentSpec struct {
	// extraArgs are added to the component's command line.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	ExtraArgs []Arg `json:"extraArgs,omitempty"`
}

// Arg is one command-line flag, passed as --name=value.
type Arg struct {
	// name of the flag, without leading dashes, e.g. audit-log-path.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9][a-z0-9.-]*$')",message="name the flag without leading dashes, in lower case, e.g. audit-log-path"
	Name string `json:"name"`
	// value of the flag; may be empty.
	// +required
	// +kubebuilder:validation:MinLength=0
	// +kubebuilder:validation:MaxLength=1024
	Value string `json:"value"`
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
	// before rolls out machines ahead of an event, such as certificate
	// expiry.
	// +optional
	Before RolloutBefore `json:"before,omitempty,omitzero"`
}

// RolloutBefore rolls out machines before something happens to them.
type RolloutBefore struct {
	// certificatesExpiryDays rolls out a machine whose certificates expire
	// within this many days. It must be less than
	// certificateValidityPeriodDays, or the replacement would be rolled
	// out again at once.
	// +optional
	// +kubebuilder:validation:Minimum=7
	CertificatesExpiryDays *int32 `json:"certificatesExpiryDays,omitempty"`
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

// RemediationSpec controls automatic repair. QCP remediates the machines
// that a MachineHealthCheck marks, whichever health check marked them, one
// at a time and only as etcd's quorum allows.
type RemediationSpec struct {
	// autorepair makes QCP own a MachineHealthCheck for its machines, named
	// after the control plane. It defaults to true. When the Cluster is made
	// from a ClusterClass that defines the control plane's health check
	// (spec.controlPlane.healthCheck, unless the Cluster's
	// spec.topology.controlPlane.healthCheck.enabled is false), CAPI's
	// topology controller keeps that one instead and QCP keeps none, because
	// two health checks must not select the same machines; QCP remediates
	// what the class's health check marks.
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
	// minHealthyPeriodSeconds is how long a replacement must run before its
	// failure starts a new chain of remediations instead of counting as a
	// retry of the one it replaced. Defaults to 3600.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MinHealthyPeriodSeconds *int32 `json:"minHealthyPeriodSeconds,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:path=quorumcontrolplanes,shortName=qcp,scope=Namespaced,categories=cluster-api
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']",description="The Cluster this control plane belongs to"
// +kubebuilder:printcolumn:name="Available",type="string",JSONPath=`.status.conditions[?(@.type=="Available")].status`,description="Whether the control plane serves with etcd quorum"
// +kubebuilder:printcolumn:name="Desired",type="integer",JSONPath=".spec.replicas",description="The desired number of machines"
// +kubebuilder:printcolumn:name="Current",type="integer",JSONPath=".status.replicas",description="The number of machines"
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas",description="Machines whose Ready condition is true"
// +kubebuilder:printcolumn:name="Up-to-date",type="integer",JSONPath=".status.upToDateReplicas",description="Machines whose UpToDate condition is true"
// +kubebuilder:printcolumn:name="Leader",type="string",JSONPath=`.status.etcd.members[?(@.role=="Leader")].machine`,description="The machine of the etcd leader"
// +kubebuilder:printcolumn:name="Initialized",type="boolean",JSONPath=".status.initialization.controlPlaneInitialized",description="Whether the first API server has answered"
// +kubebuilder:printcolumn:name="Paused",type="string",JSONPath=`.status.conditions[?(@.type=="Paused")].status`,description="Whether reconciliation is paused",priority=10
// +kubebuilder:printcolumn:name="Operation",type="string",JSONPath=".status.lastOperation.kind",description="The quorum engine's latest step",priority=10
// +kubebuilder:printcolumn:name="Target",type="string",JSONPath=".status.lastOperation.target",description="What the latest step acts on",priority=10
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.lastOperation.reason",description="Why the latest step, or what the control plane waits for",priority=10
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp",description="Time since creation"
// +kubebuilder:printcolumn:name="Version",type="string",JSONPath=".spec.version",description="The desired Kubernetes version"

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
