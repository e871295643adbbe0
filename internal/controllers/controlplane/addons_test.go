package controlplane

import (
	"encoding/json"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
)

func TestCoreDNSVersion(t *testing.T) {
	for version, want := range map[string]string{"v1.35.4": "v1.13.1", "v1.36.3": "v1.14.2", "v1.37.0": "v1.14.2", "v1.34.2": "", "1.x": ""} {
		got, err := coreDNSVersion(version)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("coreDNSVersion(%s) = %q, %v; want %q", version, got, err, want)
		}
	}
}

// TestAddonObjects: kubeadm's addons at kubeadm's versions, kept off QCP's
// Nodes, labelled as QCP's; a disabled addon's objects are removed instead.
func TestAddonObjects(t *testing.T) {
	network := clusterNetwork{Services: "10.128.0.0/16", Pods: "192.168.0.0/16", DNSDomain: "qcp.test"}
	rendered := func(typed []client.Object) string {
		objs, err := applyConfigurations(typed)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, o := range objs {
			data, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(data)
			b.WriteString("\n")
		}
		return b.String()
	}
	cp := &controlplanev1.QuorumControlPlane{}
	apply, remove, err := addonObjects(cp, network, "https://127.0.0.9:6443", "v1.35.4")
	if err != nil || len(remove) != 0 || len(apply) != 12 {
		t.Fatalf("addonObjects: %d to apply, %d to remove, %v; want 12 and 0", len(apply), len(remove), err)
	}
	all := rendered(apply)
	for _, want := range []string{
		`"image":"registry.k8s.io/coredns/coredns:v1.13.1"`, `"image":"registry.k8s.io/kube-proxy:v1.35.4"`,
		`"clusterIP":"10.128.0.10"`, `kubernetes qcp.test in-addr.arpa ip6.arpa`, `clusterCIDR: 192.168.0.0/16`,
		`server: https://127.0.0.9:6443`, `"name":"system:bootstrappers:kubeadm:default-node-token"`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("the addons lack %s", want)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(all), "\n") {
		if !strings.Contains(line, `"app.kubernetes.io/managed-by":"qcp"`) {
			t.Errorf("an addon object without QCP's label: %.120s", line)
		}
		if (strings.Contains(line, `"kind":"Deployment"`) || strings.Contains(line, `"kind":"DaemonSet"`)) &&
			!strings.Contains(line, `{"key":"`+bootstrap.NoKubeletNodeLabel+`","operator":"DoesNotExist"}`) {
			t.Errorf("a workload not kept off QCP's Nodes: %.120s", line)
		}
	}

	cp.Spec.Addons.KubeProxy.Disabled = true
	apply, remove, err = addonObjects(cp, network, "https://127.0.0.9:6443", "v1.36.3")
	if err != nil || len(apply) != 6 || len(remove) != 6 {
		t.Fatalf("with kube-proxy disabled: %d to apply, %d to remove, %v; want 6 and 6", len(apply), len(remove), err)
	}
	if all := rendered(apply); strings.Contains(all, "kube-proxy") || !strings.Contains(all, "coredns:v1.14.2") {
		t.Errorf("with kube-proxy disabled, applied: %s", all)
	}
	for _, o := range remove {
		if !strings.Contains(o.GetName(), "proxy") && !strings.Contains(o.GetName(), "proxier") {
			t.Errorf("with kube-proxy disabled, removing %T %s", o, o.GetName())
		}
	}
}
