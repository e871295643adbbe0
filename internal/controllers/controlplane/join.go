package controlplane

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	netutils "k8s.io/utils/net"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kubeadmv1beta4 "sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types/upstreamv1beta4"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// What `kubeadm init` leaves in a new cluster for `kubeadm join`, which
// CAPI's kubeadm bootstrap provider (CABPK) runs on every worker: QCP's
// machines run no kubeadm, so QCP writes the same objects itself. Each is
// named after its kubeadm source (k8s.io/kubernetes, cmd/kubeadm/app);
// their names and keys are contracts with kubeadm join and the kubelet.
const (
	// joinFieldManager owns the fields QCP applies; the bootstrap signer
	// adds its jws-kubeconfig-<token id> keys to cluster-info under its own.
	joinFieldManager = "qcp-manager"
	// joinResync is how often the artifacts are applied again when nothing
	// in them changed, so that one deleted by hand comes back.
	joinResync = 10 * time.Minute

	// bootstrapTokenGroup is constants.NodeBootstrapTokenAuthGroup, the
	// group CABPK's tokens authenticate in (auth-extra-groups).
	bootstrapTokenGroup = "system:bootstrappers:kubeadm:default-node-token"
	// nodesGroup is constants.NodesGroup.
	nodesGroup = "system:nodes"
	// kubeadmCertificatesDir is kubeadm's default certificatesDir: where
	// a joined worker keeps ca.crt, which kubelet-config names.
	kubeadmCertificatesDir = "/etc/kubernetes/pki"
)

// joinArtifacts is every object of the join contract, in the order they
// are applied.
func joinArtifacts(cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, network clusterNetwork, clusterTrust []byte, ext *externalEtcd) ([]client.Object, error) {
	endpoint := net.JoinHostPort(cluster.Spec.ControlPlaneEndpoint.Host, strconv.Itoa(int(cluster.Spec.ControlPlaneEndpoint.Port)))
	clusterInfo, err := clusterInfoKubeconfig("https://"+endpoint, clusterTrust)
	if err != nil {
		return nil, err
	}
	clusterConfiguration, err := kubeadmClusterConfiguration(cluster, cp, network, endpoint, ext)
	if err != nil {
		return nil, err
	}
	kubeletConfiguration, err := kubeletBaseConfiguration(network)
	if err != nil {
		return nil, err
	}
	return []client.Object{
		// phases/bootstraptoken/clusterinfo: CreateBootstrapConfigMapIfNotExists
		// (bootstrapapi.ConfigMapClusterInfo, key bootstrapapi.KubeConfigKey)
		// and CreateClusterInfoRBACRules (BootstrapSignerClusterRoleName, for
		// user.Anonymous): discovery reads it before it trusts anything.
		configMap(metav1.NamespacePublic, "cluster-info", map[string]string{"kubeconfig": clusterInfo}),
		role(metav1.NamespacePublic, "kubeadm:bootstrap-signer-clusterinfo", getConfigMap("cluster-info")),
		roleBinding(metav1.NamespacePublic, "kubeadm:bootstrap-signer-clusterinfo", user("system:anonymous")),
		// phases/uploadconfig: UploadConfiguration (constants.KubeadmConfigConfigMap,
		// key constants.ClusterConfigurationConfigMapKey, and the Role
		// NodesKubeadmConfigClusterRoleName for bootstrap tokens and nodes).
		configMap(metav1.NamespaceSystem, "kubeadm-config", map[string]string{"ClusterConfiguration": clusterConfiguration}),
		role(metav1.NamespaceSystem, "kubeadm:nodes-kubeadm-config", getConfigMap("kubeadm-config")),
		roleBinding(metav1.NamespaceSystem, "kubeadm:nodes-kubeadm-config", group(bootstrapTokenGroup), group(nodesGroup)),
		// phases/kubelet: CreateConfigMap (constants.KubeletBaseConfigurationConfigMap,
		// key constants.KubeletBaseConfigurationConfigMapKey, and the Role
		// constants.KubeletBaseConfigMapRole).
		configMap(metav1.NamespaceSystem, "kubelet-config", map[string]string{"kubelet": kubeletConfiguration}),
		role(metav1.NamespaceSystem, "kubeadm:kubelet-config", getConfigMap("kubelet-config")),
		roleBinding(metav1.NamespaceSystem, "kubeadm:kubelet-config", group(nodesGroup), group(bootstrapTokenGroup)),
		// phases/bootstraptoken/node: AllowBootstrapTokensToPostCSRs
		// (constants.NodeKubeletBootstrap), AllowBootstrapTokensToGetNodes
		// (constants.GetNodesClusterRoleName), AutoApproveNodeBootstrapTokens
		// (constants.NodeAutoApproveBootstrapClusterRoleBinding) and
		// AutoApproveNodeCertificateRotation
		// (constants.NodeAutoApproveCertificateRotationClusterRoleBinding): a
		// token may ask for a node client certificate, which
		// kube-controller-manager's csrapproving then approves, as it does
		// a node's own renewal.
		clusterRoleBinding("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", group(bootstrapTokenGroup)),
		clusterRole("kubeadm:get-nodes", rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"nodes"}}),
		clusterRoleBinding("kubeadm:get-nodes", "kubeadm:get-nodes", group(bootstrapTokenGroup)),
		clusterRoleBinding("kubeadm:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", group(bootstrapTokenGroup)),
		clusterRoleBinding("kubeadm:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", group(nodesGroup)),
		// phases/bootstraptoken/node: AllowAPIServerToAccessKubeletAPI
		// (constants.KubeletAPIAdminClusterRoleBindingName for
		// constants.APIServerKubeletClientCertCommonName, the CN of
		// certs.IssueKubeletClient): logs, exec and port-forward on workers.
		clusterRoleBinding("kubeadm:apiserver-kubelet-client", "system:kubelet-api-admin", user("kube-apiserver-kubelet-client")),
	}, nil
}

