package release

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/drone/envsubst/v2"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capiyaml "sigs.k8s.io/cluster-api/util/yaml"

	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestRelease builds the repository as `make release` does, renders each of
// QCP's providers with the real clusterctl (`clusterctl generate provider
// … --config out/clusterctl.yaml`, every variable at its default, and once
// with the image overridden) and checks the clusterctl provider contract's
// MUSTs on what it rendered: one Namespace, a Deployment with a container
// named manager, the provider label on every object, leader election, a
// ClusterRole with an aggregation rule that selects its own provider's role
// only, and, for the control plane provider, webhook configurations with
// unique prefixed names whose CA cert-manager injects from a Certificate of
// the release for the Service the webhooks call.
func TestRelease(t *testing.T) {
	testkit.RequireBinaries(t, "clusterctl")
	out := t.TempDir()
	config, err := Write("../..", out, "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	render := func(t *testing.T, env []string, args ...string) []unstructured.Unstructured {
		t.Helper()
		data := testkit.Clusterctl(t, env, append(append([]string{"generate", "provider"}, args...), "--config", config)...)
		if i := strings.Index(string(data), "${"); i >= 0 {
			t.Errorf("clusterctl %v left a variable unsubstituted: %q", args, string(data[i:min(len(data), i+60)]))
		}
		objs, err := capiyaml.ToUnstructured(data)
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}

	controlPlane := render(t, nil, "--control-plane", "qcp")
	infrastructure := render(t, nil, "--infrastructure", "process")
	providers := []struct {
		label, prefix string
		objs          []unstructured.Unstructured
		webhooks      bool
	}{
		{"control-plane-qcp", "qcp-control-plane-", controlPlane, true},
		{"infrastructure-process", "qcp-infrastructure-process-", infrastructure, false},
	}
	selectors := make([]map[string]string, len(providers))
	for i, p := range providers {
		t.Run(p.label, func(t *testing.T) { selectors[i] = checkContract(t, p.label, p.prefix, p.objs, p.webhooks) })
	}
	// Cluster roles are cluster-wide: neither provider's aggregated role
	// may take in the other's.
	for i, p := range providers {
		other := providers[1-i]
		for _, o := range other.objs {
			if o.GetKind() == "ClusterRole" && hasLabels(&o, selectors[i]) {
				t.Errorf("%s's aggregated role (selector %v) takes in %s's ClusterRole %s", p.label, selectors[i], other.label, o.GetName())
			}
		}
	}

	// Webhook configuration names are unique in the management cluster:
	// none is CAPI core's, CABPK's, or the other provider's.
	capiProvider := func(label, file string) []unstructured.Unstructured {
		data, err := os.ReadFile(filepath.Join(out, label, binaries.CAPIVersion, file))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := capiyaml.ToUnstructured(data)
		if err != nil {
			t.Fatal(err)
		}
		// Their images are the released ones of the pinned version.
		for _, o := range objs {
			if o.GetKind() == "Deployment" {
				if image := managerContainer(t, []unstructured.Unstructured{o})["image"]; !strings.HasPrefix(fmt.Sprint(image), "registry.k8s.io/cluster-api/") ||
					!strings.HasSuffix(fmt.Sprint(image), ":"+binaries.CAPIVersion) {
					t.Errorf("%s runs %v, want CAPI's released image of %s", label, image, binaries.CAPIVersion)
				}
			}
		}
		return objs
	}
	seen := map[string]string{}
	for _, set := range []struct {
		name string
		objs []unstructured.Unstructured
	}{
		{"cluster-api", capiProvider("cluster-api", "core-components.yaml")},
		{"bootstrap-kubeadm", capiProvider("bootstrap-kubeadm", "bootstrap-components.yaml")},
		{"control-plane-qcp", controlPlane}, {"infrastructure-process", infrastructure},
	} {
		for _, o := range set.objs {
			if !strings.HasSuffix(o.GetKind(), "WebhookConfiguration") {
				continue
			}
			key := o.GetKind() + "/" + o.GetName()
			if other, ok := seen[key]; ok {
				t.Errorf("%s is in both %s and %s", key, other, set.name)
			}
			seen[key] = set.name
		}
	}

	// The image is a clusterctl variable, the released image by default.
	wantImage := map[string]string{"": "ghcr.io/qcp-dev/qcp-manager:v0.1.0", "registry.example/qcp-manager:v9": "registry.example/qcp-manager:v9"}
	for override, want := range wantImage {
		objs := controlPlane
		if override != "" {
			objs = render(t, []string{"QCP_MANAGER_IMAGE=" + override}, "--control-plane", "qcp")
		}
		if got := managerContainer(t, objs)["image"]; got != want {
			t.Errorf("QCP_MANAGER_IMAGE=%q: the manager runs %v, want %s", override, got, want)
		}
	}
}

