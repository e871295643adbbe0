package certs

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
)

func TestIssuedCertificatesVerifyAgainstTheirCA(t *testing.T) {
	now := time.Now()
	cas, err := NewClusterCAs(now)
	if err != nil {
		t.Fatal(err)
	}
	member, err := IssueEtcdMember(cas.Etcd, "m-1", net.ParseIP("127.0.10.1"), now)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := CertPool(cas.Etcd.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := member.Peer.Cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: "m-1"}); err != nil {
			t.Errorf("peer cert does not verify for usage %v: %v", usage, err)
		}
	}
	if err := member.Server.Cert.VerifyHostname("127.0.10.1"); err != nil {
		t.Errorf("server cert lacks the member's IP: %v", err)
	}
	// A leaf of the cluster CA must not verify against the etcd CA: etcd
	// trusts only client certificates its own CA issued.
	apiserverClient, err := IssueEtcdClient(cas.Cluster, "kube-apiserver-etcd-client", now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apiserverClient.Cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("a client certificate of the cluster CA verified against the etcd CA")
	}
}

// TestLeafCertificates checks what every issued leaf carries: a validity
// back-dated for clock skew and ending after LeafValidity, signing-only key
// usage, exactly the requested extended usages and SANs, and no CA rights.
func TestLeafCertificates(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ca, err := NewCA("kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	ip := net.ParseIP("127.0.10.1")
	member, err := IssueEtcdMember(ca, "m-1", ip, now)
	if err != nil {
		t.Fatal(err)
	}
	client, err := IssueEtcdClient(ca, "qcp-client", now)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := IssueAPIServerServing(ca, ip, "cp.example", net.ParseIP("10.96.0.1"), nil, now)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		kp     *KeyPair
		usages []x509.ExtKeyUsage
		dns    []string
		ips    []string
	}{
		{"etcd server", member.Server, PeerUsage, []string{"m-1", "localhost"}, []string{"127.0.10.1", "127.0.0.1"}},
		{"etcd peer", member.Peer, PeerUsage, []string{"m-1", "localhost"}, []string{"127.0.10.1", "127.0.0.1"}},
		{"etcd client", client, ClientUsage, nil, nil},
		{"kube-apiserver serving", serving, ServerUsage,
			[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost", "cp.example"},
			[]string{"127.0.10.1", "127.0.0.1", "10.96.0.1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.kp.Cert
			if !c.NotBefore.Equal(now.Add(-clockSkew)) || !c.NotAfter.Equal(now.Add(LeafValidity)) {
				t.Errorf("valid %s to %s, want %s to %s", c.NotBefore, c.NotAfter, now.Add(-clockSkew), now.Add(LeafValidity))
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: mustPool(t, ca), CurrentTime: now.Add(LeafValidity + time.Minute), KeyUsages: tc.usages}); err == nil {
				t.Error("verifies after its validity ended")
			}
			if c.IsCA {
				t.Errorf("a leaf with CA rights: IsCA %v", c.IsCA)
			}
			if c.KeyUsage&x509.KeyUsageCertSign != 0 || c.KeyUsage&x509.KeyUsageCRLSign != 0 {
				t.Errorf("a leaf may sign certificates or CRLs: key usage %b", c.KeyUsage)
			}
			if c.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
				t.Errorf("key usage %b lacks digital signature, which TLS with ECDSA needs", c.KeyUsage)
			}
			if !slices.Equal(c.ExtKeyUsage, tc.usages) {
				t.Errorf("extended key usages %v, want %v", c.ExtKeyUsage, tc.usages)
			}
			if !slices.Equal(c.DNSNames, tc.dns) {
				t.Errorf("DNS SANs %v, want %v", c.DNSNames, tc.dns)
			}
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			if !slices.Equal(ips, tc.ips) {
				t.Errorf("IP SANs %v, want %v", ips, tc.ips)
			}
			if !bytes.Equal(c.AuthorityKeyId, ca.Cert.SubjectKeyId) || c.CheckSignatureFrom(ca.Cert) != nil {
				t.Error("not signed by the CA that issued it")
			}
			if _, err := ParseKeyPair(tc.kp.CertPEM, tc.kp.KeyPEM); err != nil {
				t.Errorf("certificate and key do not belong together: %v", err)
			}
		})
	}
	// A leaf must not be able to act as a CA: a certificate it signs does
	// not verify, even though the signature itself is valid.
	forged, err := client.Issue(Request{CommonName: "forged", Usages: ClientUsage}, now)
	if err != nil {
		t.Fatal(err)
	}
	inter := x509.NewCertPool()
	inter.AddCert(client.Cert)
	if _, err := forged.Cert.Verify(x509.VerifyOptions{Roots: mustPool(t, ca), Intermediates: inter, CurrentTime: now, KeyUsages: ClientUsage}); err == nil {
		t.Error("a certificate signed by a leaf verified: leaves can act as CAs")
	}
}

