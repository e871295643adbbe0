package machinehost

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// testCluster is one workload cluster of process machines for a test.
type testCluster struct {
	t       testing.TB
	h       *Host
	ns, cl  string
	lbAddr  string
	cas     *certs.ClusterCAs
	kube    kubernetes.Interface
	started []string
}

// newTestCluster starts the cluster's load balancer on an address reserved
// for t.
func newTestCluster(t testing.TB, h *Host, ns, cluster string) *testCluster {
	t.Helper()
	return newTestClusterAt(t, h, ns, cluster, testkit.ReserveAddress(t)+":6443")
}

// newTestClusterAt is newTestCluster with the load balancer on lbAddr.
func newTestClusterAt(t testing.TB, h *Host, ns, cluster, lbAddr string) *testCluster {
	t.Helper()
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c := &testCluster{t: t, h: h, ns: ns, cl: cluster, lbAddr: lbAddr, cas: cas}
	// Registered first so it runs last: every process stops even when the
	// test fails half-way.
	t.Cleanup(func() {
		c.checkNoRaces()
		for _, m := range c.started {
			if err := h.Stop(ns, m); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if err := h.StopLB(ns, cluster); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := h.StartLB(ns, cluster, lbAddr, cas.Cluster.CertPEM); err != nil {
		t.Fatal(err)
	}
	c.kube = c.client("https://" + lbAddr)
	return c
}

// client is an admin client of the cluster through server (the load
// balancer or one machine's API server).
func (c *testCluster) client(server string) kubernetes.Interface {
	c.t.Helper()
	return testkit.AdminClient(c.t, c.cl, server, c.cas.Cluster, nil)
}

// spec is machine name's spec in failure domain fd, at an address
// reserved for the test.
func (c *testCluster) spec(name, fd string) MachineSpec {
	c.t.Helper()
	return MachineSpec{Name: name, Namespace: c.ns, Cluster: c.cl, Address: testkit.ReserveAddress(c.t), ProviderID: "process://" + c.ns + "/" + name, FailureDomain: fd}
}

// start starts a machine and adds its API server to the load balancer.
func (c *testCluster) start(spec MachineSpec, etcd bootstrap.LocalEtcd, backends []string) {
	c.t.Helper()
	c.startDoc(spec, bootstrap.NewStacked(c.cl, c.cas, c.lbAddr, etcd))
	if err := c.h.SetBackends(c.ns, c.cl, backends); err != nil {
		c.t.Fatal(err)
	}
}

// startDoc starts machine spec from bootstrap document doc; the cleanup
// stops it.
func (c *testCluster) startDoc(spec MachineSpec, doc *bootstrap.Document) {
	c.t.Helper()
	data, err := bootstrap.Marshal(doc)
	if err != nil {
		c.t.Fatal(err)
	}
	c.started = append(c.started, spec.Name)
	if err := c.h.Start(spec, data); err != nil {
		c.t.Fatal(err)
	}
}

// eventually polls cond every 500ms until it returns nil or timeout
// passes; then it prints the machines' logs and fails the test.
func (c *testCluster) eventually(what string, timeout time.Duration, cond func() error) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := testkit.Eventually(ctx, 500*time.Millisecond, what, func(context.Context) error { return cond() }); err != nil {
		c.dumpLogs()
		c.t.Fatal(err)
	}
}

// checkNoRaces fails the test if a race-enabled agent reported a race.
func (c *testCluster) checkNoRaces() {
	for _, m := range c.started {
		data, _ := os.ReadFile(filepath.Join(c.h.Dir(c.ns, m), "agent.log"))
		if strings.Contains(string(data), "DATA RACE") {
			c.t.Errorf("qcp-agent of %s reported a data race:\n%s", m, data)
		}
	}
}

// dumpLogs prints the tail of each machine's logs, to explain a timeout.
func (c *testCluster) dumpLogs() {
	for _, m := range c.started {
		dir := c.h.Dir(c.ns, m)
		files, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
		files = append(files, filepath.Join(dir, "agent.log"))
		for _, f := range files {
			data, _ := os.ReadFile(f)
			if len(data) > 3000 {
				data = data[len(data)-3000:]
			}
			c.t.Logf("==== %s\n%s", f, data)
		}
	}
}

func (c *testCluster) nodeCondition(name string) (corev1.ConditionStatus, *corev1.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	node, err := c.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", nil, err
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status, node, nil
		}
	}
	return "", node, nil
}

