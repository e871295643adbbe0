package agent

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// TestSavedEtcdAuthorityOverridesBootstrap: a machine that restarts after
// an etcd CA rotation moved it issues its etcd leaves from the saved
// authority and trusts the saved bundle, not the bootstrap data's; a saved
// file that does not parse fails the start, naming it.
func TestSavedEtcdAuthorityOverridesBootstrap(t *testing.T) {
	_, next, a, p := restartedMidRotation(t, EtcdAuthorityKind, func(_ *certs.ClusterCAs, next *certs.KeyPair) Authority {
		return authorityOf(next, next.CertPEM)
	})
	dir := a.dir
	rep, err := p.Report()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"etcd/server.crt", "etcd/peer.crt", "apiserver-etcd-client.crt", memoryEtcdClient} {
		if c, ok := rep.Find(name); !ok || c.IssuerKeyID != certs.KeyID(next.Cert) {
			t.Errorf("%s: %+v; want it issued by the saved authority", name, c)
		}
	}
	if all := rep.All("etcd/ca.crt"); len(all) != 1 || all[0].KeyID != certs.KeyID(next.Cert) {
		t.Errorf("etcd/ca.crt: %+v; want the saved bundle", all)
	}

	if err := os.WriteFile(filepath.Join(dir, EtcdAuthorityKind.File()), []byte(`{"ca":{"cert":"junk"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.loadAuthorities(); err == nil || !strings.Contains(err.Error(), EtcdAuthorityKind.File()) || !strings.Contains(err.Error(), "replace the machine") {
		t.Fatalf("a corrupt saved authority: %v; want an error naming the file and the fix", err)
	}
}

// TestFrontProxyAuthorityMovesItsLeafAlone: a machine that restarts in
// the middle of a front-proxy CA rotation issues kube-apiserver's
// front-proxy client certificate from the saved authority and trusts the
// saved bundle; moving the leaves of the front-proxy authority moves that
// certificate and no other, and distrusting the old authority leaves the
// new one alone in front-proxy-ca.crt.
func TestFrontProxyAuthorityMovesItsLeafAlone(t *testing.T) {
	cas, next, _, p := restartedMidRotation(t, FrontProxyAuthorityKind, func(cas *certs.ClusterCAs, next *certs.KeyPair) Authority {
		return authorityOf(cas.FrontProxy, certs.Bundle(cas.FrontProxy, next))
	})
	now := time.Now()
	both := certs.Bundle(cas.FrontProxy, next)
	report := func() PKIReport {
		t.Helper()
		rep, err := p.Report()
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	if ids, _ := certs.BundleKeyIDs(p.FrontProxyTrust()); ids != mustBundleIDs(t, both) {
		t.Errorf("front-proxy trust %s; want the saved bundle %s", ids, mustBundleIDs(t, both))
	}
	if all := report().All(FrontProxyTrustFile); len(all) != 2 {
		t.Errorf("%s: %+v; want the saved bundle of two", FrontProxyTrustFile, all)
	}
	before := report()
	moved, err := p.moveLeaves(FrontProxyAuthorityKind, next, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != 1 || moved[0] != "front-proxy-client.crt" {
		t.Errorf("moved %v; want [front-proxy-client.crt]", moved)
	}
	after := report()
	if c, ok := after.Find("front-proxy-client.crt"); !ok || c.IssuerKeyID != certs.KeyID(next.Cert) {
		t.Errorf("front-proxy-client.crt: %+v; want it issued by the new authority", c)
	}
	for _, c := range before.Leaves() {
		if c.Name == "front-proxy-client.crt" {
			continue
		}
		if now, ok := after.Find(c.Name); !ok || now.SerialNumber != c.SerialNumber {
			t.Errorf("%s changed when the front-proxy leaves moved", c.Name)
		}
	}
	if err := p.setTrust(FrontProxyAuthorityKind, next.CertPEM); err != nil {
		t.Fatal(err)
	}
	if all := report().All(FrontProxyTrustFile); len(all) != 1 || all[0].KeyID != certs.KeyID(next.Cert) {
		t.Errorf("%s after the distrust: %+v; want the new authority alone", FrontProxyTrustFile, all)
	}
}

// TestServiceAccountKeyRotationOnTheMachine: a machine that restarts in
// the middle of a service-account key rotation signs with the saved key
// and takes tokens of the saved public keys (sa.key, sa.pub), and its
// report names them; moving to the new key rewrites sa.key alone (0600),
// and distrusting the old key leaves the new one alone in sa.pub. A
// bootstrap document whose public keys leave out its private key's is
// refused, naming the field.
func TestServiceAccountKeyRotationOnTheMachine(t *testing.T) {
	cas, next, a, p := restartedMidRotation(t, ServiceAccountAuthorityKind, func(cas *certs.ClusterCAs, next *certs.KeyPair) Authority {
		return authorityOf(cas.ServiceAccount, certs.Bundle(cas.ServiceAccount, next))
	})
	old := cas.ServiceAccount
	keys := func() PKIKeys {
		t.Helper()
		rep, err := p.Report()
		if err != nil {
			t.Fatal(err)
		}
		if rep.ServiceAccountKeys == nil {
			t.Fatal("the report names no service-account keys")
		}
		return *rep.ServiceAccountKeys
	}
	both := strings.Split(mustBundleIDs(t, certs.Bundle(old, next)), ",")
	if k := keys(); k.Signer != certs.KeyID(old.Cert) || strings.Join(k.Trusted, ",") != strings.Join(both, ",") {
		t.Errorf("keys %+v; want signer %s and both keys %v taken", k, certs.KeyID(old.Cert), both)
	}
	before, err := p.Report()
	if err != nil {
		t.Fatal(err)
	}
	moved, err := p.moveLeaves(ServiceAccountAuthorityKind, next, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != 1 || moved[0] != ServiceAccountKeyFile {
		t.Errorf("moved %v; want [%s]", moved, ServiceAccountKeyFile)
	}
	path := filepath.Join(p.Dir, ServiceAccountKeyFile)
	if data, err := os.ReadFile(path); err != nil || string(data) != string(next.KeyPEM) {
		t.Errorf("%s does not hold the new key (%v)", path, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v, %v; want mode 0600", path, fi.Mode(), err)
	}
	if k := keys(); k.Signer != certs.KeyID(next.Cert) || len(k.Trusted) != 2 {
		t.Errorf("keys after the move %+v; want the new signer, both taken", k)
	}
	after, err := p.Report()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range before.Certificates {
		if now, ok := after.Find(c.Name); !ok || now.SerialNumber != c.SerialNumber {
			t.Errorf("%s changed when the service-account key moved", c.Name)
		}
	}
	if err := p.setTrust(ServiceAccountAuthorityKind, next.CertPEM); err != nil {
		t.Fatal(err)
	}
	if k := keys(); strings.Join(k.Trusted, ",") != certs.KeyID(next.Cert) {
		t.Errorf("keys taken after the distrust %v; want the new key alone", k.Trusted)
	}

	other, err := certs.NewServiceAccountKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	a.doc.Certificates.ServiceAccount = &bootstrap.ServiceAccountKP{PrivateKey: string(old.KeyPEM), PublicKey: string(other.CertPEM)}
	if _, err := IssuePKI(t.TempDir(), a.machine, a.doc, time.Now()); err == nil || !strings.Contains(err.Error(), "certificates.serviceAccount.publicKey") {
		t.Errorf("public keys without the private key's: %v; want an error naming certificates.serviceAccount.publicKey", err)
	}
}

// TestClusterSignerMovesFirst: at a cluster CA rotation's first stage
// kube-controller-manager's signer (pki/ca.crt and ca.key) is the new
// authority while every leaf still comes from the old one, and a machine
// restarted then comes back so; a signer the trust bundle leaves out, or
// on another kind of authority, is refused.
func TestClusterSignerMovesFirst(t *testing.T) {
	cas, next, _, p := restartedMidRotation(t, ClusterAuthorityKind, func(cas *certs.ClusterCAs, next *certs.KeyPair) Authority {
		a := authorityOf(cas.Cluster, certs.Bundle(cas.Cluster, next))
		a.Signer = &bootstrap.CertKey{Cert: string(next.CertPEM), Key: string(next.KeyPEM)}
		return a
	})
	rep, err := p.Report()
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := rep.Find("ca.crt"); !ok || c.KeyID != certs.KeyID(next.Cert) {
		t.Errorf("ca.crt: %+v; want the new authority, which kube-controller-manager signs with", c)
	}
	if data, err := os.ReadFile(filepath.Join(p.Dir, "ca.key")); err != nil || string(data) != string(next.KeyPEM) {
		t.Errorf("ca.key does not hold the new authority's key (%v)", err)
	}
	for _, name := range []string{"apiserver.crt", "controller-manager.conf", memoryNode} {
		if c, ok := rep.Find(name); !ok || c.IssuerKeyID != certs.KeyID(cas.Cluster.Cert) {
			t.Errorf("%s: %+v; want it still issued by the old authority", name, c)
		}
	}
	bad := authorityOf(cas.Cluster, cas.Cluster.CertPEM)
	bad.Signer = &bootstrap.CertKey{Cert: string(next.CertPEM), Key: string(next.KeyPEM)}
	if _, err := bad.parse(ClusterAuthorityKind); err == nil || !strings.Contains(err.Error(), "signer") {
		t.Errorf("a signer the bundle leaves out: %v; want it refused", err)
	}
	other := authorityOf(cas.FrontProxy, cas.FrontProxy.CertPEM)
	other.Signer = &bootstrap.CertKey{Cert: string(cas.FrontProxy.CertPEM), Key: string(cas.FrontProxy.KeyPEM)}
	if _, err := other.parse(FrontProxyAuthorityKind); err == nil || !strings.Contains(err.Error(), "signer") {
		t.Errorf("a signer of the front-proxy authority: %v; want it refused", err)
	}
}

// restartedMidRotation issues the certificates of a stacked machine that
// starts with an authority of kind saved by a rotation (what saved picks
// of its cluster's authorities and of a new one, next: the issuer and the
// trust bundle), as a machine restarted in the middle of a rotation does.
func restartedMidRotation(t *testing.T, kind AuthorityKind, saved func(cas *certs.ClusterCAs, next *certs.KeyPair) Authority) (*certs.ClusterCAs, *certs.KeyPair, *machineCtx, *PKI) {
	t.Helper()
	now := time.Now()
	cas, err := certs.NewClusterCAs(now)
	if err != nil {
		t.Fatal(err)
	}
	next, err := certs.NewCA(string(kind)+"-ca-next", now)
	if kind == ServiceAccountAuthorityKind {
		next, err = certs.NewServiceAccountKeyPair()
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	doc := bootstrap.NewStacked("c1", cas, "", bootstrap.NewMember())
	a := &machineCtx{dir: dir, doc: doc, machine: Machine{Name: "m1", Namespace: "ns", Address: "127.0.0.9"}, log: slog.Default()}
	data, err := json.Marshal(saved(cas, next))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, kind.File()), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.loadAuthorities(); err != nil {
		t.Fatal(err)
	}
	p, err := IssuePKI(dir, a.machine, doc, now)
	if err != nil {
		t.Fatal(err)
	}
	return cas, next, a, p
}

// authorityOf is the Authority of issuer, trusting trust.
func authorityOf(issuer *certs.KeyPair, trust []byte) Authority {
	return Authority{CA: bootstrap.CertKey{Cert: string(issuer.CertPEM), Key: string(issuer.KeyPEM)}, Trust: string(trust)}
}

func mustBundleIDs(t *testing.T, bundle []byte) string {
	t.Helper()
	ids, err := certs.BundleKeyIDs(bundle)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
