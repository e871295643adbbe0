// Package bootstrap defines the bootstrap data document a bootstrap provider
// writes for a QCP machine and qcp-agent reads: which components to run, at
// which versions, how etcd joins, and the CA material a control plane node
// needs. The machine's own identity (name, address, failure domain) is not
// here: a bootstrap provider does not know it; the infrastructure side
// supplies it separately (see internal/agent's machine.json).
//
// The format is documented in docs/bootstrap-format.md.
package bootstrap

import "time"

// Version identifiers of the document.
const (
	APIVersion = "bootstrap.qcp.dev/v1alpha1"
	Kind       = "MachineBootstrap"
	// Format is what a bootstrap data Secret's "format" key says, next to
	// the document under "value" (CAPI's bootstrap data contract).
	Format = "qcp"
)

// Component names a process the agent can run.
type Component string

// The components the agent knows how to run.
const (
	Etcd                  Component = "etcd"
	KubeAPIServer         Component = "kube-apiserver"
	KubeControllerManager Component = "kube-controller-manager"
	KubeScheduler         Component = "kube-scheduler"
)

// AllComponents lists the components in the order the agent starts them.
var allComponents = []Component{Etcd, KubeAPIServer, KubeControllerManager, KubeScheduler}

// EtcdMode says whether a local etcd member starts a new cluster or joins one.
type EtcdMode string

// The etcd join modes.
const (
	EtcdModeNew      EtcdMode = "new"
	EtcdModeExisting EtcdMode = "existing"
)

// Document is the bootstrap data of one machine.
type Document struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// ClusterName names the workload cluster; it is the etcd cluster token
	// and the kube-controller-manager --cluster-name.
	ClusterName string `json:"clusterName"`
	// ControlPlaneEndpoint is host:port of the cluster's load balancer. It
	// goes into the API server certificate's SANs and is where the agent
	// registers its Node. Empty means "use the local API server".
	ControlPlaneEndpoint string      `json:"controlPlaneEndpoint,omitempty"`
	Components           []Component `json:"components"`
	Versions             Versions    `json:"versions"`
	Etcd                 EtcdConfig  `json:"etcd"`
	Certificates         CAMaterial  `json:"certificates"`
	Tunables             Tunables    `json:"tunables,omitempty"`
	// ExtraArgs are command-line flags per component, appended after the
	// agent's own so that a flag given here wins where the binary takes
	// the last value (a repeated list flag of a Kubernetes component adds
	// to the agent's list instead). Lists rather than a map of names keep
	// the order and let a flag be repeated. Flags the agent must own are
	// rejected; see ownedFlags.
	ExtraArgs map[Component][]Arg `json:"extraArgs,omitempty"`
	// CertSANs are extra Subject Alternative Names (IP addresses or DNS
	// names) of the kube-apiserver serving certificate, added to those the
	// agent derives, for names clients use that QCP cannot know, such as a
	// DNS name in front of the load balancer.
	CertSANs []string `json:"certSANs,omitempty"`
}

