package controlplane

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/testkit"
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

// testOldWorkers: at the end of a cluster CA rotation's TrustBoth, the
// rotation records when the signers moved and waits for the worker
// machines created until then, naming them and the way out, and for no
// control plane or EtcdCluster machine; a worker gone is no longer waited
// for, and workers created after the signers moved are not waited for.
func testOldWorkers(t *testing.T, env *localenv.Env) {
	ctx := context.Background()
	const name = "oldworkers"
	createPausedControlPlane(ctx, t, env.Client, name, "127.0.0.1", 3)
	machine := func(suffix string, labels map[string]string) *clusterv1.Machine {
		labels[clusterv1.ClusterNameLabel] = name
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-" + suffix, Namespace: "default", Labels: labels},
			Spec: clusterv1.MachineSpec{
				ClusterName: name, Version: "v1.36.3", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(name + "-bootstrap")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "ProcessMachine", Name: name + "-" + suffix},
			},
		}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	machine("cp", map[string]string{clusterv1.MachineControlPlaneLabel: ""})
	machine("etcd", map[string]string{etcdv1.EtcdClusterNameLabel: name})
	w1 := machine("w1", map[string]string{})
	machine("w2", map[string]string{})

	cluster := &clusterv1.Cluster{}
	cp := &controlplanev1.QuorumControlPlane{}
	for _, o := range []client.Object{cluster, cp} {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, o); err != nil {
			t.Fatal(err)
		}
	}
	if cp.Annotations == nil {
		cp.Annotations = map[string]string{}
	}
	now := time.Now().Add(time.Hour)
	r := &Reconciler{Client: env.Client, APIReader: env.Client, Now: func() time.Time { return now }}
	rt := &rotation{state: rotationState{Kind: controlplanev1.CertificateAuthorityClusterCA, Stage: controlplanev1.RotationTrustBoth}}
	waiting, err := r.oldWorkers(ctx, cluster, cp, rt)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(waiting, name+"-w1, "+name+"-w2") || strings.Contains(waiting, name+"-cp") || strings.Contains(waiting, name+"-etcd") ||
		!strings.Contains(waiting, "MachineDeployment") {
		t.Errorf("waiting %q; want the two workers named, with the way out, and no other machine", waiting)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cp), cp); err != nil {
		t.Fatal(err)
	}
	if st, err := readRotation(cp); err != nil || !st.SignersMoved.Equal(now.UTC().Truncate(time.Second)) {
		t.Errorf("recorded %+v (%v); want signersMoved %s", st, err, now.UTC().Truncate(time.Second))
	}
	// A worker being deleted still runs its kubelet: it is waited for
	// until it is gone (here, once its finalizers are dropped, CAPI core
	// leaving the paused cluster's machines to the test).
	if err := env.Client.Delete(ctx, w1); err != nil {
		t.Fatal(err)
	}
	if waiting, err := r.oldWorkers(ctx, cluster, cp, rt); err != nil || !strings.Contains(waiting, name+"-w1") {
		t.Errorf("a worker being deleted is not waited for: %q, %v", waiting, err)
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(w1), w1); err != nil {
			return client.IgnoreNotFound(err)
		}
		w1.Finalizers = nil
		return env.Client.Update(ctx, w1)
	}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := testkit.Eventually(wctx, 200*time.Millisecond, "the deleted worker no longer waited for", func(ctx context.Context) error {
		waiting, err := r.oldWorkers(ctx, cluster, cp, rt)
		if err == nil && (strings.Contains(waiting, name+"-w1") || !strings.Contains(waiting, name+"-w2")) {
			err = fmt.Errorf("waiting %q", waiting)
		}
		return err
	}); err != nil {
		t.Error(err)
	}
	rt.state.SignersMoved = time.Now().Add(-time.Hour)
	if waiting, err := r.oldWorkers(ctx, cluster, cp, rt); err != nil || waiting != "" {
		t.Errorf("workers created after the signers moved are waited for: %q, %v", waiting, err)
	}
}

// TestClusterCARotationMovesTheSignerFirst: from a cluster CA rotation's
// first stage on, what a machine is asked for and must report includes
// kube-controller-manager's signer, the new authority, while its leaves
// still come from the old one; new machines are built so too.
func TestClusterCARotationMovesTheSignerFirst(t *testing.T) {
	now := time.Now()
	oldCA, err := certs.NewCA("kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := certs.NewCA("kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	rt := &rotation{state: rotationState{Kind: controlplanev1.CertificateAuthorityClusterCA, Stage: controlplanev1.RotationTrustBoth}, old: oldCA, new: newCA}
	oldID, newID := certs.KeyID(oldCA.Cert), certs.KeyID(newCA.Cert)
	rep := agent.PKIReport{Certificates: []agent.PKICertificate{
		{Name: "memory:node", IssuerKeyID: oldID}, {Name: "apiserver.crt", IssuerKeyID: oldID},
		{Name: agent.ClusterTrustFile, KeyID: oldID, IsCA: true}, {Name: agent.ClusterTrustFile, KeyID: newID, IsCA: true},
		{Name: "ca.crt", KeyID: newID, IsCA: true},
	}}
	if got, want := engine.AuthorityOf(rep, agent.ClusterAuthorityKind), rt.want(); got != want {
		t.Errorf("a machine at TrustBoth reports %s; the stage wants %s", got, want)
	}
	if a := rt.authority(); a.Signer == nil || a.Signer.Cert != string(newCA.CertPEM) || a.CA.Cert != string(oldCA.CertPEM) {
		t.Errorf("TrustBoth sends %+v; want the old authority to issue leaves and the new one to sign requests", a)
	}
	cas := &certs.ClusterCAs{Cluster: oldCA}
	rt.apply(cas)
	if cas.ClusterSigner != newCA || cas.Cluster != oldCA {
		t.Error("new machines at TrustBoth do not sign requests with the new authority")
	}
}
