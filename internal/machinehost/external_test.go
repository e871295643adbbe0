package machinehost

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestExternalEtcdMachine runs an etcd-only machine (as an EtcdCluster
// will) and a control plane machine whose API server uses it as external
// etcd, and checks the control plane machine's Node becomes Ready.
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
	if h := c.waitHealthy(cpSpec, time.Minute); len(h.Components) != 3 {
		t.Errorf("control plane machine runs %d components, want 3 (no etcd): %+v", len(h.Components), h.Components)
	}
	// No local member: nothing answers on the control plane machine's etcd port.
	if resp, err := http.Get("http://" + cpSpec.Address + ":2381/health"); err == nil {
		resp.Body.Close()
		t.Error("control plane machine with external etcd serves etcd metrics")
	}
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
