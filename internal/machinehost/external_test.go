package machinehost

import (
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
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

	etcdData, err := bootstrap.Marshal(bootstrap.NewEtcdOnly("c2-etcd", c.cas.Etcd, bootstrap.NewMember()))
	if err != nil {
		t.Fatal(err)
	}
	c.started = append(c.started, etcdSpec.Name)
	if err := h.Start(etcdSpec, etcdData); err != nil {
		t.Fatal(err)
	}
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
	data, err := bootstrap.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	c.started = append(c.started, cpSpec.Name)
	if err := h.Start(cpSpec, data); err != nil {
		t.Fatal(err)
	}
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
