package machinehost

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestEtcdAuthorityMove takes a running stacked machine through the
// machine's part of an etcd CA rotation with PUT /pki/etcd-authority:
// trusting the new authority beside the old (kube-apiserver and etcd
// restart, one after the other, and a client of the new authority is
// taken), moving every etcd leaf to the new authority (nothing restarts),
// and distrusting the old one (a client of the old authority is refused).
// The API server serves throughout each step's end, and a machine that
// restarts from its unchanged bootstrap data comes back with the rotated
// authority. Invalid material is refused, and nothing changes.
func TestEtcdAuthorityMove(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real etcd and Kubernetes components")
	}
	testkit.RequireBinaries(t, "etcd", "kube")
	h := newHost(t)
	c := newTestCluster(t, h, "ns-etcdca", "cetcdca")
	m1 := c.spec("m1", "fd-a")
	doc := bootstrap.NewStacked(c.cl, c.cas, c.lbAddr, bootstrap.NewMember())
	c.startDoc(m1, doc)
	if err := h.SetBackends(c.ns, c.cl, []string{m1.Address + ":6443"}); err != nil {
		t.Fatal(err)
	}
	c.waitNodeReady("m1", corev1.ConditionTrue, 3*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	pkiDir := filepath.Join(h.Dir(c.ns, m1.Name), agent.PKIDir)
	oldCA := c.cas.Etcd
	newCA, err := certs.NewCA("etcd-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	both := certs.Bundle(oldCA, newCA)
	asOld, asNew := etcdClientTLS(t, both, oldCA), etcdClientTLS(t, both, newCA)
	// kube-controller-manager and kube-scheduler reach etcd through the
	// local API server, and may restart when it does (their leader
	// election lapses); they are left out.
	watched := []bootstrap.Component{bootstrap.Etcd, bootstrap.KubeAPIServer}
	set := func(via *tls.Config, ca *certs.KeyPair, trust []byte, wantMoved bool, wantRestarted ...string) agent.AuthorityResult {
		t.Helper()
		return c.setAuthority(ctx, m1, via, agent.EtcdAuthorityKind, ca, trust, wantMoved, "the etcd authorities it trusts changed", watched, wantRestarted...)
	}
	served := func(via *tls.Config) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{clientURL(m1)}, DialTimeout: 5 * time.Second, TLS: via, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = cli.MemberList(cctx)
		return err
	}

	// Refused: a trust bundle without the issuing authority; nothing
	// changes.
	caFile, _ := os.ReadFile(filepath.Join(pkiDir, "etcd/ca.crt"))
	_, err = agent.SetAuthority(ctx, asOld, m1.Address, agent.EtcdAuthorityKind, agent.Authority{CA: bootstrap.CertKey{Cert: string(newCA.CertPEM), Key: string(newCA.KeyPEM)}, Trust: string(oldCA.CertPEM)})
	if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "trust") {
		t.Fatalf("a bundle without its issuer: %v; want a 400 naming trust", err)
	}
	if now, _ := os.ReadFile(filepath.Join(pkiDir, "etcd/ca.crt")); string(now) != string(caFile) {
		t.Fatal("a refused authority changed etcd/ca.crt")
	}
	if err := served(asNew); err == nil {
		t.Fatal("etcd took a client of the new authority before trusting it")
	}

	// 1. Trust both: kube-apiserver and etcd read their trust at start.
	set(asOld, oldCA, both, false, string(bootstrap.KubeAPIServer), string(bootstrap.Etcd))
	for _, via := range []*tls.Config{asOld, asNew} {
		if err := served(via); err != nil {
			t.Fatalf("trusting both, etcd refuses a client: %v", err)
		}
	}
	// 2. Move the leaves: they reload, nothing restarts.
	res := set(asOld, newCA, both, true)
	for _, want := range []string{"etcd/server.crt", "etcd/peer.crt", "apiserver-etcd-client.crt", "memory:etcd-client"} {
		if !slices.Contains(res.Moved, want) {
			t.Errorf("moved %v, want %s among them", res.Moved, want)
		}
	}
	checkIssuedBy(t, res.Report, newCA)
	if got := presented(t, m1.Address, agent.EtcdClientPort, asNew); certs.IssuerKeyID(got) != certs.KeyID(newCA.Cert) {
		t.Fatalf("etcd's client port presents a certificate of %s after the move", got.Issuer.CommonName)
	}
	// 3. Distrust the old authority.
	res = set(asNew, newCA, newCA.CertPEM, false, string(bootstrap.KubeAPIServer), string(bootstrap.Etcd))
	checkTrusts(t, res.Report, newCA)
	if err := served(asOld); err == nil {
		t.Fatal("etcd still takes a client of the distrusted authority")
	}
	if err := served(asNew); err != nil {
		t.Fatal(err)
	}

	// A restart from the unchanged bootstrap data keeps the rotation: a
	// power cut (the directory stays), then a start.
	if err := h.Kill(c.ns, m1.Name); err != nil {
		t.Fatal(err)
	}
	c.eventually("the machine down", time.Minute, func() error {
		if st, err := h.Status(c.ns, m1.Name); err != nil || st.Running {
			return fmt.Errorf("running %v, %v", st.Running, err)
		}
		return nil
	})
	c.startDoc(m1, doc)
	var rep agent.PKIReport
	c.eventually("the restarted machine's report", time.Minute, func() error {
		rep, err = agent.GetPKI(ctx, asNew, m1.Address)
		return err
	})
	checkIssuedBy(t, rep, newCA)
	checkTrusts(t, rep, newCA)
	if fi, err := os.Stat(filepath.Join(h.Dir(c.ns, m1.Name), agent.EtcdAuthorityKind.File())); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v, %v; want mode 0600", agent.EtcdAuthorityKind.File(), fi, err)
	}
	c.checkNoRaces()
}