// The workload objects QCP writes are typed objects, each with its
// TypeMeta, which applyConfigurations turns into server-side applies.

func typeMeta(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}

func configMap(ns, name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{TypeMeta: typeMeta("v1", "ConfigMap"), ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}
}

func serviceAccount(ns, name string) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{TypeMeta: typeMeta("v1", "ServiceAccount"), ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
}

func role(ns, name string, rules ...rbacv1.PolicyRule) *rbacv1.Role {
	return &rbacv1.Role{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "Role"), ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: rules}
}

func clusterRole(name string, rules ...rbacv1.PolicyRule) *rbacv1.ClusterRole {
	return &rbacv1.ClusterRole{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "ClusterRole"), ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
}

// roleBinding binds the Role of the same name.
func roleBinding(ns, name string, subjects ...rbacv1.Subject) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "RoleBinding"), ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subjects}
}

func clusterRoleBinding(name, clusterRole string, subjects ...rbacv1.Subject) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{TypeMeta: typeMeta("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"), ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole}, Subjects: subjects}
}

func getConfigMap(name string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{name}}
}

func group(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: name}
}

func user(name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}
}

func serviceAccountSubject(ns, name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}
}

// applyConfigurations are objs as server-side apply configurations, without
// the fields a typed object always carries and QCP does not set (status,
// creation timestamps).
func applyConfigurations(objs []client.Object) ([]runtime.ApplyConfiguration, error) {
	out := make([]runtime.ApplyConfiguration, 0, len(objs))
	for _, o := range objs {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil, fmt.Errorf("%T %s: %w", o, o.GetName(), err)
		}
		delete(u, "status")
		unstructured.RemoveNestedField(u, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(u, "spec", "template", "metadata", "creationTimestamp")
		out = append(out, client.ApplyConfigurationFromUnstructured(&unstructured.Unstructured{Object: u}))
	}
	return out, nil
}

// clusterInfoKubeconfig is cluster-info's kubeconfig: one cluster named ""
// with the endpoint and the CAs a joining node must trust (both while a
// cluster CA rotation runs), and no user.
func clusterInfoKubeconfig(server string, clusterTrust []byte) (string, error) {
	data, err := clientcmd.Write(clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{"": {Server: server, CertificateAuthorityData: clusterTrust}},
	})
	if err != nil {
		return "", fmt.Errorf("writing cluster-info's kubeconfig: %w", err)
	}
	return string(data), nil
}

