package controlplane

import (
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	componentbaseconfigv1alpha1 "k8s.io/component-base/config/v1alpha1"
	kubeproxyv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// The addons `kubeadm init` installs (cmd/kubeadm/app/phases/addons/dns and
// proxy), rendered by QCP as kubeadm renders them, with one difference: QCP's
// own Nodes run no kubelet, so neither addon may be placed there (an
// affinity on bootstrap.NoKubeletNodeLabel, which the agent sets).

// addonsManagedBy labels every addon object QCP installs; a disabled
// addon's objects are deleted only when they carry it, so one a user
// installed under the same name is left alone.
var addonsManagedBy = map[string]string{"app.kubernetes.io/managed-by": "qcp"}

// coreDNSVersions is the CoreDNS kubeadm installs, by Kubernetes minor
// (constants.CoreDNSVersion of each kubeadm release). A newer minor gets
// the newest QCP knows.
var coreDNSVersions = map[uint]string{35: "v1.13.1", 36: "v1.14.2"}

// coreDNSVersion is the CoreDNS version for Kubernetes version.
func coreDNSVersion(version string) (string, error) {
	v, err := utilversion.ParseSemantic(version)
	if err != nil {
		return "", fmt.Errorf("the control plane's version %q: %w", version, err)
	}
	if tag, ok := coreDNSVersions[v.Minor()]; ok {
		return tag, nil
	}
	newest := uint(0)
	for minor := range coreDNSVersions {
		newest = max(newest, minor)
	}
	if v.Minor() < newest {
		return "", fmt.Errorf("QCP does not know which CoreDNS kubeadm installs for %s", version)
	}
	return coreDNSVersions[newest], nil
}

// addonObjects are the addon objects to apply for cp's cluster at version
// (the lowest version its machines run, so that kube-proxy is never newer
// than an API server), labelled as QCP's, and those of disabled addons to
// delete.
func addonObjects(cp *controlplanev1.QuorumControlPlane, network clusterNetwork, server, version string) (apply, remove []client.Object, err error) {
	dns, err := coreDNSObjects(network, version)
	if err != nil {
		return nil, nil, err
	}
	proxy, err := kubeProxyObjects(network, server, version)
	if err != nil {
		return nil, nil, err
	}
	for _, addon := range []struct {
		objs     []client.Object
		disabled bool
	}{{dns, cp.Spec.Addons.CoreDNS.Disabled}, {proxy, cp.Spec.Addons.KubeProxy.Disabled}} {
		if addon.disabled {
			remove = append(remove, addon.objs...)
			continue
		}
		for _, o := range addon.objs {
			o.SetLabels(mergeInto(o.GetLabels(), addonsManagedBy))
		}
		apply = append(apply, addon.objs...)
	}
	return apply, remove, nil
}

// awayFromQCPNodes keeps a pod off the Nodes of QCP's machines.
var awayFromQCPNodes = &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
	NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: bootstrap.NoKubeletNodeLabel, Operator: corev1.NodeSelectorOpDoesNotExist},
	}}},
}}

// coreDNSObjects are phases/addons/dns's manifests: CoreDNSServiceAccount,
// CoreDNSClusterRole and its binding, CoreDNSConfigMap, CoreDNSDeployment
// and CoreDNSService.
func coreDNSObjects(network clusterNetwork, version string) ([]client.Object, error) {
	tag, err := coreDNSVersion(version)
	if err != nil {
		return nil, err
	}
	dnsIP, err := network.DNSIP()
	if err != nil {
		return nil, err
	}
	const ns, name = metav1.NamespaceSystem, "coredns"
	labels := map[string]string{"k8s-app": "kube-dns"}
	corefile := strings.Join([]string{
		".:53 {",
		"    errors",
		"    health {",
		"       lameduck 5s",
		"    }",
		"    ready",
		"    kubernetes " + network.DNSDomain + " in-addr.arpa ip6.arpa {",
		"       pods insecure",
		"       fallthrough in-addr.arpa ip6.arpa",
		"       ttl 30",
		"    }",
		"    prometheus :9153",
		"    forward . /etc/resolv.conf {",
		"       max_concurrent 1000",
		"    }",
		"    cache 30 {",
		"       disable success " + network.DNSDomain,
		"       disable denial " + network.DNSDomain,
		"    }",
		"    loop",
		"    reload",
		"    loadbalance",
		"}",
	}, "\n") + "\n"
	port := func(name string, n int32, proto corev1.Protocol) corev1.ContainerPort {
		return corev1.ContainerPort{Name: name, ContainerPort: n, Protocol: proto}
	}
	return []client.Object{
		serviceAccount(ns, name),
		clusterRole("system:coredns",
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			rbacv1.PolicyRule{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}}),
		clusterRoleBinding("system:coredns", "system:coredns", serviceAccountSubject(ns, name)),
		configMap(ns, name, map[string]string{"Corefile": corefile}),
		&appsv1.Deployment{TypeMeta: typeMeta("apps/v1", "Deployment"), ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](2),
				Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
					RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(intstr.FromInt32(1))}},
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
					PriorityClassName:  "system-cluster-critical",
					ServiceAccountName: name,
					Affinity: &corev1.Affinity{NodeAffinity: awayFromQCPNodes, PodAntiAffinity: &corev1.PodAntiAffinity{
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{
							LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k8s-app", Operator: metav1.LabelSelectorOpIn, Values: []string{"kube-dns"}}}},
							TopologyKey:   "kubernetes.io/hostname",
						}}},
					}},
					Tolerations: []corev1.Toleration{
						{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
						{Key: bootstrap.ControlPlaneNodeRole, Effect: corev1.TaintEffectNoSchedule},
					},
					NodeSelector: map[string]string{"kubernetes.io/os": "linux"},
					Containers: []corev1.Container{{
						Name:            name,
						Image:           "registry.k8s.io/coredns/coredns:" + tag,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Resources: corev1.ResourceRequirements{
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("170Mi")},
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("70Mi")},
						},
						Args:         []string{"-conf", "/etc/coredns/Corefile"},
						VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}},
						Ports: []corev1.ContainerPort{port("dns", 53, corev1.ProtocolUDP), port("dns-tcp", 53, corev1.ProtocolTCP), port("metrics", 9153, corev1.ProtocolTCP),
							port("liveness-probe", 8080, corev1.ProtocolTCP), port("readiness-probe", 8181, corev1.ProtocolTCP)},
						LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromString("liveness-probe"), Scheme: corev1.URISchemeHTTP}},
							InitialDelaySeconds: 60, TimeoutSeconds: 5, SuccessThreshold: 1, FailureThreshold: 5},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("readiness-probe"), Scheme: corev1.URISchemeHTTP}}},
						SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
							Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE"}, Drop: []corev1.Capability{"ALL"}}},
					}},
					DNSPolicy: corev1.DNSDefault,
					Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: name}, Items: []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}}}}}},
				}},
			}},
		&corev1.Service{TypeMeta: typeMeta("v1", "Service"),
			ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: ns,
				Labels:      map[string]string{"k8s-app": "kube-dns", "kubernetes.io/cluster-service": "true", "kubernetes.io/name": "CoreDNS"},
				Annotations: map[string]string{"prometheus.io/port": "9153", "prometheus.io/scrape": "true"}},
			Spec: corev1.ServiceSpec{
				ClusterIP: dnsIP,
				Ports: []corev1.ServicePort{
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
					{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
					{Name: "metrics", Port: 9153, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(9153)},
				},
				Selector: labels,
			}},
	}, nil
}