// Arg is one command-line flag, passed as --Name=Value.
type Arg struct {
	// Name is the flag's name without leading dashes, e.g. "v".
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Flag returns the argument as the agent passes it. The = form keeps a
// value that starts with '-' from being read as another flag.
func (a Arg) Flag() string { return "--" + a.Name + "=" + a.Value }

// Versions of the binaries to run; the agent looks for
// <bin-dir>/kube-<kubernetes> and <bin-dir>/etcd-<etcd>.
type Versions struct {
	Kubernetes string `json:"kubernetes,omitempty"`
	Etcd       string `json:"etcd,omitempty"`
}

// EtcdConfig holds either Local (the machine runs a member) or External
// (the API server talks to etcd elsewhere), never both.
type EtcdConfig struct {
	Local    *LocalEtcd    `json:"local,omitempty"`
	External *ExternalEtcd `json:"external,omitempty"`
}

// LocalEtcd describes the member this machine runs.
type LocalEtcd struct {
	Mode EtcdMode `json:"mode"`
	// ExistingEndpoints are client URLs (https://host:2379) of running
	// members; with mode existing the agent polls them until its own peer
	// URL is in the member list before it starts etcd.
	ExistingEndpoints []string `json:"existingEndpoints,omitempty"`
	// InitialCluster (name=peerURL,...) is used as given when set and the
	// member list cannot be read; otherwise it is built from the member list.
	InitialCluster string `json:"initialCluster,omitempty"`
	// QuotaBackendBytes is etcd's --quota-backend-bytes; 0 leaves etcd's
	// default (2 GiB). The agent's etcd settings file, written when the
	// manager changes the quota of a running member, overrides it.
	QuotaBackendBytes int64 `json:"quotaBackendBytes,omitempty"`
	// Restore, with mode new, starts the cluster from a stored snapshot
	// instead of empty: the agent restores it into the data directory
	// before etcd's first start.
	Restore *EtcdRestore `json:"restore,omitempty"`
}

// EtcdRestore is the snapshot a new etcd cluster starts from, and how to
// read it. It carries no object-store credentials: URL is presigned, and
// valid for a short time; a machine that starts after that fails its
// bootstrap and is replaced, with a new URL.
type EtcdRestore struct {
	// URL reads the snapshot object (a presigned GET).
	URL string `json:"url"`
	// CA is the PEM bundle to trust for the store's certificate, if the
	// host's roots do not cover it.
	CA string `json:"ca,omitempty"`
	// Snapshot names the object, for messages.
	Snapshot string `json:"snapshot"`
	// Size and SHA256 are the stored object's, from its manifest: the
	// download must match both.
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Revision is the snapshot's revision, from its manifest.
	Revision int64 `json:"revision"`
	// Key is the age identity of an encrypted snapshot; empty when the
	// snapshot is not encrypted.
	Key string `json:"key,omitempty"`
	// BumpRevision is added to the snapshot's revision (etcdutl snapshot
	// restore --bump-revision, with --mark-compacted).
	BumpRevision int64 `json:"bumpRevision"`
}

// ExternalEtcd is an etcd cluster the API server uses but this machine does
// not run a member of.
type ExternalEtcd struct {
	Endpoints []string `json:"endpoints"`
	// FollowMembership makes Endpoints a starting point only: the agent
	// serves kube-apiserver a local etcd endpoint that forwards to the
	// cluster's healthy voters as the member list says (an EtcdCluster,
	// whose members are replaced), so the API server's configuration never
	// changes when they do.
	FollowMembership bool   `json:"followMembership,omitempty"`
	CACert           string `json:"caCert"`
	// ClientCert and ClientKey are the apiserver-etcd-client pair.
	ClientCert string `json:"clientCert"`
	ClientKey  string `json:"clientKey"`
}

// CAMaterial is what kubeadm copies to every control plane node. All values
// are PEM.
type CAMaterial struct {
	ClusterCA *CertKey `json:"clusterCA,omitempty"`
	// ClusterTrust is the PEM bundle of the cluster authorities the
	// machine's components and clients trust; it holds ClusterCA's
	// certificate. Empty: ClusterCA's alone. A cluster CA rotation
	// trusts the old and the new authority beside each other.
	ClusterTrust string `json:"clusterTrust,omitempty"`
	// ClusterSigner is the authority kube-controller-manager signs
	// certificate requests with (the Nodes' kubelet certificates): pki/ca.crt
	// and ca.key. Empty: ClusterCA. A cluster CA rotation moves it to the
	// new authority from its first stage on, before the leaves, so that a
	// worker that joins during the rotation gets a certificate that
	// survives it; clusterTrust then holds it.
	ClusterSigner *CertKey `json:"clusterSigner,omitempty"`
	EtcdCA        *CertKey `json:"etcdCA,omitempty"`
	// EtcdTrust is the PEM bundle of the authorities etcd's client and
	// peer ports and every etcd client of the machine trust; it holds
	// EtcdCA's certificate. Empty: EtcdCA's alone. An etcd CA rotation
	// trusts the old and the new authority beside each other while its
	// leaves move from one to the other.
	EtcdTrust    string   `json:"etcdTrust,omitempty"`
	FrontProxyCA *CertKey `json:"frontProxyCA,omitempty"`
	// FrontProxyTrust is the PEM bundle of the front-proxy authorities the
	// API server takes request header clients of; it holds FrontProxyCA's
	// certificate. Empty: FrontProxyCA's alone. A front-proxy CA rotation
	// trusts the old and the new authority beside each other.
	FrontProxyTrust string            `json:"frontProxyTrust,omitempty"`
	ServiceAccount  *ServiceAccountKP `json:"serviceAccount,omitempty"`
}

// CertKey is a PEM certificate with its PEM private key.
type CertKey struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// ServiceAccountKP is the PEM key pair that signs service-account tokens.
type ServiceAccountKP struct {
	PrivateKey string `json:"privateKey"`
	PublicKey  string `json:"publicKey"`
}

// Tunables are optional knobs; zero values mean the defaults below.
type Tunables struct {
	// NodeMonitorGracePeriod is kube-controller-manager's
	// --node-monitor-grace-period, a Go duration.
	NodeMonitorGracePeriod string `json:"nodeMonitorGracePeriod,omitempty"`
	// ServiceClusterIPRange is the API server's and the controller
	// manager's --service-cluster-ip-range: the Cluster's
	// spec.clusterNetwork.services.cidrBlocks.
	ServiceClusterIPRange string `json:"serviceClusterIPRange,omitempty"`
	// PodCIDR, when set, is the controller manager's --cluster-cidr, with
	// node IPAM on: the Cluster's spec.clusterNetwork.pods.cidrBlocks.
	PodCIDR string `json:"podCIDR,omitempty"`
	// DNSDomain is the cluster's DNS domain (the Cluster's
	// spec.clusterNetwork.serviceDomain): in the API server's serving
	// certificate and service-account issuer, as kubeadm puts it.
	DNSDomain string `json:"dnsDomain,omitempty"`
	// CertificateValidityDays is how long the certificates the agent issues
	// for its machine are valid, in days.
	CertificateValidityDays int32 `json:"certificateValidityDays,omitempty"`
	// CertificateValidity, a Go duration, overrides CertificateValidityDays
	// when set: qcp-manager's --machine-certificate-lifetime, so that
	// renewal can be seen in minutes.
	CertificateValidity string `json:"certificateValidity,omitempty"`
}

// Defaults for the tunables. The grace period is short so that tests (and
// fault injection) see a frozen machine's Node go NotReady quickly.
const (
	DefaultNodeMonitorGracePeriod = "20s"
	DefaultServiceClusterIPRange  = "10.96.0.0/12"
	DefaultDNSDomain              = "cluster.local"
)

// Runs reports whether the document asks for component c.
func (d *Document) Runs(c Component) bool {
	for _, have := range d.Components {
		if have == c {
			return true
		}
	}
	return false
}

// RunsKubernetes reports whether any Kubernetes component is requested.
func (d *Document) RunsKubernetes() bool {
	return d.Runs(KubeAPIServer) || d.Runs(KubeControllerManager) || d.Runs(KubeScheduler)
}

// NodeMonitorGracePeriod returns the tunable or its default.
func (d *Document) NodeMonitorGracePeriod() string {
	if d.Tunables.NodeMonitorGracePeriod != "" {
		return d.Tunables.NodeMonitorGracePeriod
	}
	return DefaultNodeMonitorGracePeriod
}

// ExtraFlags returns the extra flags for c in the form the agent appends
// them to c's command line.
func (d *Document) ExtraFlags(c Component) []string {
	args := d.ExtraArgs[c]
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a.Flag()
	}
	return out
}

