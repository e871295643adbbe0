package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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
	// A certificate from another CA must not verify: the etcd CA trusts
	// only its own leaves.
	if _, err := cas.Cluster.Cert.Verify(x509.VerifyOptions{Roots: pool}); err == nil {
		t.Error("cluster CA verified against the etcd CA pool")
	}
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
		string(back.ServiceAccountKey) != string(cas.ServiceAccountKey) {
		t.Error("authorities did not round-trip through their Secrets")
	}
	delete(byName, "c1-proxy")
	if _, err := ClusterCAsFromSecrets("c1", byName); err == nil || !strings.Contains(err.Error(), "c1-proxy") {
		t.Errorf("a missing Secret gave %v, want an error naming c1-proxy", err)
	}
}
