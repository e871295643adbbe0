package machinehost

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestPKIRenewal renews the certificates of a running stacked machine
// through its agent and shows how each component takes them: etcd (client
// and peer ports) and the agent's endpoint present the new ones at the next
// handshake, kube-apiserver's serving certificate is reloaded within a
// bounded wait, kube-controller-manager and kube-scheduler are restarted
// one after the other, etcd and kube-apiserver are not, and the agent's own
// Node client keeps renewing the Node's lease.
func TestPKIRenewal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real etcd and Kubernetes components")
	}
	testkit.RequireBinaries(t, "etcd", "kube")
	h := newHost(t)
	c := newTestCluster(t, h, "ns-pki", "cpki")
	m1 := c.spec("m1", "fd-a")
	c.start(m1, bootstrap.NewMember(), []string{m1.Address + ":6443"})
	c.waitNodeReady("m1", corev1.ConditionTrue, 3*time.Minute)
	hBefore := c.waitHealthy(m1, time.Minute)
	agentPIDs := c.pids()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	manager := etcdTLS(t, c.cas.Etcd, true)
	pkiDir := filepath.Join(h.Dir(c.ns, m1.Name), agent.PKIDir)

	report, err := agent.GetPKI(ctx, manager, m1.Address)
	if err != nil {
		t.Fatal(err)
	}
	files := readPKIFiles(t, pkiDir)
	leafFiles := renewableFiles(report)
	if len(leafFiles) != 10 {
		t.Fatalf("renewable files %v; want the 10 leaves of a stacked machine", leafFiles)
	}
	ports := map[string]int{"etcd/server.crt": agent.EtcdClientPort, "etcd/peer.crt": agent.EtcdPeerPort}
	for name, port := range ports {
		if got, want := presented(t, m1.Address, port, manager), fileCert(t, pkiDir, name); !got.Equal(want) {
			t.Fatalf("port %d presents serial %x before the renewal, not %s's %x", port, got.SerialNumber, name, want.SerialNumber)
		}
	}

	res, renewAt, answered := c.renew(ctx, manager, m1.Address, report)

	// Every leaf on disk is new and later, for the same key; the
	// authorities and the service-account key are untouched.
	after := readPKIFiles(t, pkiDir)
	for name, old := range files {
		changed := !bytes.Equal(after[name], old)
		wantChanged := slices.Contains(leafFiles, name)
		if changed != wantChanged {
			t.Errorf("%s changed %v, want %v (keys, CAs and sa.* stay)", name, changed, wantChanged)
		}
	}
	for _, name := range leafFiles {
		was, now := parseLeaf(t, name, files[name]), parseLeaf(t, name, after[name])
		if !now.NotAfter.After(was.NotAfter) || !now.NotBefore.After(was.NotBefore) {
			t.Errorf("%s: valid %v to %v after the renewal, was %v to %v; want both later", name, now.NotBefore, now.NotAfter, was.NotBefore, was.NotAfter)
		}
		if r, ok := res.Report.Find(name); !ok || r.SerialNumber != now.SerialNumber.Text(16) {
			t.Errorf("%s: the answer reports %+v, the file holds serial %x", name, r, now.SerialNumber)
		}
	}
	for _, name := range []string{"memory:node", "memory:admin", "memory:etcd-client"} {
		was, _ := report.Find(name)
		now, ok := res.Report.Find(name)
		if !ok || !now.NotAfter.After(was.NotAfter) {
			t.Errorf("%s: %+v after the renewal, was %+v; want it later", name, now, was)
		}
	}

	// etcd reads its certificates at each handshake, and so does the
	// agent's endpoint after the renewal: no wait.
	ports["etcd/server.crt#admin"] = agent.EtcdAdminPort
	for name, port := range ports {
		name, _, _ = strings.Cut(name, "#")
		if got, want := presented(t, m1.Address, port, manager), fileCert(t, pkiDir, name); !got.Equal(want) {
			t.Errorf("port %d presents serial %x after the renewal, not the renewed %s's %x", port, got.SerialNumber, name, want.SerialNumber)
		}
	}
	// kube-apiserver watches its serving certificate (and polls it every
	// minute), so a new connection gets it within about a minute.
	c.waitAPIServerPresents(m1.Address, pkiDir)
	t.Logf("kube-apiserver presented its renewed serving certificate %v after the renewal", time.Since(renewAt).Round(time.Second))

	// Restarted: the two that embed their client certificate; not etcd
	// nor kube-apiserver, which reload.
	hAfter := c.waitHealthy(m1, time.Minute)
	checkRestarted(t, hBefore, hAfter, "client certificate was renewed", map[bootstrap.Component]bool{
		bootstrap.Etcd: false, bootstrap.KubeAPIServer: false,
		bootstrap.KubeControllerManager: true, bootstrap.KubeScheduler: true,
	})

	// One at a time: the scheduler restarts once the controller manager
	// has passed a probe after its own restart.
	kcm, sched := hAfter.Components[bootstrap.KubeControllerManager], hAfter.Components[bootstrap.KubeScheduler]
	if !sched.StartedAt.After(kcm.StartedAt) {
		t.Errorf("kube-scheduler restarted at %v, before kube-controller-manager at %v", sched.StartedAt, kcm.StartedAt)
	}
	t.Logf("after the request: kube-controller-manager started %v, kube-scheduler %v", kcm.StartedAt.Sub(renewAt).Round(time.Millisecond), sched.StartedAt.Sub(renewAt).Round(time.Millisecond))

	// The agent's Node client, built again from the renewed identity,
	// renews the Node's lease.
	c.eventually("the Node's lease renewed after the renewal", time.Minute, func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := c.kube.CoordinationV1().Leases("kube-node-lease").Get(cctx, m1.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(answered) {
			return fmt.Errorf("renewed at %v", l.Spec.RenewTime)
		}
		return nil
	})
	if now := c.pids(); now[m1.Name] != agentPIDs[m1.Name] {
		t.Errorf("the agent's pid is %d, was %d: it restarted", now[m1.Name], agentPIDs[m1.Name])
	}

	// The cluster works: etcd directly, and through kube-apiserver.
	cli := c.etcdClient(clientURL(m1)).Raw()
	if _, err := cli.Put(ctx, "/pki-renewal", "after"); err != nil {
		t.Fatal(err)
	}
	if got, err := cli.Get(ctx, "/pki-renewal"); err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "after" {
		t.Fatalf("etcd read after the renewal: %v, %v", got, err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "after-renewal", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := c.kube.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.kube.CoreV1().ConfigMaps("default").Get(ctx, cm.Name, metav1.GetOptions{}); err != nil || got.Data["k"] != "v" {
		t.Fatalf("ConfigMap read after the renewal: %v, %v", got, err)
	}

	log, err := os.ReadFile(filepath.Join(h.Dir(c.ns, m1.Name), "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "certificates renewed"); n != 1 || strings.Contains(string(log), "PRIVATE KEY") {
		t.Errorf("agent.log has %d renewal lines (want 1) or key material", n)
	}
}

// renewableFiles names the files of report that a renewal issues again.
func renewableFiles(report agent.PKIReport) []string {
	var out []string
	for _, cert := range report.Certificates {
		if cert.Renewable && !strings.HasPrefix(cert.Name, "memory:") {
			out = append(out, cert.Name)
		}
	}
	return out
}

// waitPastIssuance waits until a renewal would be valid from later than
// report's leaves are: certificates keep whole seconds (and are valid from
// certs' clock skew before their issue), so renewing in the second of the
// boot would issue the same validity again.
// renew renews the certificates of the machine at addr once the second
// its leaves were issued in has passed, and checks that only the
// controller manager and the scheduler restarted, in that order. It
// returns the answer, when it was asked for and when it came.
func (c *testCluster) renew(ctx context.Context, manager *tls.Config, addr string, report agent.PKIReport) (res agent.PKIRenewResult, renewAt, answered time.Time) {
	c.t.Helper()
	c.waitPastIssuance(report)
	renewAt = time.Now()
	res, err := agent.RenewPKI(ctx, manager, addr, agent.PKIRenewRequest{})
	answered = time.Now()
	if err != nil {
		c.dumpLogs()
		c.t.Fatal(err)
	}
	c.t.Logf("renewal answered after %v, restarted %v", answered.Sub(renewAt).Round(time.Millisecond), res.Restarted)
	if want := []string{"kube-controller-manager", "kube-scheduler"}; !slices.Equal(res.Restarted, want) {
		c.t.Errorf("restarted %v, want %v in that order", res.Restarted, want)
	}
	return res, renewAt, answered
}

// waitAPIServerPresents waits until kube-apiserver at addr presents, to a
// new connection, the serving certificate in pkiDir: it watches the file
// (and polls it every minute), so within about a minute of a renewal.
func (c *testCluster) waitAPIServerPresents(addr, pkiDir string) {
	c.t.Helper()
	t := c.t
	serving := fileCert(t, pkiDir, "apiserver.crt")
	apiTLS := &tls.Config{RootCAs: pool(t, c.cas.Cluster.CertPEM), MinVersion: tls.VersionTLS12}
	c.eventually("kube-apiserver to present its renewed serving certificate", 90*time.Second, func() error {
		if got := presented(t, addr, agent.APIServerPort, apiTLS); !got.Equal(serving) {
			return fmt.Errorf("it presents serial %x valid until %v, not %x", got.SerialNumber, got.NotAfter, serving.SerialNumber)
		}
		return nil
	})
}

func (c *testCluster) waitPastIssuance(report agent.PKIReport) {
	c.t.Helper()
	var issued time.Time
	for _, cert := range report.Leaves() {
		if cert.NotBefore.After(issued) {
			issued = cert.NotBefore
		}
	}
	c.eventually("a second to pass since the leaves were issued", 5*time.Second, func() error {
		if now := time.Now().Add(-5 * time.Minute).Truncate(time.Second); !now.After(issued) {
			return fmt.Errorf("a renewal now would be valid from %v, as the leaves are", now)
		}
		return nil
	})
}

// checkRestarted checks, for each component of want, that it was
// restarted between the two health reports, for a renewed certificate,
// if and only if want says so.
func checkRestarted(t testing.TB, before, after agent.Health, why string, want map[bootstrap.Component]bool) {
	t.Helper()
	for comp, restarted := range want {
		was, now := before.Components[comp], after.Components[comp]
		if (now.PID != was.PID) != restarted || (now.Restarts != was.Restarts) != restarted {
			t.Errorf("%s: pid %d, %d restarts after the renewal; was pid %d, %d restarts; want restarted %v", comp, now.PID, now.Restarts, was.PID, was.Restarts, restarted)
		}
		if restarted && !strings.Contains(now.LastError, why) {
			t.Errorf("%s: last error %q; want the restart's cause (%q) named", comp, now.LastError, why)
		}
	}
}

// etcdTLS trusts the etcd CA and, with client, presents a client
// certificate of it, as qcp-manager does.
func etcdTLS(t *testing.T, etcdCA *certs.KeyPair, client bool) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: pool(t, etcdCA.CertPEM), MinVersion: tls.VersionTLS12}
	if client {
		kp, err := certs.IssueEtcdClient(etcdCA, "qcp-manager", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

func pool(t testing.TB, caPEM []byte) *x509.CertPool {
	t.Helper()
	p, err := certs.CertPool(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// presented is the certificate a new TLS connection to addr:port gets.
func presented(t testing.TB, addr string, port int, cfg *tls.Config) *x509.Certificate {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(addr, strconv.Itoa(port)), cfg)
	if err != nil {
		t.Fatalf("handshake with %s:%d: %v", addr, port, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// readPKIFiles returns every file under dir by its name relative to dir.
func readPKIFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name, err := filepath.Rel(dir, path)
		if err == nil {
			out[name], err = os.ReadFile(path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func fileCert(t testing.TB, dir, name string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return parseLeaf(t, name, data)
}

// parseLeaf parses a certificate file, or a kubeconfig's client
// certificate.
func parseLeaf(t testing.TB, name string, data []byte) *x509.Certificate {
	t.Helper()
	if strings.HasSuffix(name, ".conf") {
		cfg, err := clientcmd.Load(data)
		if err != nil || len(cfg.AuthInfos) != 1 {
			t.Fatalf("%s: %v, %d users; want one", name, err, len(cfg.AuthInfos))
		}
		for _, user := range cfg.AuthInfos {
			data = user.ClientCertificateData
		}
	}
	c, err := certs.ParseCert(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return c
}