// LeafValidity is how long the machine's own certificates are valid: the
// tunables (the duration first), or 0 for the certificate package's
// default. Parse has checked the duration.
func (d *Document) LeafValidity() time.Duration {
	if v, err := time.ParseDuration(d.Tunables.CertificateValidity); err == nil && v > 0 {
		return v
	}
	return time.Duration(d.Tunables.CertificateValidityDays) * 24 * time.Hour
}

// ServiceClusterIPRange returns the tunable or its default.
func (d *Document) ServiceClusterIPRange() string {
	if d.Tunables.ServiceClusterIPRange != "" {
		return d.Tunables.ServiceClusterIPRange
	}
	return DefaultServiceClusterIPRange
}

// DNSDomain returns the tunable or its default.
func (d *Document) DNSDomain() string {
	if d.Tunables.DNSDomain != "" {
		return d.Tunables.DNSDomain
	}
	return DefaultDNSDomain
}

// ControlPlaneNodeRole is kubeadm's control plane Node label and taint key
// (constants.LabelNodeRoleControlPlane): qcp-agent puts both on its Node,
// and QCP's addons tolerate the taint as kubeadm's do.
const ControlPlaneNodeRole = "node-role.kubernetes.io/control-plane"

// NoKubeletNodeLabel is on the Node of every machine qcp-agent runs: it runs
// no kubelet, so nothing scheduled there ever starts. QCP's addons keep off
// such Nodes with a node affinity on it, and so should any workload meant
// for every Node, such as a network plugin's DaemonSet.
const NoKubeletNodeLabel = "node.qcp.dev/no-kubelet"