// checkContract checks the clusterctl contract's MUSTs on one provider's
// rendered components, and returns the labels its aggregated ClusterRole
// selects.
func checkContract(t *testing.T, label, prefix string, objs []unstructured.Unstructured, webhooks bool) map[string]string {
	byKind := map[string][]*unstructured.Unstructured{}
	for i := range objs {
		o := &objs[i]
		byKind[o.GetKind()] = append(byKind[o.GetKind()], o)
		if got := o.GetLabels()[clusterv1.ProviderNameLabel]; got != label {
			t.Errorf("%s %s: label %s=%q, want %q", o.GetKind(), o.GetName(), clusterv1.ProviderNameLabel, got, label)
		}
		if _, ok := o.GetLabels()["clusterctl.cluster.x-k8s.io"]; !ok {
			t.Errorf("%s %s has no clusterctl.cluster.x-k8s.io label", o.GetKind(), o.GetName())
		}
	}
	if n := len(byKind["Namespace"]); n != 1 {
		t.Fatalf("%d Namespaces, want exactly 1", n)
	}
	ns := byKind["Namespace"][0].GetName()
	for _, o := range objs {
		if o.GetNamespace() != "" && o.GetNamespace() != ns {
			t.Errorf("%s %s is in namespace %s, not the provider's %s", o.GetKind(), o.GetName(), o.GetNamespace(), ns)
		}
	}
	for _, crd := range byKind["CustomResourceDefinition"] {
		if crd.GetLabels()["cluster.x-k8s.io/v1beta2"] == "" {
			t.Errorf("CRD %s does not name the version it serves for the v1beta2 contract", crd.GetName())
		}
	}
	c := managerContainer(t, objs)
	if args, _ := c["args"].([]any); !slices.Contains(args, any("--leader-elect")) {
		t.Errorf("manager args %v: want --leader-elect", c["args"])
	}
	if len(byKind["Role"]) != 1 || len(byKind["RoleBinding"]) != 1 {
		t.Errorf("%d Roles and %d RoleBindings, want the leader-election pair", len(byKind["Role"]), len(byKind["RoleBinding"]))
	}

	// The manager's binding (the one of a ServiceAccount of the provider's
	// namespace) names a ClusterRole that aggregates exactly this
	// provider's generated role.
	var own, others []*unstructured.Unstructured
	for _, b := range byKind["ClusterRoleBinding"] {
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		if len(subjects) == 1 && subjects[0].(map[string]any)["kind"] == "ServiceAccount" && subjects[0].(map[string]any)["namespace"] == ns {
			own = append(own, b)
		} else {
			others = append(others, b)
		}
	}
	if len(own) != 1 {
		t.Fatalf("%d ClusterRoleBindings of the provider's ServiceAccount, want 1", len(own))
	}
	checkOtherBindings(t, label, others, byKind["ClusterRole"])
	bound, _, _ := unstructured.NestedString(own[0].Object, "roleRef", "name")
	var selected []string
	var match map[string]string
	for _, role := range byKind["ClusterRole"] {
		if role.GetName() != bound {
			continue
		}
		selectors, _, _ := unstructured.NestedSlice(role.Object, "aggregationRule", "clusterRoleSelectors")
		if len(selectors) != 1 {
			t.Fatalf("ClusterRole %s: aggregation rule %v, want one selector", bound, selectors)
		}
		match, _, _ = unstructured.NestedStringMap(selectors[0].(map[string]any), "matchLabels")
		for _, other := range byKind["ClusterRole"] {
			if other.GetName() != bound && hasLabels(other, match) {
				selected = append(selected, other.GetName())
			}
		}
	}
	if want := []string{prefix + "manager-role"}; !slices.Equal(selected, want) {
		t.Errorf("ClusterRoleBinding names %s, which aggregates %v; want %v", bound, selected, want)
	}

	configs := append(byKind["ValidatingWebhookConfiguration"], byKind["MutatingWebhookConfiguration"]...)
	if !webhooks {
		if len(configs) > 0 {
			t.Errorf("%d webhook configurations in a provider without webhooks", len(configs))
		}
		return match
	}
	if len(configs) != 2 || len(byKind["Certificate"]) != 1 || len(byKind["Issuer"]) != 1 || len(byKind["Service"]) != 1 {
		t.Fatalf("%d webhook configurations, %d Certificates, %d Issuers, %d Services; want 2, 1, 1, 1",
			len(configs), len(byKind["Certificate"]), len(byKind["Issuer"]), len(byKind["Service"]))
	}
	cert, svc := byKind["Certificate"][0], byKind["Service"][0]
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	if want := svc.GetName() + "." + ns + ".svc"; !slices.Contains(dnsNames, want) {
		t.Errorf("Certificate %s is for %v, want %s", cert.GetName(), dnsNames, want)
	}
	for _, wc := range configs {
		if !strings.HasPrefix(wc.GetName(), prefix) {
			t.Errorf("%s %s: want a name prefixed %s", wc.GetKind(), wc.GetName(), prefix)
		}
		if got, want := wc.GetAnnotations()["cert-manager.io/inject-ca-from"], ns+"/"+cert.GetName(); got != want {
			t.Errorf("%s %s: cert-manager.io/inject-ca-from %q, want %q", wc.GetKind(), wc.GetName(), got, want)
		}
		hooks, _, _ := unstructured.NestedSlice(wc.Object, "webhooks")
		for _, h := range hooks {
			service, _, _ := unstructured.NestedStringMap(h.(map[string]any), "clientConfig", "service")
			if service["name"] != svc.GetName() || service["namespace"] != ns {
				t.Errorf("%s %s calls service %v, want %s/%s", wc.GetKind(), wc.GetName(), service, ns, svc.GetName())
			}
		}
	}
	return match
}