// kubeProxyObjects are phases/addons/proxy's: its ServiceAccount, the
// binding to system:node-proxier (constants.KubeProxyClusterRoleBindingName),
// the Role and binding that let bootstrap tokens read its ConfigMap
// (KubeProxyConfigMapRoleName), KubeProxyConfigMap19 and
// KubeProxyDaemonSet19.
func kubeProxyObjects(network clusterNetwork, server, version string) ([]client.Object, error) {
	const ns, name = metav1.NamespaceSystem, "kube-proxy"
	cfg := kubeproxyv1alpha1.KubeProxyConfiguration{
		TypeMeta:         metav1.TypeMeta{APIVersion: kubeproxyv1alpha1.SchemeGroupVersion.String(), Kind: "KubeProxyConfiguration"},
		BindAddress:      "0.0.0.0",
		ClusterCIDR:      network.Pods,
		ClientConnection: componentbaseconfigv1alpha1.ClientConnectionConfiguration{Kubeconfig: "/var/lib/kube-proxy/kubeconfig.conf"},
	}
	proxyConfig, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("writing kube-proxy's KubeProxyConfiguration: %w", err)
	}
	kubeconfig := strings.Join([]string{
		"apiVersion: v1",
		"kind: Config",
		"clusters:",
		"- cluster:",
		"    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
		"    server: " + server,
		"  name: default",
		"contexts:",
		"- context:",
		"    cluster: default",
		"    namespace: default",
		"    user: default",
		"  name: default",
		"current-context: default",
		"users:",
		"- name: default",
		"  user:",
		"    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
	}, "\n")
	labels := map[string]string{"k8s-app": name}
	config := configMap(ns, name, map[string]string{"kubeconfig.conf": kubeconfig, "config.conf": string(proxyConfig)})
	config.Labels = map[string]string{"app": name}
	hostPath := func(vol, path string, t *corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: t}}}
	}
	return []client.Object{
		serviceAccount(ns, name),
		clusterRoleBinding("kubeadm:node-proxier", "system:node-proxier", serviceAccountSubject(ns, name)),
		role(ns, name, getConfigMap(name)),
		roleBinding(ns, name, group(bootstrapTokenGroup)),
		config,
		&appsv1.DaemonSet{TypeMeta: typeMeta("apps/v1", "DaemonSet"), ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: appsv1.DaemonSetSpec{
				Selector:       &metav1.LabelSelector{MatchLabels: labels},
				UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
					PriorityClassName: "system-node-critical",
					Containers: []corev1.Container{{
						Name:            name,
						Image:           "registry.k8s.io/kube-proxy:" + version,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Command:         []string{"/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)"},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
						VolumeMounts: []corev1.VolumeMount{{Name: name, MountPath: "/var/lib/kube-proxy"},
							{Name: "xtables-lock", MountPath: "/run/xtables.lock"}, {Name: "lib-modules", MountPath: "/lib/modules", ReadOnly: true}},
						Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
					}},
					HostNetwork:        true,
					ServiceAccountName: name,
					Volumes: []corev1.Volume{
						{Name: name, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}},
						hostPath("xtables-lock", "/run/xtables.lock", ptr.To(corev1.HostPathFileOrCreate)),
						hostPath("lib-modules", "/lib/modules", nil),
					},
					// kubeadm's tolerates every taint; QCP's Nodes run no
					// kubelet, so the affinity keeps it off them.
					Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					NodeSelector: map[string]string{"kubernetes.io/os": "linux"},
					Affinity:     &corev1.Affinity{NodeAffinity: awayFromQCPNodes},
				}},
			}},
	}, nil
}
