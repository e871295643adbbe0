package controlplane

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// TestRotationLagging: a stage waits for every machine to report its
// authorities, a machine being deleted included until it is gone (its
// member may still take clients of what the stage no longer trusts).
func TestRotationLagging(t *testing.T) {
	now := time.Now()
	oldCA, err := certs.NewCA("etcd-ca", now)
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := certs.NewCA("etcd-ca-next", now)
	if err != nil {
		t.Fatal(err)
	}
	rt := &rotation{state: rotationState{Kind: controlplanev1.CertificateAuthorityEtcdCA, Stage: controlplanev1.RotationDistrust}, old: oldCA, new: newCA}
	want := rt.want()
	if id := certs.KeyID(newCA.Cert); want != id+"/"+id {
		t.Fatalf("Distrust wants %s, not the new authority alone (%s)", want, id)
	}
	both, _ := certs.BundleKeyIDs(certs.Bundle(oldCA, newCA))
	stale := certs.KeyID(newCA.Cert) + "/" + both
	machine := func(name, rec string, deleting bool) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
		if rec != "" {
			m.Annotations[engine.EtcdAuthorityAnnotation] = rec
		}
		if deleting {
			m.DeletionTimestamp = &metav1.Time{Time: now}
		}
		return m
	}
	for _, c := range []struct {
		name     string
		machines []*clusterv1.Machine
		waitFor  string
	}{
		{"every machine at the stage", []*clusterv1.Machine{machine("a", want, false), machine("b", want, false)}, ""},
		{"one not read yet", []*clusterv1.Machine{machine("a", want, false), machine("b", "", false)}, "read machine b's certificates"},
		{"one behind", []*clusterv1.Machine{machine("a", stale, false), machine("b", want, false)}, "machine a to take the stage's authorities"},
		{"one being deleted, behind", []*clusterv1.Machine{machine("a", want, false), machine("b", stale, true)}, "machine b, being deleted, to be gone"},
		{"one being deleted, not read", []*clusterv1.Machine{machine("a", want, false), machine("b", "", true)}, "machine b, being deleted, to be gone"},
		{"one being deleted, at the stage", []*clusterv1.Machine{machine("a", want, false), machine("b", want, true)}, ""},
	} {
		got := rt.lagging(c.machines)
		if c.waitFor == "" && got != "" || c.waitFor != "" && !strings.Contains(got, c.waitFor) {
			t.Errorf("%s: lagging says %q; want %q", c.name, got, c.waitFor)
		}
	}
}
