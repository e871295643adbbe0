package controlplane

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
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

// TestServiceAccountKeyRotation: what each stage of a service-account key
// rotation wants of a machine is what the machine's agent reports once it
// signs and takes those keys; SwitchSigner waits the tokens' maximum
// lifetime from its start, for tokens of the old key to expire, and says
// until when, and a rotation of an authority does not wait.
func TestServiceAccountKeyRotation(t *testing.T) {
	oldKey, err := certs.NewServiceAccountKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	newKey, err := certs.NewServiceAccountKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	ids := func(kps ...*certs.KeyPair) []string {
		var out []string
		for _, kp := range kps {
			out = append(out, certs.KeyID(kp.Cert))
		}
		return out
	}
	rt := &rotation{state: rotationState{Kind: controlplanev1.CertificateAuthorityServiceAccountKey}, old: oldKey, new: newKey}
	for _, c := range []struct {
		stage   controlplanev1.CertificateRotationStage
		signer  *certs.KeyPair
		trusted []string
	}{
		{controlplanev1.RotationTrustBoth, oldKey, ids(oldKey, newKey)},
		{controlplanev1.RotationReissue, newKey, ids(newKey, oldKey)},
		{controlplanev1.RotationDistrust, newKey, ids(newKey)},
	} {
		rt.state.Stage = c.stage
		rep := agent.PKIReport{ServiceAccountKeys: &agent.PKIKeys{Signer: certs.KeyID(c.signer.Cert), Trusted: c.trusted}}
		if got, want := engine.AuthorityOf(rep, agent.ServiceAccountAuthorityKind), rt.want(); got != want {
			t.Errorf("%s: a machine at the stage reports %s; the stage wants %s", c.stage, got, want)
		}
	}

	start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	now := start.Add(30 * time.Minute)
	r := &Reconciler{ServiceAccountTokenLifetime: time.Hour, Now: func() time.Time { return now }}
	rt.state.Stage, rt.state.Since = controlplanev1.RotationSwitchSigner, start
	if got := r.tokensOfOldKey(rt); !strings.Contains(got, "2026-11-29T13:00:00Z") || !rt.until.Equal(start.Add(time.Hour)) {
		t.Errorf("half an hour into SwitchSigner: %q, until %s; want a wait until 13:00", got, rt.until)
	}
	now = start.Add(time.Hour)
	if got := r.tokensOfOldKey(rt); got != "" {
		t.Errorf("a lifetime after SwitchSigner started: still waiting (%q)", got)
	}
	now = start
	rt.state.Kind = controlplanev1.CertificateAuthorityClusterCA
	if got := r.tokensOfOldKey(rt); got != "" {
		t.Errorf("a cluster CA rotation waits for tokens: %q", got)
	}
}
