package agent

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestNodeRegistration: an etcd-only machine's agent refuses a
// registration that fails a check, naming the field, and keeps nothing;
// a valid one is kept (0600) and starts the Node agent, which registers
// the machine's Node, tainted NoExecute, with its providerID, as the node;
// a second one replaces the identity without starting another agent; a
// restarted agent finds the kept one.
func TestNodeRegistration(t *testing.T) {
	now := time.Now()
	cas, err := certs.NewClusterCAs(now)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := certs.IssueServing(cas.Cluster, "test-apiserver", net.IPv4(127, 0, 0, 1), now)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(serving.CertPEM, serving.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	type request struct {
		user string
		node *corev1.Node
	}
	created := make(chan request, 10)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost && r.URL.Path == "/api/v1/nodes" {
			// client-go may send protobuf: decode what it sent.
			body, _ := io.ReadAll(r.Body)
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
			node, ok := obj.(*corev1.Node)
			if err != nil || !ok {
				t.Errorf("the Node agent posted %T, %v", obj, err)
				node = &corev1.Node{}
			}
			created <- request{r.TLS.PeerCertificates[0].Subject.CommonName, node}
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(node)
			return
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool(t, cas.Cluster.CertPEM), ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	defer srv.Close()

	addr := testkit.ReserveAddress(t)
	dir := t.TempDir()
	m := Machine{Name: "e1", Namespace: "ns", Cluster: "c1", Address: addr, ProviderID: "process://ns/e1"}
	doc := bootstrap.NewEtcdOnly("c1", cas.Etcd, bootstrap.NewMember())
	p, err := IssuePKI(dir, m, doc, now)
	if err != nil {
		t.Fatal(err)
	}
	a, ctx := serveEndpoint(t, dir, m, doc, p, io.Discard)
	if a.prober, err = a.newProber(); err != nil {
		t.Fatal(err)
	}
	manager := clientTLS(t, cas.Etcd, cas.Etcd)

	node, err := certs.IssueNodeClient(cas.Cluster, m.Name, now)
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.IssueNodeClient(cas.Cluster, "e2", now)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := certs.NewCA("someone-else", now)
	if err != nil {
		t.Fatal(err)
	}
	valid := NodeRegistration{Server: srv.URL, ClusterTrust: cas.Cluster.CertPEM, NodeCert: node.CertPEM, NodeKey: node.KeyPEM}
	for name, tc := range map[string]struct {
		change func(*NodeRegistration)
		want   string
	}{
		"a server that is not https":         {func(r *NodeRegistration) { r.Server = "http://127.0.0.1:6443" }, "server "},
		"no trust":                           {func(r *NodeRegistration) { r.ClusterTrust = nil }, "clusterTrust"},
		"a key of another pair":              {func(r *NodeRegistration) { r.NodeKey = other.KeyPEM }, "nodeCert and nodeKey"},
		"another machine's identity":         {func(r *NodeRegistration) { r.NodeCert, r.NodeKey = other.CertPEM, other.KeyPEM }, `want "system:node:e1"`},
		"a trust the cert does not chain to": {func(r *NodeRegistration) { r.ClusterTrust = foreign.CertPEM }, "chains to clusterTrust"},
	} {
		reg := valid
		tc.change(&reg)
		_, err := PutNodeRegistration(ctx, manager, addr, reg)
		if err == nil || !strings.Contains(err.Error(), "400 Bad Request: invalid node registration: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want 400 naming %q", name, err, tc.want)
		}
	}
	if _, err := os.Stat(p.File(nodeRegistrationFile)); !os.IsNotExist(err) || a.node.Load() != nil {
		t.Fatalf("refused registrations left a file (%v) or a Node agent", err)
	}
	if _, err := PutNodeRegistration(ctx, clientTLS(t, cas.Etcd, cas.Cluster), addr, valid); err == nil || !strings.Contains(err.Error(), "tls: ") {
		t.Errorf("a client of the cluster CA: %v; want a TLS error", err)
	}

	res, err := PutNodeRegistration(ctx, manager, addr, valid)
	if err != nil || !res.Started {
		t.Fatalf("PUT %s: %+v, %v; want the Node agent started", NodeRegistrationPath, res, err)
	}
	select {
	case got := <-created:
		taints := got.node.Spec.Taints
		if got.user != "system:node:e1" || got.node.Name != "e1" || got.node.Spec.ProviderID != m.ProviderID ||
			len(taints) != 1 || taints[0].Key != EtcdNodeRole || taints[0].Effect != corev1.TaintEffectNoExecute {
			t.Errorf("the Node agent created %+v as %s", got.node, got.user)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Node agent created no Node")
	}
	if fi, err := os.Stat(p.File(nodeRegistrationFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the kept registration: %v, %v; want mode 0600", fi, err)
	}
	first := a.node.Load()
	if res, err := PutNodeRegistration(ctx, manager, addr, valid); err != nil || res.Started || a.node.Load() != first {
		t.Errorf("a second PUT: %+v, %v; want the running agent kept", res, err)
	}

	restarted := &machineCtx{dir: dir, machine: m, doc: doc, pki: p, log: a.log}
	if err := restarted.loadNodeRegistration(); err != nil {
		t.Fatal(err)
	}
	if reg, kp := restarted.registration.get(); reg == nil || reg.Digest() != valid.Digest() || kp.Cert.SerialNumber.Cmp(node.Cert.SerialNumber) != 0 {
		t.Errorf("a restarted agent read %+v", reg)
	}
}