// TestCAConstraints checks a CA: self-signed, allowed to sign certificates,
// valid for CAValidity, and back-dated like its leaves.
func TestCAConstraints(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	cas, err := NewClusterCAs(now)
	if err != nil {
		t.Fatal(err)
	}
	for name, ca := range map[string]*KeyPair{"cluster": cas.Cluster, "etcd": cas.Etcd, "front-proxy": cas.FrontProxy} {
		c := ca.Cert
		if !c.IsCA || !c.BasicConstraintsValid {
			t.Errorf("%s CA: IsCA %v, basic constraints valid %v", name, c.IsCA, c.BasicConstraintsValid)
		}
		if c.KeyUsage&x509.KeyUsageCertSign == 0 {
			t.Errorf("%s CA: key usage %b lacks certificate signing", name, c.KeyUsage)
		}
		if !c.NotBefore.Equal(now.Add(-clockSkew)) || !c.NotAfter.Equal(now.Add(CAValidity)) {
			t.Errorf("%s CA valid %s to %s", name, c.NotBefore, c.NotAfter)
		}
		if err := c.CheckSignatureFrom(c); err != nil || c.Issuer.String() != c.Subject.String() {
			t.Errorf("%s CA is not self-signed: %v", name, err)
		}
	}
	if cas.Cluster.Cert.Subject.CommonName != "kubernetes" || cas.Etcd.Cert.Subject.CommonName != "etcd-ca" {
		t.Errorf("CA names %q and %q, want kubernetes and etcd-ca as kubeadm names them",
			cas.Cluster.Cert.Subject.CommonName, cas.Etcd.Cert.Subject.CommonName)
	}
}