// kubeadmClusterConfiguration is kube-system/kubeadm-config's
// ClusterConfiguration (kubeadm.k8s.io/v1beta4): the cluster as kubeadm
// would describe it. Workers read it during join; the file paths are
// kubeadm's defaults, which QCP's own machines do not use.
func kubeadmClusterConfiguration(cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, network clusterNetwork, endpoint string, ext *externalEtcd) (string, error) {
	cfg := kubeadmv1beta4.ClusterConfiguration{
		TypeMeta:             metav1.TypeMeta{APIVersion: kubeadmv1beta4.GroupVersion.String(), Kind: "ClusterConfiguration"},
		ClusterName:          cluster.Name,
		KubernetesVersion:    cp.Spec.Version,
		ControlPlaneEndpoint: endpoint,
		CertificatesDir:      kubeadmCertificatesDir,
		ImageRepository:      "registry.k8s.io",
		Networking: kubeadmv1beta4.Networking{
			ServiceSubnet: network.Services,
			PodSubnet:     network.Pods,
			DNSDomain:     network.DNSDomain,
		},
		APIServer: kubeadmv1beta4.APIServer{CertSANs: cp.Spec.APIServer.CertSANs},
	}
	if ext == nil {
		cfg.Etcd.Local = &kubeadmv1beta4.LocalEtcd{DataDir: "/var/lib/etcd"}
	} else {
		cfg.Etcd.External = &kubeadmv1beta4.ExternalEtcd{
			Endpoints: ext.endpoints,
			CAFile:    kubeadmCertificatesDir + "/etcd/ca.crt",
			CertFile:  kubeadmCertificatesDir + "/apiserver-etcd-client.crt",
			KeyFile:   kubeadmCertificatesDir + "/apiserver-etcd-client.key",
		}
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("writing kubeadm-config's ClusterConfiguration: %w", err)
	}
	return string(data), nil
}

// kubeletBaseConfiguration is kube-system/kubelet-config's
// KubeletConfiguration: kubeadm's defaults (componentconfigs/kubelet.go,
// kubeletConfig.Default) for the cluster's service range and domain.
func kubeletBaseConfiguration(network clusterNetwork) (string, error) {
	dns, err := network.DNSIP()
	if err != nil {
		return "", err
	}
	cfg := kubeletv1beta1.KubeletConfiguration{
		TypeMeta:      metav1.TypeMeta{APIVersion: kubeletv1beta1.SchemeGroupVersion.String(), Kind: "KubeletConfiguration"},
		StaticPodPath: "/etc/kubernetes/manifests",
		ClusterDNS:    []string{dns},
		ClusterDomain: network.DNSDomain,
		Authentication: kubeletv1beta1.KubeletAuthentication{
			X509:      kubeletv1beta1.KubeletX509Authentication{ClientCAFile: kubeadmCertificatesDir + "/ca.crt"},
			Anonymous: kubeletv1beta1.KubeletAnonymousAuthentication{Enabled: ptr.To(false)},
			Webhook:   kubeletv1beta1.KubeletWebhookAuthentication{Enabled: ptr.To(true)},
		},
		Authorization:      kubeletv1beta1.KubeletAuthorization{Mode: kubeletv1beta1.KubeletAuthorizationModeWebhook},
		HealthzBindAddress: "127.0.0.1",
		HealthzPort:        ptr.To[int32](10248),
		RotateCertificates: true,
		CgroupDriver:       "systemd",
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("writing kubelet-config's KubeletConfiguration: %w", err)
	}
	return string(data), nil
}

// clusterDNSIP is the tenth address of the service range, as kubeadm's
// constants.GetDNSIP picks it.
func clusterDNSIP(serviceRange string) (string, error) {
	_, n, err := net.ParseCIDR(serviceRange)
	if err != nil {
		return "", fmt.Errorf("the service range %q: %w", serviceRange, err)
	}
	ip, err := netutils.GetIndexedIP(n, 10)
	if err != nil {
		return "", fmt.Errorf("the service range %q has no tenth address for the cluster DNS", serviceRange)
	}
	return ip.String(), nil
}

// workloadRecord is what was last applied to a workload cluster, and when.
type workloadRecord struct {
	hash string
	at   time.Time
}

