package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// readTree returns every file under dir by its name relative to dir.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name, _ := filepath.Rel(dir, path)
		out[name] = mustRead(t, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// stackedLeaves are the leaves a stacked machine's agent issues, by the
// report's names.
var stackedLeaves = []string{
	"apiserver-etcd-client.crt", "apiserver-kubelet-client.crt", "apiserver.crt",
	"controller-manager-serving.crt", "controller-manager.conf", "etcd/peer.crt", "etcd/server.crt",
	"front-proxy-client.crt", "scheduler-serving.crt", "scheduler.conf",
	memoryNode, memoryAdmin, memoryEtcdClient,
}

// TestPKIRenewReissuesEveryLeafAndNothingElse: a renewal signs every leaf
// the agent issued again, later, for the same key, with the validity of the
// bootstrap data; it leaves the authorities, the service-account key and
// every key file as they were, and the report says which is which.
func TestPKIRenewReissuesEveryLeafAndNothingElse(t *testing.T) {
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	doc := bootstrap.NewStacked("c1", cas, "127.0.208.100:6443", bootstrap.NewMember())
	doc.Tunables.CertificateValidityDays = 30
	m := Machine{Name: "m1", Namespace: "ns", Cluster: "c1", Address: "127.0.208.1", ProviderID: "p"}
	t0 := time.Now()
	p, err := IssuePKI(t.TempDir(), m, doc, t0)
	if err != nil {
		t.Fatal(err)
	}
	before, err := p.Report()
	if err != nil {
		t.Fatal(err)
	}
	var names, renewable []string
	for _, c := range before.Certificates {
		names = append(names, c.Name)
		if c.Renewable {
			renewable = append(renewable, c.Name)
		}
		if c.Renewable == c.IsCA {
			t.Errorf("%s: CA %v, renewable %v; want every leaf renewable and no CA", c.Name, c.IsCA, c.Renewable)
		}
	}
	wantNames := append([]string{"ca.crt", ClusterTrustFile, "etcd/ca.crt", "front-proxy-ca.crt"}, stackedLeaves...)
	if !sameSet(names, wantNames) || !sameSet(renewable, stackedLeaves) {
		t.Fatalf("report names %v, renewable %v; want %v and %v", names, renewable, wantNames, stackedLeaves)
	}
	if len(before.Leaves()) != len(stackedLeaves) {
		t.Errorf("Leaves() = %d certificates, want %d", len(before.Leaves()), len(stackedLeaves))
	}
	if e, ok := before.EarliestLeaf(); !ok || e.IsCA || !e.NotAfter.Equal(t0.Add(30*24*time.Hour).Truncate(time.Second)) {
		t.Errorf("EarliestLeaf() = %+v, %v; want a leaf of the document's 30 days", e, ok)
	}
	if n, ok := before.Find(memoryNode); !ok || n.Subject != "system:node:m1" || n.Issuer != "kubernetes" {
		t.Errorf("%s: %+v, %v", memoryNode, n, ok)
	}
	files := readTree(t, p.Dir)
	oldNode, oldEtcdClient := p.Node(), p.EtcdClient()

	t1 := t0.Add(time.Hour)
	renewed, err := p.Renew(t1)
	if err != nil {
		t.Fatal(err)
	}
	if !sameSet(renewed, stackedLeaves) {
		t.Errorf("renewed %v, want %v", renewed, stackedLeaves)
	}
	after, err := p.Report()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range before.Certificates {
		a, ok := after.Find(b.Name)
		if !ok {
			t.Errorf("%s is gone after the renewal", b.Name)
			continue
		}
		moved := a.NotAfter.After(b.NotAfter) && a.NotBefore.After(b.NotBefore) && a.SerialNumber != b.SerialNumber
		if b.Renewable && (!moved || !a.NotAfter.Equal(t1.Add(30*24*time.Hour).Truncate(time.Second)) || a.Subject != b.Subject || a.Issuer != b.Issuer) {
			t.Errorf("%s after the renewal: %+v; want it reissued an hour later for 30 days, from %+v", b.Name, a, b)
		}
		if !b.Renewable && a != b {
			t.Errorf("%s changed: %+v, was %+v", b.Name, a, b)
		}
	}
	for name, old := range readTree(t, p.Dir) {
		changed := !bytes.Equal(old, files[name])
		leafCert := strings.HasSuffix(name, ".conf") || (strings.HasSuffix(name, ".crt") && p.Renewable(name))
		if changed != leafCert {
			t.Errorf("%s changed %v; want only the leaves' certificates and kubeconfigs changed (keys, CAs, sa.* never)", name, changed)
		}
	}
	// The identities in memory keep their keys and move on.
	if p.Node() == oldNode || !bytes.Equal(p.Node().KeyPEM, oldNode.KeyPEM) {
		t.Error("the node identity was not reissued for its own key")
	}
	got, err := p.etcdClientCertificate(nil)
	if err != nil || got.Leaf != p.EtcdClient().Cert || p.EtcdClient() == oldEtcdClient {
		t.Errorf("the etcd client certificate presented after the renewal is not the renewed one (%v)", err)
	}
	// Every pair on disk still loads: key and certificate match.
	for _, name := range stackedLeaves {
		if base, ok := strings.CutSuffix(name, ".crt"); ok {
			if _, err := tls.LoadX509KeyPair(p.File(name), p.File(base+".key")); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}

// TestPKIRenewKeepsExternalEtcdClient: the external etcd client pair came
// with the bootstrap data; the agent cannot issue it and leaves it alone.
func TestPKIRenewKeepsExternalEtcdClient(t *testing.T) {
	now := time.Now()
	_, client, doc := externalDoc(t, now)
	p, err := IssuePKI(t.TempDir(), Machine{Name: "m1", Address: "127.0.208.1"}, doc, now)
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := p.Renew(now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"apiserver-etcd-client.crt", memoryEtcdClient} {
		if slices.Contains(renewed, name) || p.Renewable(name) {
			t.Errorf("%s was renewed: %v", name, renewed)
		}
	}
	if !bytes.Equal(mustRead(t, p.File("apiserver-etcd-client.crt")), client.CertPEM) || p.EtcdClient().Cert.SerialNumber.Cmp(client.Cert.SerialNumber) != 0 {
		t.Error("the external etcd client pair changed")
	}
	if !slices.Contains(renewed, "apiserver.crt") {
		t.Errorf("renewed %v; want the agent's own leaves", renewed)
	}
}

// TestPKIEndpoint serves the endpoint of a machine whose components do not
// run: only a client of the etcd CA may read or renew, a renewal while one
// runs is refused, and the endpoint itself serves the renewed certificate.
func TestPKIEndpoint(t *testing.T) {
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	addr := testkit.ReserveAddress(t)
	dir := t.TempDir()
	m := Machine{Name: "m1", Namespace: "ns", Cluster: "c1", Address: addr, ProviderID: "p"}
	doc := bootstrap.NewStacked("c1", cas, "", bootstrap.NewMember())
	p, err := IssuePKI(dir, m, doc, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a, ctx := serveEndpoint(t, dir, m, doc, p, io.Discard)
	manager := clientTLS(t, cas.Etcd, cas.Etcd)

	r, err := GetPKI(ctx, manager, addr)
	if err != nil {
		t.Fatal(err)
	}
	server, ok := r.Find("etcd/server.crt")
	if !ok || len(r.Leaves()) != len(stackedLeaves) {
		t.Fatalf("GET %s: %+v", PKIPath, r)
	}
	if got := presentedSerial(t, manager, addr); got != server.SerialNumber {
		t.Fatalf("the endpoint presents serial %s, want etcd/server.crt's %s", got, server.SerialNumber)
	}

	for name, cfg := range map[string]*tls.Config{
		"no client certificate":   clientTLS(t, cas.Etcd, nil),
		"the cluster CA's client": clientTLS(t, cas.Etcd, cas.Cluster),
	} {
		if _, err := GetPKI(ctx, cfg, addr); err == nil || !strings.Contains(err.Error(), "tls: ") {
			t.Errorf("%s: GET answered %v; want a TLS error", name, err)
		}
		if _, err := RenewPKI(ctx, cfg, addr, PKIRenewRequest{}); err == nil || !strings.Contains(err.Error(), "tls: ") {
			t.Errorf("%s: POST answered %v; want a TLS error", name, err)
		}
	}
	if after, err := GetPKI(ctx, manager, addr); err != nil || !slices.Equal(after.Certificates, r.Certificates) {
		t.Errorf("refused renewals changed the certificates: %v", err)
	}

	a.renewing.Lock()
	_, err = RenewPKI(ctx, manager, addr, PKIRenewRequest{})
	a.renewing.Unlock()
	if err == nil || !strings.Contains(err.Error(), "409 Conflict: a renewal of this machine's certificates is already running") {
		t.Errorf("POST during a renewal: %v; want 409", err)
	}

	res, err := RenewPKI(ctx, manager, addr, PKIRenewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	renewed, _ := res.Report.Find("etcd/server.crt")
	if !sameSet(res.Renewed, stackedLeaves) || len(res.Restarted) != 0 || renewed.SerialNumber == server.SerialNumber || renewed.NotAfter.Before(server.NotAfter) {
		t.Errorf("POST %s: renewed %v, restarted %v, etcd/server.crt %+v", PKIRenewPath, res.Renewed, res.Restarted, renewed)
	}
	if got := presentedSerial(t, manager, addr); got != renewed.SerialNumber {
		t.Errorf("after the renewal the endpoint presents serial %s, want the renewed %s", got, renewed.SerialNumber)
	}
	for _, method := range []string{http.MethodGet, http.MethodPut} {
		if err := callAgent(ctx, manager, addr, method, PKIRenewPath, time.Second, nil, new(any)); err == nil || !strings.Contains(err.Error(), "405") {
			t.Errorf("%s %s: %v; want 405", method, PKIRenewPath, err)
		}
	}
}

// presentedSerial is the serial number of the certificate the endpoint at
// addr presents to a new connection.
func presentedSerial(t *testing.T, cfg *tls.Config, addr string) string {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(addr, strconv.Itoa(EtcdAdminPort)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)
}

func TestPKIReportEarliestLeaf(t *testing.T) {
	day := func(d int) time.Time { return time.Date(2030, 1, d, 0, 0, 0, 0, time.UTC) }
	r := PKIReport{Certificates: []PKICertificate{
		{Name: "ca.crt", IsCA: true, NotAfter: day(1)},
		{Name: "b", NotAfter: day(5)},
		{Name: "a", NotAfter: day(3)},
	}}
	if e, ok := r.EarliestLeaf(); !ok || e.Name != "a" {
		t.Errorf("EarliestLeaf() = %+v, %v; want a, not the CA", e, ok)
	}
	if _, ok := (PKIReport{Certificates: r.Certificates[:1]}).EarliestLeaf(); ok {
		t.Error("a report of CAs only has an earliest leaf")
	}
}

func TestPKIReportNamesAnUnreadableFile(t *testing.T) {
	cas, _ := certs.NewClusterCAs(time.Now())
	p, err := IssuePKI(t.TempDir(), Machine{Name: "m1", Address: "127.0.208.1"}, bootstrap.NewEtcdOnly("c1", cas.Etcd, bootstrap.NewMember()), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.File("etcd/peer.crt"), []byte("not PEM"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Report(); err == nil || !strings.Contains(err.Error(), p.File("etcd/peer.crt")) {
		t.Errorf("Report: %v; want an error naming etcd/peer.crt", err)
	}
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// TestNodeClientsPresentRenewedIdentity: after a renewal, the node agent's
// requests present the renewed node certificate, without a restart.
func TestNodeClientsPresentRenewedIdentity(t *testing.T) {
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	serving, err := certs.IssueServing(cas.Cluster, "test-apiserver", net.IPv4(127, 0, 0, 1), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(serving.CertPEM, serving.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 10)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.TLS.PeerCertificates[0].SerialNumber.Text(16)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"m1"}}`))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool(t, cas.Cluster.CertPEM), ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	defer srv.Close()

	doc := bootstrap.NewExternal("c1", cas, strings.TrimPrefix(srv.URL, "https://"), bootstrap.ExternalEtcd{})
	doc.Components, doc.Etcd.External = []bootstrap.Component{bootstrap.KubeControllerManager}, nil
	m := Machine{Name: "m1", Namespace: "ns", Address: "127.0.0.1"}
	now := time.Now()
	p, err := IssuePKI(t.TempDir(), m, doc, now)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	a := &machineCtx{machine: m, doc: doc, pki: p, log: log, sup: newSupervisor(t.TempDir(), log, 0)}
	n, err := a.newNodeAgent()
	if err != nil {
		t.Fatal(err)
	}
	a.node.Store(n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round, want := range []func() *certs.KeyPair{p.Node, p.Node} {
		if round == 1 {
			if _, err := a.renewPKI(ctx, time.Now(), PKIRenewRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := n.register(ctx); err != nil {
			t.Fatal(err)
		}
		if got, want := <-seen, want().Cert.SerialNumber.Text(16); got != want {
			t.Errorf("round %d: the API server saw client certificate %s, want the node identity's %s", round, got, want)
		}
	}
}

func pool(t *testing.T, caPEM []byte) *x509.CertPool {
	t.Helper()
	p, err := certs.CertPool(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDeliverEtcdClient puts a renewed external etcd client pair in place
// on a machine of an external etcd, and refuses, writing nothing, a pair
// that does not chain to the machine's etcd CA, a key of another pair, an
// expired certificate, and any pair on a machine that issues its own.
func TestDeliverEtcdClient(t *testing.T) {
	now := time.Now()
	cas, client, doc := externalDoc(t, now)
	p, err := IssuePKI(t.TempDir(), Machine{Name: "m1", Address: "127.0.208.1"}, doc, now)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := certs.NewClusterCAs(now)
	foreign, _ := certs.IssueEtcdClient(other.Etcd, "kube-apiserver-etcd-client", now)
	second, _ := certs.IssueEtcdClient(cas.Etcd, "kube-apiserver-etcd-client", now)
	expired, _ := cas.Etcd.Issue(certs.Request{CommonName: "kube-apiserver-etcd-client", Usages: certs.ClientUsage, Validity: time.Minute}, now.Add(-time.Hour))
	for _, tc := range []struct {
		name      string
		cert, key []byte
		want      string
	}{
		{"another CA", foreign.CertPEM, foreign.KeyPEM, "not a client certificate of the etcd CA this machine trusts"},
		{"mismatched key", second.CertPEM, client.KeyPEM, "etcdClientCert and etcdClientKey"},
		{"expired", expired.CertPEM, expired.KeyPEM, "valid now"},
	} {
		_, err := p.deliverEtcdClient(PKIRenewRequest{EtcdClientCert: tc.cert, EtcdClientKey: tc.key}, now)
		if !errors.As(err, new(invalidMaterial)) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v; want a refusal naming %q", tc.name, err, tc.want)
		}
		if !bytes.Equal(mustRead(t, p.File("apiserver-etcd-client.crt")), client.CertPEM) || !bytes.Equal(mustRead(t, p.File("apiserver-etcd-client.key")), client.KeyPEM) {
			t.Fatalf("%s: the refused pair was written", tc.name)
		}
	}
	// The EtcdCluster's renewal: the same key, a new certificate.
	renewed, err := cas.Etcd.Reissue(client, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, pair := range []*certs.KeyPair{renewed, second} {
		changed, err := p.deliverEtcdClient(PKIRenewRequest{EtcdClientCert: pair.CertPEM, EtcdClientKey: pair.KeyPEM}, now.Add(time.Minute))
		if err != nil || !changed {
			t.Fatalf("delivering a pair of the machine's etcd CA: changed %v, %v", changed, err)
		}
		if !bytes.Equal(mustRead(t, p.File("apiserver-etcd-client.crt")), pair.CertPEM) || !bytes.Equal(mustRead(t, p.File("apiserver-etcd-client.key")), pair.KeyPEM) {
			t.Error("the delivered pair is not in the files")
		}
		if p.EtcdClient().Cert.SerialNumber.Cmp(pair.Cert.SerialNumber) != 0 {
			t.Error("the agent's own etcd client is still the old pair")
		}
	}
	if changed, err := p.deliverEtcdClient(PKIRenewRequest{EtcdClientCert: second.CertPEM, EtcdClientKey: second.KeyPEM}, now); err != nil || changed {
		t.Errorf("delivering the pair the machine holds: changed %v, %v; want nothing to do", changed, err)
	}
	stacked, err := IssuePKI(t.TempDir(), Machine{Name: "m2", Address: "127.0.208.2"}, bootstrap.NewStacked("c1", cas, "", bootstrap.NewMember()), now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stacked.deliverEtcdClient(PKIRenewRequest{EtcdClientCert: second.CertPEM, EtcdClientKey: second.KeyPEM}, now); !errors.As(err, new(invalidMaterial)) {
		t.Errorf("a stacked machine took an etcd client pair: %v", err)
	}
}

// externalDoc is the bootstrap data of a control plane machine on an
// external etcd, with new authorities and the API servers' client pair.
func externalDoc(t *testing.T, now time.Time) (*certs.ClusterCAs, *certs.KeyPair, *bootstrap.Document) {
	t.Helper()
	cas, err := certs.NewClusterCAs(now)
	if err != nil {
		t.Fatal(err)
	}
	client, err := certs.IssueEtcdClient(cas.Etcd, "kube-apiserver-etcd-client", now)
	if err != nil {
		t.Fatal(err)
	}
	return cas, client, bootstrap.NewExternal("c1", cas, "", bootstrap.ExternalEtcd{Endpoints: []string{"https://127.0.0.1:2379"},
		CACert: string(cas.Etcd.CertPEM), ClientCert: string(client.CertPEM), ClientKey: string(client.KeyPEM)})
}

// serveEndpoint serves the agent endpoint of machine m, whose PKI p was
// issued under dir, until the test ends, logging to the test's output and
// to logs. The context is the endpoint's, for the test's calls too.
func serveEndpoint(t *testing.T, dir string, m Machine, doc *bootstrap.Document, p *PKI, logs io.Writer) (*machineCtx, context.Context) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), logs), nil))
	a := &machineCtx{dir: dir, machine: m, doc: doc, pki: p, log: log, sup: newSupervisor(t.TempDir(), log, 0)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(func() {
		cancel()
		a.servers.Wait()
	})
	if err := a.serveAgentEndpoint(ctx); err != nil {
		t.Fatal(err)
	}
	return a, ctx
}
