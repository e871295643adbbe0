package machinehost

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/hostnet"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestMachinesInNamespaces: on a Network, each machine and the load
// balancer is a host of its own (its own network namespace on the bridge,
// its hostname its name, so each API server has an identity lease of its
// own); a machine cut off from its peers loses its leader while the host
// still reaches it, and rejoins once healed; stopping leaves no namespace
// or link behind.
func TestMachinesInNamespaces(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real etcd and Kubernetes components")
	}
	testkit.RequireBinaries(t, "etcd", "kube")
	if err := hostnet.Available(); err != nil {
		t.Skipf("network namespaces cannot be made here: %v", err)
	}
	id := rand.IntN(1 << 16)
	network := &hostnet.Network{Bridge: fmt.Sprintf("qcpm%x", id), Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(id >> 8), 0}), 24)}
	if err := network.Ensure(); err != nil {
		t.Fatal(err)
	}
	// Registered first, so that it runs after the machines have stopped.
	t.Cleanup(func() {
		if err := network.Remove(); err != nil {
			t.Error(err)
		}
	})
	h := newHost(t)
	h.Network = network
	addr := network.HostAddr()
	next := func() string { addr = addr.Next(); return addr.String() }
	// Registered before the cluster, so that it runs after the cluster's
	// cleanup has stopped every machine.
	keys := []string{machineKey("ns1", "m1"), machineKey("ns1", "m2"), machineKey("ns1", "m3"), lbKey("ns1", "c1")}
	t.Cleanup(func() {
		for _, key := range keys {
			ns, hostIf := NamespaceOf(key)
			if _, err := os.Stat("/run/netns/" + ns); err == nil {
				t.Errorf("the namespace of %s (%s) is left behind", key, ns)
			}
			if exec.Command("ip", "link", "show", "dev", hostIf).Run() == nil {
				t.Errorf("the link of %s (%s) is left behind", key, hostIf)
			}
		}
	})

	c := newTestClusterAt(t, h, "ns1", "c1", next()+":6443")
	spec := func(name, fd string) MachineSpec {
		return MachineSpec{Name: name, Namespace: "ns1", Cluster: "c1", Address: next(), ProviderID: "process://ns1/" + name, FailureDomain: fd}
	}
	m1, m2, m3 := spec("m1", "fd-a"), spec("m2", "fd-b"), spec("m3", "fd-c")
	backends := []string{m1.Address + ":6443", m2.Address + ":6443", m3.Address + ":6443"}
	c.start(m1, bootstrap.NewMember(), backends[:1])
	c.waitNodeReady("m1", "True", 3*time.Minute)
	cli := c.etcdClient(clientURL(m1))
	c.join(cli, m2, []string{clientURL(m1)}, backends[:2])
	c.join(cli, m3, []string{clientURL(m1), clientURL(m2)}, backends)
	for _, m := range []MachineSpec{m2, m3} {
		c.waitNodeReady(m.Name, "True", 3*time.Minute)
	}

	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []MachineSpec{m1, m2, m3} {
		st, err := h.Status("ns1", m.Name)
		if err != nil || !st.Running {
			t.Fatalf("machine %s: %+v, %v", m.Name, st, err)
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", st.PID)); err != nil || ns == self {
			t.Errorf("machine %s runs in network namespace %s (%v); the host's is %s", m.Name, ns, err, self)
		}
		out, err := exec.Command("nsenter", "--target", fmt.Sprint(st.PID), "--uts", "hostname").Output()
		if got := strings.TrimSpace(string(out)); err != nil || got != m.Name {
			t.Errorf("machine %s's hostname %q (%v), want its name", m.Name, got, err)
		}
	}
	c.eventually("an identity lease per API server", time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		leases, err := c.kube.CoordinationV1().Leases("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "apiserver.kubernetes.io/identity=kube-apiserver"})
		if err != nil {
			return err
		}
		if len(leases.Items) != 3 {
			return fmt.Errorf("%d identity leases, want one per API server", len(leases.Items))
		}
		return nil
	})

	// m3 cut off from both peers, the host not: m3 loses its leader and
	// still answers the host.
	ns3, _ := NamespaceOf(machineKey("ns1", "m3"))
	for _, peer := range []MachineSpec{m1, m2} {
		if err := hostnet.Cut(ns3, netip.MustParseAddr(peer.Address), hostnet.Both); err != nil {
			t.Fatal(err)
		}
	}
	leader := func(m MachineSpec) (uint64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, err := cli.Status(ctx, clientURL(m))
		return st.Leader, err
	}
	c.eventually("m3 without a leader, cut off from its peers", time.Minute, func() error {
		if l, err := leader(m3); err != nil || l != 0 {
			return fmt.Errorf("m3 follows %x (%v)", l, err)
		}
		return nil
	})
	if l, err := leader(m1); err != nil || l == 0 {
		t.Errorf("m1 lost its leader too: %x, %v", l, err)
	}
	// A client of all three, the cut-off m3 first, still reads the
	// membership every time, from the majority, and sees m3 unhealthy: a
	// leaderless member refuses the reads at once instead of holding them.
	all := c.etcdClient(clientURL(m3), clientURL(m1), clientURL(m2))
	for i := range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), etcd.ObserveTimeout)
		members, err := all.ObserveMembers(ctx)
		cancel()
		if err != nil {
			t.Fatalf("observing the membership with m3 cut off (read %d): %v", i+1, err)
		}
		for _, mb := range members {
			if healthy := mb.Name != "m3"; mb.Healthy != healthy || len(members) != 3 {
				t.Fatalf("read %d: %d members, %s healthy=%t; want 3, only m3 unhealthy", i+1, len(members), mb.Name, mb.Healthy)
			}
		}
	}
	if _, err := health(m3); err != nil {
		t.Errorf("the host no longer reaches m3's agent: %v", err)
	}
	for _, peer := range []MachineSpec{m1, m2} {
		if err := hostnet.Heal(ns3, netip.MustParseAddr(peer.Address)); err != nil {
			t.Fatal(err)
		}
	}
	c.eventually("m3 following a leader again, healed", 2*time.Minute, func() error {
		l, err := leader(m3)
		if err == nil && l == 0 {
			err = errors.New("no leader")
		}
		return err
	})
}