// ensureWorkloadObjects applies the join artifacts and the addons once the
// first API server answers, deletes what QCP installed of a disabled addon,
// and does it again when any of it changes (a new CA, version, endpoint or
// addon choice) or joinResync has passed. A failure is logged and reported
// in an event and retried on the next round; it never holds the control
// plane's own steps.
func (r *Reconciler) ensureWorkloadObjects(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, secrets *clusterSecrets, obs *observation) {
	if !obs.initialized {
		return
	}
	logger := log.FromContext(ctx)
	apply, remove, err := r.workloadObjects(cluster, cp, secrets)
	if err != nil {
		logger.Error(err, "Rendering the join artifacts and addons")
		r.Recorder.Eventf(cp, corev1.EventTypeWarning, "WorkloadObjectsFailed", "Rendering the join artifacts and addons: %v", err)
		return
	}
	sum := sha256.New()
	for _, o := range apply {
		data, err := json.Marshal(o)
		if err != nil {
			logger.Error(err, "Rendering the join artifacts and addons")
			return
		}
		sum.Write(data)
	}
	for _, o := range remove {
		fmt.Fprintf(sum, "-%T/%s/%s", o, o.GetNamespace(), o.GetName())
	}
	hash, key := hex.EncodeToString(sum.Sum(nil)), client.ObjectKeyFromObject(cluster)
	if v, ok := r.workloadApplied.Load(key); ok {
		if last := v.(workloadRecord); last.hash == hash && r.Now().Sub(last.at) < joinResync {
			return
		}
	}
	// Uncached: a cached client would start a cluster-wide informer per
	// kind in every workload cluster for a few writes every ten minutes.
	c, err := r.ClusterCache.GetUncachedClient(ctx, key)
	if err != nil {
		if !errors.Is(err, clustercache.ErrClusterNotConnected) {
			logger.Error(err, "Reaching the workload cluster for the join artifacts and addons")
		}
		return
	}
	fail := func(err error) {
		r.Recorder.Eventf(cp, corev1.EventTypeWarning, "WorkloadObjectsFailed", "Applying the join artifacts and addons to the workload cluster: %v", err)
		logger.Error(err, "Applying the join artifacts and addons")
	}
	for _, o := range apply {
		if err := c.Apply(ctx, o, client.FieldOwner(joinFieldManager), client.ForceOwnership); err != nil {
			fail(err)
			return
		}
	}
	for _, o := range remove {
		if err := deleteAddonObject(ctx, c, o); err != nil {
			fail(err)
			return
		}
	}
	if _, seen := r.workloadApplied.Swap(key, workloadRecord{hash: hash, at: r.Now()}); !seen {
		r.Recorder.Event(cp, corev1.EventTypeNormal, "WorkloadObjectsApplied",
			"The workload cluster has what kubeadm join needs (cluster-info, kubeadm-config, kubelet-config, the bootstrap-token RBAC) and the enabled addons")
	}
}

// workloadObjects renders what ensureWorkloadObjects applies and removes.
func (r *Reconciler) workloadObjects(cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, secrets *clusterSecrets) (apply []runtime.ApplyConfiguration, remove []client.Object, err error) {
	trust := secrets.cas.ClusterTrust
	if trust == nil {
		trust = secrets.cas.Cluster.CertPEM
	}
	network, err := recordedNetwork(cp)
	if err != nil {
		return nil, nil, err
	}
	join, err := joinArtifacts(cluster, cp, network, trust, secrets.external)
	if err != nil {
		return nil, nil, err
	}
	// The lowest version a machine runs, so that kube-proxy is never newer
	// than an API server; upgraded once the last machine is.
	version := cmp.Or(cp.Status.Version, cp.Spec.Version)
	endpoint := cluster.Spec.ControlPlaneEndpoint
	server := "https://" + net.JoinHostPort(endpoint.Host, strconv.Itoa(int(endpoint.Port)))
	addons, remove, err := addonObjects(cp, network, server, version)
	if err != nil {
		return nil, nil, err
	}
	if apply, err = applyConfigurations(append(join, addons...)); err != nil {
		return nil, nil, err
	}
	return apply, remove, nil
}

// deleteAddonObject deletes o from the workload cluster if it exists and
// QCP installed it (addonsManagedBy); another of the same name is left.
func deleteAddonObject(ctx context.Context, c client.Client, o client.Object) error {
	live := o.DeepCopyObject().(client.Object)
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), live); err != nil {
		return client.IgnoreNotFound(err)
	}
	for k, v := range addonsManagedBy {
		if live.GetLabels()[k] != v {
			return nil
		}
	}
	return client.IgnoreNotFound(c.Delete(ctx, live, client.Preconditions{UID: ptr.To(live.GetUID())}))
}