func mustPool(t *testing.T, ca *KeyPair) *x509.CertPool {
	t.Helper()
	pool, err := CertPool(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

func TestParseKeyPairRoundTripsAndRejectsMismatch(t *testing.T) {
	now := time.Now()
	a, _ := NewCA("a", now)
	b, _ := NewCA("b", now)
	got, err := ParseKeyPair(a.CertPEM, a.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(got.CertPEM, got.KeyPEM); err != nil {
		t.Errorf("round-tripped pair is not a TLS key pair: %v", err)
	}
	if _, err := ParseKeyPair(a.CertPEM, b.KeyPEM); err == nil {
		t.Error("mismatched key accepted")
	}
	if _, err := ParseKeyPair([]byte("garbage"), a.KeyPEM); err == nil {
		t.Error("garbage certificate accepted")
	}
}

func TestAdminKubeconfigLoads(t *testing.T) {
	now := time.Now()
	ca, _ := NewCA("kubernetes", now)
	data, err := AdminKubeconfig("c1", "https://127.0.10.1:6443", ca, now)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.10.1:6443" {
		t.Errorf("host = %q", cfg.Host)
	}
	user, err := ParseCert(cfg.CertData)
	if err != nil {
		t.Fatal(err)
	}
	if user.Subject.CommonName != "kubernetes-admin" || len(user.Subject.Organization) != 1 || user.Subject.Organization[0] != "system:masters" {
		t.Errorf("admin subject = %v", user.Subject)
	}
}

func TestSecretsFollowCAPINamingAndRoundTrip(t *testing.T) {
	cas, err := NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*corev1.Secret{}
	for _, s := range Secrets("ns", "c1", cas) {
		byName[s.Name] = s
		if s.Labels[clusterv1.ClusterNameLabel] != "c1" || s.Type != clusterv1.ClusterSecretType {
			t.Errorf("Secret %s: labels %v, type %s", s.Name, s.Labels, s.Type)
		}
	}
	for _, want := range []string{"c1-ca", "c1-etcd", "c1-proxy", "c1-sa"} {
		if byName[want] == nil {
			t.Errorf("no Secret %s among %v", want, byName)
		}
	}
	back, err := ClusterCAsFromSecrets("c1", byName)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Etcd.Cert.Equal(cas.Etcd.Cert) || !back.Cluster.Cert.Equal(cas.Cluster.Cert) ||
		!back.ServiceAccount.Cert.Equal(cas.ServiceAccount.Cert) || string(back.ServiceAccount.KeyPEM) != string(cas.ServiceAccount.KeyPEM) {
		t.Error("authorities did not round-trip through their Secrets")
	}
	delete(byName, "c1-proxy")
	if _, err := ClusterCAsFromSecrets("c1", byName); err == nil || !strings.Contains(err.Error(), "c1-proxy") {
		t.Errorf("a missing Secret gave %v, want an error naming c1-proxy", err)
	}
}

func TestWithoutAuthorityRemovesOnlyThatKey(t *testing.T) {
	now := time.Now()
	var cas []*KeyPair
	for _, name := range []string{"old", "new", "other"} {
		ca, err := NewCA(name, now)
		if err != nil {
			t.Fatal(err)
		}
		cas = append(cas, ca)
	}
	old, other := cas[0], cas[2]
	out, removed, err := WithoutAuthority(Bundle(cas...), old.Cert)
	if err != nil || !removed {
		t.Fatalf("WithoutAuthority: removed %v, err %v; want removed", removed, err)
	}
	if got, want := mustIDs(t, out), mustIDs(t, Bundle(cas[1], other)); got != want {
		t.Errorf("left %s; want %s", got, want)
	}
	if _, removed, err := WithoutAuthority(out, old.Cert); err != nil || removed {
		t.Errorf("a bundle without it: removed %v, err %v; want nothing removed", removed, err)
	}
	if _, _, err := WithoutAuthority([]byte("not PEM"), old.Cert); err == nil {
		t.Error("a bundle that does not parse was accepted")
	}
}

func mustIDs(t *testing.T, bundle []byte) string {
	t.Helper()
	ids, err := BundleKeyIDs(bundle)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestServiceAccountKeyPair: the service-account key stands in a rotation
// for an authority: named by its public key, equal only to itself, parsed
// from CAPI's Secret format (an RSA key too), refused when its halves do
// not belong together, and its public keys make a trust bundle.
func TestServiceAccountKeyPair(t *testing.T) {
	a, err := NewServiceAccountKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewServiceAccountKeyPair()
	if err != nil {
		t.Fatal(err)
	}
	if KeyID(a.Cert) == KeyID(b.Cert) || a.Cert.Equal(b.Cert) {
		t.Error("two keys share an identifier")
	}
	if block, _ := pem.Decode(a.CertPEM); block == nil || block.Type != "PUBLIC KEY" {
		t.Errorf("CertPEM %q; want a PEM public key, as CAPI's <cluster>-sa Secret holds", a.CertPEM)
	}
	back, err := ParseServiceAccountKeyPair(a.CertPEM, a.KeyPEM)
	if err != nil || KeyID(back.Cert) != KeyID(a.Cert) || !back.Cert.Equal(a.Cert) {
		t.Fatalf("round trip: %v", err)
	}
	if _, err := ParseServiceAccountKeyPair(b.CertPEM, a.KeyPEM); err == nil {
		t.Error("a public key of another key was taken")
	}
	if _, err := ParseServiceAccountKeyPair(a.CertPEM, []byte("junk")); err == nil {
		t.Error("a private key that is not PEM was taken")
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(rsaKey.Public())
	if err != nil {
		t.Fatal(err)
	}
	rsaPub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	rsaPriv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsaKey)})
	if _, err := ParseServiceAccountKeyPair(rsaPub, rsaPriv); err != nil {
		t.Errorf("CAPI's RSA format: %v", err)
	}
	// The rotation's Secrets of the key hold it in the same format.
	for _, purpose := range []secret.Purpose{secret.ServiceAccount, "sa-next", "sa-previous"} {
		if kp, err := ParseAuthority(purpose, a.CertPEM, a.KeyPEM); err != nil || !kp.Cert.Equal(a.Cert) {
			t.Errorf("ParseAuthority(%s): %v", purpose, err)
		}
	}
	if _, err := ParseAuthority("ca-next", a.CertPEM, a.KeyPEM); err == nil {
		t.Error("a service-account key was taken for a certificate authority")
	}
	both := Bundle(a, b)
	ids, err := BundleKeyIDs(both)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{KeyID(a.Cert), KeyID(b.Cert)}
	slices.Sort(want)
	if ids != strings.Join(want, ",") {
		t.Errorf("bundle ids %s; want %v", ids, want)
	}
	if err := CheckBundle(both, b); err != nil {
		t.Errorf("a bundle that holds the signer: %v", err)
	}
	if err := CheckBundle(a.CertPEM, b); err == nil {
		t.Error("a bundle without the signer's key was taken")
	}
	if _, err := BundleKeyIDs(append(slices.Clone(both), []byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n")...)); err == nil {
		t.Error("a bundle with a private key in it was taken")
	}
}
