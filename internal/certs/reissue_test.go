package certs

import (
	"bytes"
	"crypto/x509"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestReissueKeepsKeyNamesAndUsages(t *testing.T) {
	t0 := time.Now()
	ca, err := NewCA("etcd-ca", t0)
	if err != nil {
		t.Fatal(err)
	}
	ca.LeafValidity = time.Hour
	old, err := ca.Issue(Request{CommonName: "m1", Organization: []string{"o"}, DNSNames: []string{"m1", "localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: PeerUsage}, t0)
	if err != nil {
		t.Fatal(err)
	}
	t1 := t0.Add(10 * time.Minute)
	renewed, err := ca.Reissue(old, t1)
	if err != nil {
		t.Fatal(err)
	}
	n := renewed.Cert
	if !bytes.Equal(renewed.KeyPEM, old.KeyPEM) || !publicKeysEqual(n.PublicKey, old.Key.Public()) {
		t.Error("the reissued certificate has another key")
	}
	if n.SerialNumber.Cmp(old.Cert.SerialNumber) == 0 {
		t.Error("the reissued certificate has the old serial number")
	}
	if !n.NotBefore.Equal(t1.Add(-clockSkew).Truncate(time.Second)) || !n.NotAfter.Equal(t1.Add(time.Hour).Truncate(time.Second)) {
		t.Errorf("validity %v to %v; want from %v for the CA's hour", n.NotBefore, n.NotAfter, t1.Add(-clockSkew))
	}
	if n.Subject.String() != old.Cert.Subject.String() || !slices.Equal(n.DNSNames, old.Cert.DNSNames) ||
		len(n.IPAddresses) != 1 || !n.IPAddresses[0].Equal(old.Cert.IPAddresses[0]) ||
		!slices.Equal(n.ExtKeyUsage, old.Cert.ExtKeyUsage) || n.KeyUsage != old.Cert.KeyUsage || n.IsCA {
		t.Errorf("reissued %+v; want the names and usages of %+v", n, old.Cert)
	}
	pool, _ := CertPool(ca.CertPEM)
	if _, err := n.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: t1}); err != nil {
		t.Errorf("the reissued certificate does not verify: %v", err)
	}
	if _, err := ParseKeyPair(renewed.CertPEM, renewed.KeyPEM); err != nil {
		t.Errorf("the reissued pair does not load: %v", err)
	}
}

func TestReissueRefusesCAsAndOtherAuthorities(t *testing.T) {
	now := time.Now()
	ca, _ := NewCA("kubernetes", now)
	other, _ := NewCA("etcd-ca", now)
	leaf, err := other.Issue(Request{CommonName: "client", Usages: ClientUsage}, now)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		leaf *KeyPair
		want string
	}{
		"a CA":                   {other, "is a CA"},
		"another CA's leaf":      {leaf, "was not signed by CA \"kubernetes\""},
		"a leaf without its key": {&KeyPair{Cert: leaf.Cert}, "needs its private key"},
	} {
		if _, err := ca.Reissue(tc.leaf, now); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error naming %q", name, err, tc.want)
		}
	}
}

func TestReissueFrom(t *testing.T) {
	now := time.Now()
	oldCA, err := NewCA("etcd-ca", now)
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := NewCA("etcd-ca", now)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := IssueEtcdClient(oldCA, "c", now)
	if err != nil {
		t.Fatal(err)
	}
	moved, err := newCA.ReissueFrom(oldCA, leaf, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := moved.Cert.CheckSignatureFrom(newCA.Cert); err != nil {
		t.Fatalf("the moved leaf does not chain to the new authority: %v", err)
	}
	if IssuerKeyID(moved.Cert) != KeyID(newCA.Cert) || IssuerKeyID(leaf.Cert) != KeyID(oldCA.Cert) {
		t.Fatalf("issuer key ids: moved %s (want %s), old %s (want %s)", IssuerKeyID(moved.Cert), KeyID(newCA.Cert), IssuerKeyID(leaf.Cert), KeyID(oldCA.Cert))
	}
	if !bytes.Equal(moved.KeyPEM, leaf.KeyPEM) || moved.Cert.Subject.CommonName != "c" {
		t.Fatal("the moved leaf changed its key or subject")
	}
	// A leaf of neither authority is refused.
	stranger, _ := NewCA("x", now)
	if _, err := newCA.ReissueFrom(stranger, leaf, now); err == nil {
		t.Fatal("a leaf that the named previous authority did not sign was moved")
	}
	// Bundles: both, in order, without repeats; the signer must be in it.
	b := Bundle(oldCA, newCA, oldCA)
	ids, err := BundleKeyIDs(b)
	if err != nil || strings.Count(ids, ",") != 1 {
		t.Fatalf("bundle ids %q, %v", ids, err)
	}
	if err := CheckBundle(b, newCA); err != nil {
		t.Fatal(err)
	}
	if err := CheckBundle(oldCA.CertPEM, newCA); err == nil {
		t.Fatal("a bundle without its signer passed")
	}
	if err := CheckBundle(append(b, leaf.CertPEM...), newCA); err == nil {
		t.Fatal("a bundle holding a leaf passed")
	}
	if _, err := ParseCerts(append(b, []byte("junk")...)); err == nil {
		t.Fatal("a bundle with junk parsed")
	}
}
