package machinehost

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestExternalEtcdMachine runs an etcd-only machine (as an EtcdCluster
// will) and a control plane machine whose API server uses it as external
// etcd, checks the control plane machine's Node becomes Ready, then renews
// that machine's certificates through its agent (renewWithoutMember).
func TestExternalEtcdMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real etcd and Kubernetes components")
	}
	testkit.RequireBinaries(t, "etcd", "kube")
	h := newHost(t)
	c := newTestCluster(t, h, "ns2", "c2")
	etcdSpec := c.spec("e1", "fd-a")
	cpSpec := c.spec("cp1", "fd-b")

	c.startDoc(etcdSpec, bootstrap.NewEtcdOnly("c2-etcd", c.cas.Etcd, bootstrap.NewMember()))
	health := c.waitHealthy(etcdSpec, time.Minute)
	if len(health.Components) != 1 || health.Node != nil {
		t.Errorf("etcd-only machine health: %+v", health)
	}

	client, err := certs.IssueEtcdClient(c.cas.Etcd, "kube-apiserver-etcd-client", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	doc := bootstrap.NewExternal("c2", c.cas, c.lbAddr, bootstrap.ExternalEtcd{
		Endpoints:  []string{"https://" + etcdSpec.Address + ":2379"},
		CACert:     string(c.cas.Etcd.CertPEM),
		ClientCert: string(client.CertPEM),
		ClientKey:  string(client.KeyPEM),
	})
	c.startDoc(cpSpec, doc)
	if err := h.SetBackends("ns2", "c2", []string{cpSpec.Address + ":6443"}); err != nil {
		t.Fatal(err)
	}
	c.waitNodeReady("cp1", corev1.ConditionTrue, 3*time.Minute)
	hBefore := c.waitHealthy(cpSpec, time.Minute)
	if len(hBefore.Components) != 3 {
		t.Errorf("control plane machine runs %d components, want 3 (no etcd): %+v", len(hBefore.Components), hBefore.Components)
	}
	// No local member: nothing answers on the control plane machine's etcd port.
	if resp, err := http.Get("http://" + cpSpec.Address + ":2381/health"); err == nil {
		resp.Body.Close()
		t.Error("control plane machine with external etcd serves etcd metrics")
	}
	renewWithoutMember(t, h, c, cpSpec, hBefore)
}