func (c *testCluster) waitNodeReady(name string, want corev1.ConditionStatus, timeout time.Duration) *corev1.Node {
	c.t.Helper()
	var node *corev1.Node
	c.eventually(fmt.Sprintf("node %s Ready=%s through the load balancer", name, want), timeout, func() error {
		got, n, err := c.nodeCondition(name)
		if err != nil {
			return err
		}
		if (want == corev1.ConditionTrue) != (got == corev1.ConditionTrue) {
			return fmt.Errorf("Ready=%q", got)
		}
		if want == corev1.ConditionTrue {
			if err := componentsHealthy(n); err != nil {
				return err
			}
		}
		node = n
		return nil
	})
	return node
}

// componentsHealthy checks the agent's per-component conditions on a Ready
// node: every machine here runs kube-apiserver, and each condition the
// agent set must be True.
func componentsHealthy(n *corev1.Node) error {
	seen := map[corev1.NodeConditionType]bool{}
	for _, cond := range n.Status.Conditions {
		seen[cond.Type] = true
		if agent.IsComponentCondition(cond.Type) && cond.Status != corev1.ConditionTrue {
			return fmt.Errorf("%s=%s: %s", cond.Type, cond.Status, cond.Message)
		}
	}
	if !seen[agent.ComponentConditionTypes[bootstrap.KubeAPIServer]] {
		return fmt.Errorf("no %s condition", agent.ComponentConditionTypes[bootstrap.KubeAPIServer])
	}
	return nil
}

// etcdClient is a client of the machines' etcd through internal/etcd, the
// one package that talks to etcd, with a client certificate from the etcd CA.
func (c *testCluster) etcdClient(endpoints ...string) *etcd.Client {
	c.t.Helper()
	kp, err := certs.IssueEtcdClient(c.cas.Etcd, "test", time.Now())
	if err != nil {
		c.t.Fatal(err)
	}
	cli, err := etcd.New(etcd.Config{Endpoints: endpoints, CAPEM: c.cas.Etcd.CertPEM, CertPEM: kp.CertPEM, KeyPEM: kp.KeyPEM})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// join adds the machine as a learner, starts it, and promotes it once it
// has caught up: what the control plane controller will do.
func (c *testCluster) join(cli *etcd.Client, spec MachineSpec, existing, backends []string) {
	c.t.Helper()
	learner := c.addLearner(cli, spec)
	c.start(spec, bootstrap.JoinMember(existing...), backends)
	c.promote(cli, spec, learner)
}

func peerURL(spec MachineSpec) string   { return "https://" + spec.Address + ":2380" }
func clientURL(spec MachineSpec) string { return "https://" + spec.Address + ":2379" }

func (c *testCluster) addLearner(cli *etcd.Client, spec MachineSpec) etcd.Member {
	c.t.Helper()
	var learner etcd.Member
	// etcd refuses membership changes until every voter has been connected
	// for a few seconds ("unhealthy cluster"), e.g. right after a promotion.
	c.eventually("etcd to accept "+spec.Name+" as a learner", time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		learner, _, err = cli.AddLearner(ctx, peerURL(spec))
		return err
	})
	return learner
}

// promote retries until etcd accepts the promotion, which it does once the
// learner has caught up with the leader.
func (c *testCluster) promote(cli *etcd.Client, spec MachineSpec, learner etcd.Member) {
	c.t.Helper()
	c.eventually("learner "+spec.Name+" to be promoted", 2*time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return cli.Promote(ctx, learner.ID)
	})
}

// member returns spec's etcd member, found by its peer URL.
func (c *testCluster) member(cli *etcd.Client, spec MachineSpec) (etcd.Member, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	members, err := cli.Members(ctx)
	if err != nil {
		return etcd.Member{}, false, err
	}
	for _, m := range members {
		if slices.Contains(m.PeerURLs, peerURL(spec)) {
			return m, true, nil
		}
	}
	return etcd.Member{}, false, nil
}

// health reads the machine's health endpoint.
func health(spec MachineSpec) (agent.Health, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return agent.ReadHealth(ctx, spec.Address)
}

// waitHealthy waits until the machine's health endpoint reports every
// component running and passing its probe.
func (c *testCluster) waitHealthy(spec MachineSpec, timeout time.Duration) agent.Health {
	c.t.Helper()
	var h agent.Health
	c.eventually("machine "+spec.Name+" healthy on its health endpoint", timeout, func() error {
		var err error
		if h, err = health(spec); err != nil {
			return err
		}
		if !h.Healthy {
			return fmt.Errorf("unhealthy: components %+v probes %+v", h.Components, h.Probes)
		}
		return nil
	})
	return h
}

func (c *testCluster) pids() map[string]int {
	out := map[string]int{}
	for _, m := range c.started {
		st, err := c.h.Status(c.ns, m)
		if err != nil {
			c.t.Fatal(err)
		}
		out[m] = st.PID
	}
	return out
}

func (c *testCluster) listNodes() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	return err
}
