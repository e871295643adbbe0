package machinehost

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// These are TestProcessMachines' checks of what the agent does on a real
// machine: they share its cluster, as each machine is expensive.

// joinBeforeAdded starts spec with join data before its etcd member exists.
// Its agent must start nothing until the member is added, then run etcd as
// a learner but not kube-apiserver, which a learner would crash-loop, and
// start kube-apiserver only once the member is promoted.
func joinBeforeAdded(t *testing.T, c *testCluster, cli *etcd.Client, spec MachineSpec, existing, backends []string) {
	c.start(spec, bootstrap.JoinMember(existing...), backends)
	c.eventually(spec.Name+"'s agent to wait for its etcd member to be added", time.Minute, func() error {
		h, err := health(spec)
		if err != nil {
			return err
		}
		notStarted(t, spec, h, bootstrap.Etcd, agent.EtcdPeerPort, "its etcd member was added")
		if w := h.Components[bootstrap.Etcd].Waiting; !strings.Contains(w, peerURL(spec)) {
			return fmt.Errorf("etcd waits for %q", w)
		}
		return nil
	})
	if m, found, err := c.member(cli, spec); err != nil || found {
		t.Fatalf("member of %s before the test added it: %v (%v); the agent must never add itself", spec.Name, m, err)
	}

	learner := c.addLearner(cli, spec)
	c.eventually(spec.Name+" to join as a learner while its kube-apiserver waits for the promotion", 2*time.Minute, func() error {
		h, err := health(spec)
		if err != nil {
			return err
		}
		notStarted(t, spec, h, bootstrap.KubeAPIServer, agent.APIServerPort, "its etcd member was promoted")
		m, _, err := c.member(cli, spec)
		if err != nil {
			return err
		}
		if !m.Started() || !m.IsLearner {
			return fmt.Errorf("member %v: started %v, learner %v", m, m.Started(), m.IsLearner)
		}
		if w := h.Components[bootstrap.KubeAPIServer].Waiting; !strings.Contains(w, "promoted") {
			return fmt.Errorf("kube-apiserver waits for %q", w)
		}
		return nil
	})

	c.promote(cli, spec, learner)
	c.eventually(spec.Name+"'s kube-apiserver to start once its member votes", time.Minute, func() error {
		h, err := health(spec)
		if err != nil {
			return err
		}
		if st := h.Components[bootstrap.KubeAPIServer]; !st.Running {
			return fmt.Errorf("kube-apiserver %+v", st)
		}
		return nil
	})
}

// notStarted fails t if the agent reports component comp as ever started,
// or something listens on its port, before what the agent must wait for.
func notStarted(t *testing.T, spec MachineSpec, h agent.Health, comp bootstrap.Component, port int, before string) {
	t.Helper()
	if st := h.Components[comp]; st.Running || !st.StartedAt.IsZero() || st.Restarts > 0 {
		t.Fatalf("%s of %s started before %s: %+v", comp, spec.Name, before, st)
	}
	addr := net.JoinHostPort(spec.Address, strconv.Itoa(port))
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatalf("something listens on %s, %s's %s port, before %s", addr, spec.Name, comp, before)
	}
}

// nodeRegisteredAgain deletes spec's Node: the agent must register it
// again, as kubelet does, with its provider ID and labels, and keep it Ready.
func nodeRegisteredAgain(t *testing.T, c *testCluster, spec MachineSpec) {
	_, old, err := c.nodeCondition(spec.Name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.kube.CoreV1().Nodes().Delete(ctx, spec.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.eventually("Node "+spec.Name+" to be registered again", time.Minute, func() error {
		_, n, err := c.nodeCondition(spec.Name)
		if err != nil {
			return err
		}
		if n.UID == old.UID {
			return fmt.Errorf("Node %s is still the deleted one (uid %s)", n.Name, n.UID)
		}
		_, cp := n.Labels["node-role.kubernetes.io/control-plane"]
		if n.Spec.ProviderID != spec.ProviderID || n.Labels["topology.kubernetes.io/zone"] != spec.FailureDomain || !cp || !testkit.HasControlPlaneTaint(n) {
			return fmt.Errorf("Node %s registered with providerID %q, labels %v and taints %v", n.Name, n.Spec.ProviderID, n.Labels, n.Spec.Taints)
		}
		return nil
	})
	c.waitNodeReady(spec.Name, corev1.ConditionTrue, time.Minute)
}

// heartbeatsWithoutLB kills the cluster's load balancer: every machine must
// keep renewing its Node's Lease through its own API server, so a
// balancer outage does not make healthy machines look dead. The balancer is
// started again afterwards for the phases after.
func heartbeatsWithoutLB(t *testing.T, c *testCluster, specs ...MachineSpec) {
	lb, err := c.h.LBStatus(c.ns, c.cl)
	if err != nil || !lb.Running {
		t.Fatalf("load balancer not running: %+v (%v)", lb, err)
	}
	if err := syscall.Kill(-lb.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.eventually("the load balancer to stop answering", 10*time.Second, func() error {
		if c.listNodes() == nil {
			return fmt.Errorf("the load balancer at %s still answers", c.lbAddr)
		}
		return nil
	})
	down := time.Now()
	direct := c.client("https://" + net.JoinHostPort(specs[0].Address, strconv.Itoa(agent.APIServerPort)))
	for _, spec := range specs {
		c.eventually("the Lease of "+spec.Name+" to be renewed while the load balancer is down", 30*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l, err := direct.CoordinationV1().Leases("kube-node-lease").Get(ctx, spec.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Spec.RenewTime == nil || l.Spec.RenewTime.Time.Before(down) {
				return fmt.Errorf("Lease %s last renewed at %v, before the load balancer went down at %v", spec.Name, l.Spec.RenewTime, down)
			}
			return nil
		})
	}
	if err := c.h.StartLB(c.ns, c.cl, c.lbAddr, c.cas.Cluster.CertPEM); err != nil {
		t.Fatal(err)
	}
	c.eventually("the load balancer to serve again", 30*time.Second, c.listNodes)
}