// etcdClientTLS trusts bundle and presents a client certificate of ca.
func etcdClientTLS(t *testing.T, bundle []byte, ca *certs.KeyPair) *tls.Config {
	t.Helper()
	cfg := etcdTLS(t, ca, true)
	cfg.RootCAs = pool(t, bundle)
	return cfg
}

// checkIssuedBy fails unless every etcd leaf in rep chains to ca.
func checkIssuedBy(t *testing.T, rep agent.PKIReport, ca *certs.KeyPair) {
	t.Helper()
	for _, name := range []string{"etcd/server.crt", "etcd/peer.crt", "apiserver-etcd-client.crt", "memory:etcd-client"} {
		if c, ok := rep.Find(name); !ok || c.IssuerKeyID != certs.KeyID(ca.Cert) {
			t.Errorf("%s: %+v; want it issued by %s", name, c, certs.KeyID(ca.Cert))
		}
	}
}

// checkTrusts fails unless the machine trusts ca alone for etcd.
func checkTrusts(t *testing.T, rep agent.PKIReport, ca *certs.KeyPair) {
	t.Helper()
	if all := rep.All("etcd/ca.crt"); len(all) != 1 || all[0].KeyID != certs.KeyID(ca.Cert) {
		t.Errorf("etcd/ca.crt holds %+v; want %s alone", all, certs.KeyID(ca.Cert))
	}
}

// setAuthority sets the authority of kind on machine spec through via and
// checks the answer: leaves moved or not as wantMoved says, the components
// of wantRestarted restarted in that order (naming why) and the others of
// watched not, and, for the etcd authority, the API server serving after
// the step.
func (c *testCluster) setAuthority(ctx context.Context, spec MachineSpec, via *tls.Config, kind agent.AuthorityKind, ca *certs.KeyPair, trust []byte,
	wantMoved bool, why string, watched []bootstrap.Component, wantRestarted ...string) agent.AuthorityResult {
	c.t.Helper()
	t := c.t
	before := c.waitHealthy(spec, time.Minute)
	res, err := agent.SetAuthority(ctx, via, spec.Address, kind, agent.Authority{CA: bootstrap.CertKey{Cert: string(ca.CertPEM), Key: string(ca.KeyPEM)}, Trust: string(trust)})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Restarted, wantRestarted) {
		t.Fatalf("restarted %v, want %v", res.Restarted, wantRestarted)
	}
	if moved := len(res.Moved) > 0; moved != wantMoved {
		t.Fatalf("moved %v, want leaves moved: %v", res.Moved, wantMoved)
	}
	after := c.waitHealthy(spec, time.Minute)
	restarted := map[bootstrap.Component]bool{}
	for _, comp := range watched {
		restarted[comp] = slices.Contains(wantRestarted, string(comp))
	}
	checkRestarted(t, before, after, why, restarted)
	// The test's own client is of the cluster CA a cluster rotation
	// distrusts: those tests check the API server with clients of their
	// own.
	if kind == agent.EtcdAuthorityKind {
		if err := c.listNodes(); err != nil {
			t.Fatalf("the API server does not serve after the step: %v", err)
		}
	}
	return res
}
