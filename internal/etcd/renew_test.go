package etcd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestClientCertificateRenewedWithoutRestart: a client whose certificate
// renews itself (as qcp-manager's pooled clients do) still reaches etcd
// over new connections after its first certificate has expired, without
// being created again. A client holding a fixed certificate of the same
// life is refused then: that is what the renewal saves.
func TestClientCertificateRenewedWithoutRestart(t *testing.T) {
	testkit.RequireBinaries(t, "etcd")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, ps, _ := testkit.StartEtcdCluster(ctx, t, "renew", 1)
	const life = 6 * time.Second
	issue := func(at time.Time) (*certs.KeyPair, error) {
		return cl.CA.Issue(certs.Request{CommonName: "qcp-manager", Usages: certs.ClientUsage, Validity: life}, at)
	}
	renewing, err := certs.NewRenewing(issue, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := renewing.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	fixed, err := issue(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	endpoints := []string{ps[0].ClientURL()}
	renewingClient, err := etcd.New(etcd.Config{Endpoints: endpoints, CAPEM: cl.CA.CertPEM, ClientCertificate: renewing.ClientCertificate})
	if err != nil {
		t.Fatal(err)
	}
	defer renewingClient.Close()
	fixedClient, err := etcd.New(etcd.Config{Endpoints: endpoints, CAPEM: cl.CA.CertPEM, CertPEM: fixed.CertPEM, KeyPEM: fixed.KeyPEM})
	if err != nil {
		t.Fatal(err)
	}
	defer fixedClient.Close()
	put := func(c *etcd.Client, timeout time.Duration) error {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := c.Raw().Put(pctx, "k", "v")
		return err
	}
	for name, c := range map[string]*etcd.Client{"renewing": renewingClient, "fixed": fixedClient} {
		if err := put(c, 10*time.Second); err != nil {
			t.Fatalf("the %s client, with a fresh certificate: %v", name, err)
		}
	}

	expired := first.Leaf.NotAfter
	if fixed.Cert.NotAfter.After(expired) {
		expired = fixed.Cert.NotAfter
	}
	if err := testkit.Eventually(ctx, 100*time.Millisecond, "both first certificates expired", func(context.Context) error {
		if left := time.Until(expired); left >= 0 {
			return fmt.Errorf("%s left", left)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// A restarted member has no connection left: each client handshakes
	// again.
	if err := ps[0].Stop(); err != nil {
		t.Fatal(err)
	}
	if err := ps[0].Restart(); err != nil {
		t.Fatal(err)
	}
	if err := testkit.WaitHealthy(ctx, renewingClient, ps[0]); err != nil {
		t.Fatalf("the renewing client, after its first certificate expired: %v", err)
	}
	if err := put(renewingClient, 10*time.Second); err != nil {
		t.Errorf("the renewing client, after its first certificate expired: %v", err)
	}
	if n := renewing.Issued(); n < 2 {
		t.Errorf("the renewing client issued %d certificates; want at least 2", n)
	}
	if err := put(fixedClient, 5*time.Second); err == nil {
		t.Error("the client with a fixed, expired certificate was served: the test cannot tell renewal from none")
	}
}