// renewWithoutMember renews the certificates of spec, a running control
// plane machine on an external etcd, through its agent's endpoint, as
// qcp-manager does: with a client certificate of the cluster CA named
// agent.ManagerCommonName, a Node's being refused. Every leaf the agent
// issued is renewed, its own serving certificate included; the external
// etcd client pair, which came with the bootstrap data, is not;
// kube-apiserver reloads and the two components whose kubeconfigs embed
// their certificates restart. hBefore is the machine's health before.
func renewWithoutMember(t *testing.T, h *Host, c *testCluster, spec MachineSpec, hBefore agent.Health) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	manager := clusterClientTLS(t, c.cas.Cluster, agent.ManagerCommonName)
	if _, err := agent.GetPKI(ctx, clusterClientTLS(t, c.cas.Cluster, "system:node:"+spec.Name), spec.Address); err == nil {
		t.Error("GET /pki answered a Node's certificate of the cluster CA; want the handshake refused")
	}
	pkiDir := filepath.Join(h.Dir(c.ns, spec.Name), agent.PKIDir)
	report, err := agent.GetPKI(ctx, manager, spec.Address)
	if err != nil {
		t.Fatal(err)
	}
	files := readPKIFiles(t, pkiDir)
	leafFiles := renewableFiles(report)
	want := []string{"agent-serving.crt", "apiserver-kubelet-client.crt", "apiserver.crt", "controller-manager-serving.crt",
		"controller-manager.conf", "front-proxy-client.crt", "scheduler-serving.crt", "scheduler.conf"}
	if !slices.Equal(slices.Sorted(slices.Values(leafFiles)), want) {
		t.Fatalf("renewable files %v; want the %d leaves of a control plane machine without a member %v", leafFiles, len(want), want)
	}
	if got, want := presented(t, spec.Address, agent.EtcdAdminPort, manager), fileCert(t, pkiDir, "agent-serving.crt"); !got.Equal(want) {
		t.Fatalf("the agent endpoint presents serial %x, not agent-serving.crt's %x", got.SerialNumber, want.SerialNumber)
	}

	res, _, answered := c.renew(ctx, manager, spec.Address, report)

	// Every leaf is later; nothing else changed, the external etcd client
	// pair (apiserver-etcd-client.*) included.
	after := readPKIFiles(t, pkiDir)
	for name, old := range files {
		if changed, wantChanged := !bytes.Equal(after[name], old), slices.Contains(leafFiles, name); changed != wantChanged {
			t.Errorf("%s changed %v, want %v (keys, CAs, sa.* and the external etcd client pair stay)", name, changed, wantChanged)
		}
	}
	for _, name := range leafFiles {
		was, now := parseLeaf(t, name, files[name]), parseLeaf(t, name, after[name])
		if !now.NotAfter.After(was.NotAfter) {
			t.Errorf("%s: valid until %v after the renewal, was %v; want later", name, now.NotAfter, was.NotAfter)
		}
	}
	for _, name := range []string{"apiserver-etcd-client.crt", "memory:etcd-client"} {
		was, _ := report.Find(name)
		now, ok := res.Report.Find(name)
		if !ok || now.Renewable || now.SerialNumber != was.SerialNumber {
			t.Errorf("%s: %+v after the renewal, was %+v; want the external pair, unchanged and not renewable", name, now, was)
		}
	}

	// The agent endpoint serves its renewed certificate at once,
	// kube-apiserver within about a minute (it polls the file).
	if got, want := presented(t, spec.Address, agent.EtcdAdminPort, manager), fileCert(t, pkiDir, "agent-serving.crt"); !got.Equal(want) {
		t.Errorf("the agent endpoint presents serial %x after the renewal, not the renewed agent-serving.crt's %x", got.SerialNumber, want.SerialNumber)
	}
	c.waitAPIServerPresents(spec.Address, pkiDir)
	t.Logf("kube-apiserver presented its renewed serving certificate %v after the renewal answered", time.Since(answered).Round(time.Second))

	checkRestarted(t, hBefore, c.waitHealthy(spec, time.Minute), "client certificate was renewed", map[bootstrap.Component]bool{
		bootstrap.KubeAPIServer: false, bootstrap.KubeControllerManager: true, bootstrap.KubeScheduler: true,
	})
	writeConfigMap(t, c, "after-renewal")
}

