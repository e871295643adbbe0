package certs

import (
	"crypto/x509"
	"net"
	"testing"
	"time"
)

func TestAPIServerServingCoversEveryName(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := IssueAPIServerServing(ca, net.ParseIP("127.0.200.2"), "127.0.200.1", net.ParseIP("10.96.0.1"), nil, now)
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := CertPool(ca.CertPEM)
	for _, host := range []string{"127.0.200.2", "127.0.200.1", "127.0.0.1", "10.96.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} {
		if _, err := kp.Cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("serving cert does not verify for %s: %v", host, err)
		}
	}
	node, err := IssueNodeClient(ca, "m-1", now)
	if err != nil {
		t.Fatal(err)
	}
	if node.Cert.Subject.CommonName != "system:node:m-1" || node.Cert.Subject.Organization[0] != "system:nodes" {
		t.Errorf("node subject = %v", node.Cert.Subject)
	}
}

func TestAPIServerServingAddsExtraSANs(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	extra := []string{"api.example.com", "*.apps.example.com", "192.0.2.10", "2001:db8::1", "localhost", "127.0.0.1", "api.example.com"}
	kp, err := IssueAPIServerServing(ca, net.ParseIP("127.0.200.2"), "cp.example.com", net.ParseIP("10.96.0.1"), extra, now)
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := CertPool(ca.CertPEM)
	// The built-in names stay; the extra ones are added.
	for _, host := range []string{"127.0.200.2", "cp.example.com", "kubernetes.default.svc", "10.96.0.1", "api.example.com", "x.apps.example.com", "192.0.2.10", "2001:db8::1"} {
		if _, err := kp.Cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("serving cert does not verify for %s: %v", host, err)
		}
	}
	// A name given again, or one the agent already adds, appears once.
	count := map[string]int{}
	for _, n := range kp.Cert.DNSNames {
		count[n]++
	}
	for _, ip := range kp.Cert.IPAddresses {
		count[ip.String()]++
	}
	for _, n := range []string{"api.example.com", "localhost", "127.0.0.1"} {
		if count[n] != 1 {
			t.Errorf("%s is in the certificate %d times, want once", n, count[n])
		}
	}
}
