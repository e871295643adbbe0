package controlplane

import (
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kubeadmv1beta4 "sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types/upstreamv1beta4"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

func TestClusterDNSIP(t *testing.T) {
	for _, tc := range []struct{ cidr, want, err string }{
		{"10.96.0.0/12", "10.96.0.10", ""},
		{"10.100.0.0/16", "10.100.0.10", ""},
		{"192.168.0.248/29", "", "no tenth address"},
		{"fd00:10:96::/112", "fd00:10:96::a", ""},
		{"10.96.0.0", "", "10.96.0.0"},
	} {
		got, err := clusterDNSIP(tc.cidr)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("clusterDNSIP(%q) = %q, %v; want an error with %q", tc.cidr, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("clusterDNSIP(%q) = %q, %v; want %q", tc.cidr, got, err, tc.want)
		}
	}
}

// TestJoinArtifacts: the objects kubeadm join reads hold what kubeadm's
// own init would write, in the formats it parses.
func TestJoinArtifacts(t *testing.T) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "ns"},
		Spec: clusterv1.ClusterSpec{ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "127.0.0.9", Port: 6443}}}
	cp := &controlplanev1.QuorumControlPlane{Spec: controlplanev1.QuorumControlPlaneSpec{Version: "v1.36.3"}}
	bundle := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	stacked, err := joinArtifacts(cluster, cp, defaultClusterNetwork, bundle, nil)
	if err != nil {
		t.Fatal(err)
	}
	network := clusterNetwork{Services: "10.128.0.0/16", Pods: "192.168.0.0/16", DNSDomain: "qcp.test"}
	external, err := joinArtifacts(cluster, cp, network, bundle, &externalEtcd{endpoints: []string{"https://127.0.0.5:2379"}})
	if err != nil {
		t.Fatal(err)
	}
	objects := func(typed []client.Object) map[string]map[string]any {
		objs, err := applyConfigurations(typed)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]map[string]any{}
		for _, o := range objs {
			data, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(data, &m); err != nil {
				t.Fatal(err)
			}
			meta := m["metadata"].(map[string]any)
			ns, _ := meta["namespace"].(string)
			out[m["kind"].(string)+"/"+ns+"/"+meta["name"].(string)] = m
		}
		return out
	}
	got := objects(stacked)
	for _, want := range []string{
		"ConfigMap/kube-public/cluster-info", "Role/kube-public/kubeadm:bootstrap-signer-clusterinfo", "RoleBinding/kube-public/kubeadm:bootstrap-signer-clusterinfo",
		"ConfigMap/kube-system/kubeadm-config", "Role/kube-system/kubeadm:nodes-kubeadm-config", "RoleBinding/kube-system/kubeadm:nodes-kubeadm-config",
		"ConfigMap/kube-system/kubelet-config", "Role/kube-system/kubeadm:kubelet-config", "RoleBinding/kube-system/kubeadm:kubelet-config",
		"ClusterRoleBinding//kubeadm:kubelet-bootstrap", "ClusterRole//kubeadm:get-nodes", "ClusterRoleBinding//kubeadm:get-nodes",
		"ClusterRoleBinding//kubeadm:node-autoapprove-bootstrap", "ClusterRoleBinding//kubeadm:node-autoapprove-certificate-rotation",
		"ClusterRoleBinding//kubeadm:apiserver-kubelet-client",
	} {
		if got[want] == nil {
			t.Errorf("no %s among the join artifacts", want)
		}
	}
	if len(got) != 15 {
		t.Errorf("%d join artifacts; want 15", len(got))
	}
	data := func(m map[string]any, key string) string { return m["data"].(map[string]any)[key].(string) }

	info, err := clientcmd.Load([]byte(data(got["ConfigMap/kube-public/cluster-info"], "kubeconfig")))
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Clusters[""]; c == nil || c.Server != "https://127.0.0.9:6443" || string(c.CertificateAuthorityData) != string(bundle) || len(info.AuthInfos) != 0 {
		t.Errorf("cluster-info's kubeconfig: %+v", info)
	}

	var cc kubeadmv1beta4.ClusterConfiguration
	if err := yaml.UnmarshalStrict([]byte(data(got["ConfigMap/kube-system/kubeadm-config"], "ClusterConfiguration")), &cc); err != nil {
		t.Fatal(err)
	}
	if cc.APIVersion != "kubeadm.k8s.io/v1beta4" || cc.Kind != "ClusterConfiguration" || cc.KubernetesVersion != "v1.36.3" ||
		cc.ControlPlaneEndpoint != "127.0.0.9:6443" || cc.ClusterName != "c1" || cc.Networking.ServiceSubnet != "10.96.0.0/12" ||
		cc.Networking.DNSDomain != "cluster.local" || cc.Etcd.Local == nil || cc.Etcd.External != nil {
		t.Errorf("kubeadm-config's ClusterConfiguration: %+v", cc)
	}
	ext := objects(external)
	if err := yaml.UnmarshalStrict([]byte(data(ext["ConfigMap/kube-system/kubeadm-config"], "ClusterConfiguration")), &cc); err != nil {
		t.Fatal(err)
	}
	if cc.Etcd.External == nil || len(cc.Etcd.External.Endpoints) != 1 || cc.Etcd.External.CAFile == "" {
		t.Errorf("kubeadm-config's etcd on external etcd: %+v", cc.Etcd)
	}
	if n := cc.Networking; n.ServiceSubnet != "10.128.0.0/16" || n.PodSubnet != "192.168.0.0/16" || n.DNSDomain != "qcp.test" {
		t.Errorf("kubeadm-config's networking for %+v: %+v", network, n)
	}
	var kcNet kubeletv1beta1.KubeletConfiguration
	if err := yaml.UnmarshalStrict([]byte(data(ext["ConfigMap/kube-system/kubelet-config"], "kubelet")), &kcNet); err != nil {
		t.Fatal(err)
	}
	if len(kcNet.ClusterDNS) != 1 || kcNet.ClusterDNS[0] != "10.128.0.10" || kcNet.ClusterDomain != "qcp.test" {
		t.Errorf("kubelet-config for %+v: clusterDNS %v, clusterDomain %q", network, kcNet.ClusterDNS, kcNet.ClusterDomain)
	}

	var kc kubeletv1beta1.KubeletConfiguration
	if err := yaml.UnmarshalStrict([]byte(data(got["ConfigMap/kube-system/kubelet-config"], "kubelet")), &kc); err != nil {
		t.Fatal(err)
	}
	if kc.Kind != "KubeletConfiguration" || len(kc.ClusterDNS) != 1 || kc.ClusterDNS[0] != "10.96.0.10" || kc.ClusterDomain != "cluster.local" ||
		kc.Authentication.X509.ClientCAFile != "/etc/kubernetes/pki/ca.crt" || *kc.Authentication.Anonymous.Enabled || kc.Authorization.Mode != "Webhook" || !kc.RotateCertificates {
		t.Errorf("kubelet-config's KubeletConfiguration: %+v", kc)
	}
}