// managerContainer is the container named manager of the one Deployment.
func managerContainer(t *testing.T, objs []unstructured.Unstructured) map[string]any {
	t.Helper()
	var deployments []unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			deployments = append(deployments, o)
		}
	}
	if len(deployments) != 1 {
		t.Fatalf("%d Deployments, want 1", len(deployments))
	}
	containers, _, _ := unstructured.NestedSlice(deployments[0].Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		if c := c.(map[string]any); c["name"] == "manager" {
			return c
		}
	}
	t.Fatalf("Deployment %s has no container named manager", deployments[0].GetName())
	return nil
}

func hasLabels(o *unstructured.Unstructured, want map[string]string) bool {
	for k, v := range want {
		if o.GetLabels()[k] != v {
			return false
		}
	}
	return len(want) > 0
}

// TestSampleIsTheDefaultTemplate: config/samples/demo.yaml, the cluster
// `qcpctl up` creates, is the default cluster template rendered with
// CLUSTER_NAME=demo and NAMESPACE=default (and every other variable at its
// default), through the substitution clusterctl uses.
func TestSampleIsTheDefaultTemplate(t *testing.T) {
	tmpl, err := os.ReadFile("../../config/templates/cluster-template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := envsubst.Eval(string(tmpl), func(v string) string {
		return map[string]string{"CLUSTER_NAME": "demo", "NAMESPACE": "default"}[v]
	})
	if err != nil {
		t.Fatal(err)
	}
	want, err := capiyaml.ToUnstructured([]byte(rendered))
	if err != nil {
		t.Fatal(err)
	}
	sample, err := os.ReadFile("../../config/samples/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := capiyaml.ToUnstructured(sample)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("config/samples/demo.yaml is not config/templates/cluster-template.yaml rendered for demo:\n%s", cmp.Diff(want, got))
	}
}

// checkOtherBindings checks the bindings a provider makes for another
// provider's ServiceAccount: only the control plane provider makes one, for
// CAPI's kubeadm bootstrap provider, which reads a worker's control plane to
// learn its version and whose own role names only KubeadmControlPlanes. It
// may read QuorumControlPlanes, and nothing else.
func checkOtherBindings(t *testing.T, label string, others, roles []*unstructured.Unstructured) {
	t.Helper()
	if label != "control-plane-qcp" {
		if len(others) > 0 {
			t.Errorf("%d ClusterRoleBindings for other providers' ServiceAccounts, want none", len(others))
		}
		return
	}
	if len(others) != 1 {
		t.Fatalf("%d ClusterRoleBindings for other providers' ServiceAccounts, want CABPK's", len(others))
	}
	// A group, not the ServiceAccount: clusterctl moves every
	// ServiceAccount subject into the provider's own namespace.
	subjects, _, _ := unstructured.NestedSlice(others[0].Object, "subjects")
	if len(subjects) != 1 || subjects[0].(map[string]any)["kind"] != "Group" || subjects[0].(map[string]any)["name"] != "system:serviceaccounts:capi-kubeadm-bootstrap-system" {
		t.Errorf("binding %s names %v, want the ServiceAccounts of CABPK's namespace", others[0].GetName(), subjects)
	}
	name, _, _ := unstructured.NestedString(others[0].Object, "roleRef", "name")
	i := slices.IndexFunc(roles, func(r *unstructured.Unstructured) bool { return r.GetName() == name })
	if i < 0 {
		t.Fatalf("binding %s names ClusterRole %s, which the release lacks", others[0].GetName(), name)
	}
	rules, _, _ := unstructured.NestedSlice(roles[i].Object, "rules")
	want := []any{map[string]any{"apiGroups": []any{"controlplane.cluster.x-k8s.io"}, "resources": []any{"quorumcontrolplanes"},
		"verbs": []any{"get", "list", "watch"}}}
	if !reflect.DeepEqual(rules, want) {
		t.Errorf("CABPK's ClusterRole %s grants %v, want %v", name, rules, want)
	}
}
