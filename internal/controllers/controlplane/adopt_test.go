package controlplane

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// TestAdoptionRefusal: QCP adopts an unowned control plane machine that
// bootstraps from a data Secret and runs within one minor version of
// spec.version, and names the field and the fix when it does not.
func TestAdoptionRefusal(t *testing.T) {
	cp := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "cp"}, Spec: controlplanev1.QuorumControlPlaneSpec{Version: "v1.36.3"}}
	machine := func(edit func(*clusterv1.Machine)) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Labels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}},
			Spec: clusterv1.MachineSpec{Version: "v1.36.3", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To("m-data")}}}
		edit(m)
		return m
	}
	for _, tc := range []struct {
		name string
		edit func(*clusterv1.Machine)
		want string // "" means adopted
	}{
		{"same version", func(*clusterv1.Machine) {}, ""},
		{"one minor older: a rollout closes the skew", func(m *clusterv1.Machine) { m.Spec.Version = "v1.35.4" }, ""},
		{"names this control plane", func(m *clusterv1.Machine) { m.Labels[clusterv1.MachineControlPlaneNameLabel] = "cp" }, ""},
		{"names another control plane", func(m *clusterv1.Machine) { m.Labels[clusterv1.MachineControlPlaneNameLabel] = "other" },
			`names control plane "other"`},
		{"two minors older", func(m *clusterv1.Machine) { m.Spec.Version = "v1.34.1" }, "spec.version v1.34.1 is more than one minor version from spec.version v1.36.3"},
		{"not a version", func(m *clusterv1.Machine) { m.Spec.Version = "latest" }, `spec.version "latest" is not a semantic version`},
		{"no data secret", func(m *clusterv1.Machine) { m.Spec.Bootstrap.DataSecretName = nil }, "no spec.bootstrap.dataSecretName"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := adoptionRefusal(machine(tc.edit), cp)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Errorf("refusal %q, want %q", got, tc.want)
			}
		})
	}
}