// clusterClientTLS trusts the cluster CA and presents a client certificate
// of it named cn.
func clusterClientTLS(t *testing.T, clusterCA *certs.KeyPair, cn string) *tls.Config {
	t.Helper()
	kp, err := clusterCA.Issue(certs.Request{CommonName: cn, Usages: certs.ClientUsage}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: pool(t, clusterCA.CertPEM), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// TestEtcdEndpointFollowsMembership runs a control plane machine whose API
// server uses an etcd cluster through qcp-agent's local etcd endpoint
// (followMembership), then replaces the only etcd member it was created
// with: a second member joins as a learner and is promoted, leadership
// moves to it, and the first is removed and its machine stopped. The API
// server must keep serving writes without being restarted or reconfigured:
// the same kube-apiserver process, with the same --etcd-servers.
func TestEtcdEndpointFollowsMembership(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real etcd and Kubernetes components")
	}
	testkit.RequireBinaries(t, "etcd", "kube")
	h := newHost(t)
	c := newTestCluster(t, h, "ns3", "c3")
	e1, e2, cp := c.spec("e1", "fd-a"), c.spec("e2", "fd-b"), c.spec("cp1", "fd-c")
	url := func(s MachineSpec) string { return "https://" + s.Address + ":2379" }
	startEtcd := func(spec MachineSpec, local bootstrap.LocalEtcd) {
		c.startDoc(spec, bootstrap.NewEtcdOnly("c3-etcd", c.cas.Etcd, local))
		c.waitHealthy(spec, 2*time.Minute)
	}
	startEtcd(e1, bootstrap.NewMember())

	client, err := certs.IssueEtcdClient(c.cas.Etcd, "kube-apiserver-etcd-client", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c.startDoc(cp, bootstrap.NewExternal("c3", c.cas, c.lbAddr, bootstrap.ExternalEtcd{
		Endpoints: []string{url(e1)}, FollowMembership: true,
		CACert: string(c.cas.Etcd.CertPEM), ClientCert: string(client.CertPEM), ClientKey: string(client.KeyPEM),
	}))
	if err := h.SetBackends("ns3", "c3", []string{cp.Address + ":6443"}); err != nil {
		t.Fatal(err)
	}
	c.waitNodeReady("cp1", corev1.ConditionTrue, 3*time.Minute)
	before := apiserverProc(t, h, cp)
	if !strings.Contains(before.Cmdline, "--etcd-servers=https://127.0.0.1:") || strings.Contains(before.Cmdline, e1.Address) {
		t.Fatalf("kube-apiserver is not pointed at the local etcd endpoint alone: %s", before.Cmdline)
	}
	writeConfigMap(t, c, "before")

	// Replace e1 by e2, as the EtcdCluster controller does.
	mgr, err := certs.IssueEtcdClient(c.cas.Etcd, "qcp-manager", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cli, err := etcd.New(etcd.Config{Endpoints: []string{url(e1)}, CAPEM: c.cas.Etcd.CertPEM, CertPEM: mgr.CertPEM, KeyPEM: mgr.KeyPEM})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	learner, _, err := cli.AddLearner(ctx, "https://"+e2.Address+":2380")
	if err != nil {
		t.Fatal(err)
	}
	startEtcd(e2, bootstrap.JoinMember(url(e1)))
	c.eventually("e2 promoted", 2*time.Minute, func() error { return cli.Promote(ctx, learner.ID) })
	c.eventually("leadership moved to e2", time.Minute, func() error { return cli.MoveLeader(ctx, learner.ID) })
	members, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cli.SetEndpoints(url(e2))
	for _, m := range members {
		if m.ID != learner.ID {
			c.eventually("e1 removed", time.Minute, func() error { return cli.Remove(ctx, m.ID) })
		}
	}
	if err := h.Stop("ns3", "e1"); err != nil {
		t.Fatal(err)
	}
	c.eventually("a write through the API server once e1 is gone", 2*time.Minute, func() error {
		return tryConfigMap(c, "after")
	})
	after := apiserverProc(t, h, cp)
	if after.PID != before.PID || after.Cmdline != before.Cmdline {
		t.Errorf("kube-apiserver was restarted or reconfigured: pid %d → %d, command line\n%s\n→\n%s", before.PID, after.PID, before.Cmdline, after.Cmdline)
	}
}

// apiserverProc finds the kube-apiserver process of machine spec.
func apiserverProc(t *testing.T, h *Host, spec MachineSpec) Proc {
	t.Helper()
	procs, err := h.Processes(spec.Namespace, spec.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if processName(p.Cmdline) == "kube-apiserver" {
			return p
		}
	}
	t.Fatalf("machine %s runs no kube-apiserver: %+v", spec.Name, procs)
	return Proc{}
}

func writeConfigMap(t *testing.T, c *testCluster, name string) {
	t.Helper()
	if err := tryConfigMap(c, name); err != nil {
		t.Fatal(err)
	}
}

func tryConfigMap(c *testCluster, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault}}
	_, err := c.kube.CoreV1().ConfigMaps(metav1.NamespaceDefault).Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // an earlier attempt's answer was lost, not its write
	}
	return err
}