func TestNetworkOf(t *testing.T) {
	cluster := func(services, pods []string, domain string) *clusterv1.Cluster {
		return &clusterv1.Cluster{Spec: clusterv1.ClusterSpec{ClusterNetwork: clusterv1.ClusterNetwork{
			Services: clusterv1.NetworkRanges{CIDRBlocks: services}, Pods: clusterv1.NetworkRanges{CIDRBlocks: pods}, ServiceDomain: domain}}}
	}
	for _, tc := range []struct {
		name    string
		cluster *clusterv1.Cluster
		want    clusterNetwork
		err     []string
	}{
		{"defaults", cluster(nil, nil, ""), defaultClusterNetwork, nil},
		{"all set", cluster([]string{"10.128.0.0/16"}, []string{"192.168.0.0/16"}, "qcp.test"),
			clusterNetwork{Services: "10.128.0.0/16", Pods: "192.168.0.0/16", DNSDomain: "qcp.test"}, nil},
		{"dual-stack services", cluster([]string{"10.96.0.0/12", "fd00::/108"}, nil, ""), clusterNetwork{},
			[]string{"spec.clusterNetwork.services.cidrBlocks", "dual-stack", "one IPv4 range"}},
		{"IPv6 services", cluster([]string{"fd00::/108"}, nil, ""), clusterNetwork{}, []string{"services.cidrBlocks", "not an IPv4 CIDR"}},
		{"tiny services", cluster([]string{"10.0.0.0/30"}, nil, ""), clusterNetwork{}, []string{"services.cidrBlocks", "tenth address", "at least 16"}},
		{"bad pods", cluster(nil, []string{"192.168.0.0"}, ""), clusterNetwork{}, []string{"spec.clusterNetwork.pods.cidrBlocks", "not a CIDR"}},
		{"bad domain", cluster(nil, nil, "Not_A_Domain"), clusterNetwork{}, []string{"spec.clusterNetwork.serviceDomain", "cluster.local"}},
	} {
		got, err := networkOf(tc.cluster)
		if len(tc.err) > 0 {
			for _, want := range tc.err {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: error %v; want it to contain %q", tc.name, err, want)
				}
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
	have := clusterNetwork{Services: "10.128.0.0/16", DNSDomain: "qcp.test"}
	if d := networkChange(have, have, nil); d != "" {
		t.Errorf("no change reported as %q", d)
	}
	d := networkChange(have, clusterNetwork{Services: "10.129.0.0/16", DNSDomain: "qcp.test"}, nil)
	if !strings.Contains(d, `spec.clusterNetwork.services.cidrBlocks changed from "10.128.0.0/16" to "10.129.0.0/16"`) || strings.Contains(d, "serviceDomain") {
		t.Errorf("a changed service range reported as %q", d)
	}
}
