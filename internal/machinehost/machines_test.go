package machinehost

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestProcessMachines walks one cluster through its life: a single stacked
// machine whose Node becomes Ready, re-attach after a "manager restart",
// two learners joining into a 3-member etcd (the second started before its
// member is added), a crashed component, a deleted Node, a load balancer
// outage, freeze and thaw, a killed machine the load balancer routes around,
// and clean stops. The phases share one cluster because each machine costs
// ~600 MB and tens of seconds.
func TestProcessMachines(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real etcd and Kubernetes components")
	}
	testkit.RequireBinaries(t, "etcd", "kube")
	h := newHost(t)
	c := newTestCluster(t, h, "ns1", "c1")
	m1 := c.spec("m1", "fd-a")
	m2 := c.spec("m2", "fd-b")
	m3 := c.spec("m3", "fd-c")
	if h.Cgroups {
		// A VM's size, far above what the machine uses.
		m3.MemoryLimit = 3 << 30
	}
	api := func(specs ...MachineSpec) []string {
		var out []string
		for _, s := range specs {
			out = append(out, s.Address+":6443")
		}
		return out
	}

	start := time.Now()
	c.start(m1, bootstrap.NewMember(), api(m1))
	node := c.waitNodeReady("m1", corev1.ConditionTrue, 3*time.Minute)
	t.Logf("single machine Node Ready after %v", time.Since(start).Round(time.Second))
	if node.Labels["topology.kubernetes.io/zone"] != "fd-a" || node.Spec.ProviderID != "process://ns1/m1" {
		t.Errorf("node labels %v providerID %q", node.Labels, node.Spec.ProviderID)
	}
	c.eventually("control plane label on m1", 30*time.Second, func() error {
		_, n, err := c.nodeCondition("m1")
		if err != nil {
			return err
		}
		if _, ok := n.Labels["node-role.kubernetes.io/control-plane"]; !ok {
			return fmt.Errorf("labels %v", n.Labels)
		}
		if !testkit.HasControlPlaneTaint(n) {
			return fmt.Errorf("taints %v; want node-role.kubernetes.io/control-plane:NoSchedule", n.Spec.Taints)
		}
		return nil
	})
	// etcd keeps the CPU first: every thread of the other components runs
	// at niceness 10, every thread of etcd at the agent's own (0, unless
	// the tests themselves run niced).
	agentSt, err := h.Status("ns1", "m1")
	if err != nil {
		t.Fatal(err)
	}
	agentThreads, err := threadNiceness(agentSt.PID)
	if err != nil {
		t.Fatal(err)
	}
	base := agentThreads[strconv.Itoa(agentSt.PID)]
	want := map[bootstrap.Component]int{bootstrap.Etcd: base, bootstrap.KubeAPIServer: max(base, 10), bootstrap.KubeControllerManager: max(base, 10), bootstrap.KubeScheduler: max(base, 10)}
	hl := c.waitHealthy(m1, time.Minute)
	if hl.FirstHealthy.IsZero() || hl.FirstHealthy.After(time.Now()) {
		t.Errorf("the healthy machine reports first being healthy at %v", hl.FirstHealthy)
	}
	for comp, nice := range want {
		st, ok := hl.Components[comp]
		if !ok || st.PID == 0 {
			t.Fatalf("%s not running: %+v", comp, hl.Components)
		}
		got, err := threadNiceness(st.PID)
		if err != nil {
			t.Fatal(err)
		}
		for tid, n := range got {
			if n != nice {
				t.Errorf("%s (pid %d) thread %s runs at niceness %d, want %d", comp, st.PID, tid, n, nice)
			}
		}
	}
	// The agent keeps one niced thread for each niced component's
	// supervisor, and no other.
	niced := 0
	for _, n := range agentThreads {
		if n != base {
			niced++
		}
	}
	if niced > 3 {
		t.Errorf("%d of the agent's %d threads run niced (%v), want at most the 3 supervisors' own", niced, len(agentThreads), agentThreads)
	}
	if rss, err := h.RSS("ns1", "m1"); err == nil {
		t.Logf("machine m1 resident memory: %d MB", rss>>20)
	}

	t.Run("reattach", func(t *testing.T) {
		before := c.pids()
		lbBefore, _ := h.LBStatus("ns1", "c1")
		fresh := &Host{Root: h.Root, BinDir: h.BinDir, AgentPath: h.AgentPath}
		data, _ := os.ReadFile(fresh.Dir("ns1", "m1") + "/bootstrap-data")
		if err := fresh.Start(m1, data); err != nil {
			t.Fatal(err)
		}
		if err := fresh.StartLB("ns1", "c1", c.lbAddr, c.cas.Cluster.CertPEM); err != nil {
			t.Fatal(err)
		}
		st, _ := fresh.Status("ns1", "m1")
		lbAfter, _ := fresh.LBStatus("ns1", "c1")
		if !st.Running || st.PID != before["m1"] || !lbAfter.Running || lbAfter.PID != lbBefore.PID {
			t.Errorf("after re-attach: machine %+v (was %d), lb %+v (was %d)", st, before["m1"], lbAfter, lbBefore.PID)
		}
		agents := 0
		procs, err := fresh.Processes("ns1", "m1")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			if p.Comm == "qcp-agent" {
				agents++
			}
		}
		if agents != 1 {
			t.Errorf("%d qcp-agent processes in m1's group, want 1: %v", agents, procs)
		}

		// agent.pid naming another process (a duplicate agent that failed
		// on the taken health port left its PID there): Start re-attaches
		// to the running agent instead of launching one more.
		pidPath := fresh.Dir("ns1", "m1") + "/agent.pid"
		if err := os.WriteFile(pidPath, []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
			t.Fatal(err)
		}
		if st, _ := fresh.Status("ns1", "m1"); st.Running {
			t.Fatalf("a foreign PID in agent.pid reads as a running agent: %+v", st)
		}
		if err := fresh.Start(m1, data); err != nil {
			t.Fatal(err)
		}
		if st, _ := fresh.Status("ns1", "m1"); !st.Running || st.PID != before["m1"] {
			t.Errorf("after Start with a stale agent.pid: %+v, want the running agent %d", st, before["m1"])
		}
		if procs, err := ProcessesMatching("--dir " + fresh.Dir("ns1", "m1")); err != nil || len(procs) != 1 {
			t.Errorf("agents of m1: %v (%v), want only %d", procs, err, before["m1"])
		}
	})

	cli := c.etcdClient(clientURL(m1))
	c.join(cli, m2, []string{clientURL(m1)}, api(m1, m2))
	joined := t.Run("a joining machine waits for its member, its API server for the promotion", func(t *testing.T) {
		joinBeforeAdded(t, c, cli, m3, []string{clientURL(m1), clientURL(m2)}, api(m1, m2, m3))
	})
	if !joined {
		t.FailNow() // the rest needs m3
	}
	c.waitNodeReady("m2", corev1.ConditionTrue, 3*time.Minute)
	c.waitNodeReady("m3", corev1.ConditionTrue, 3*time.Minute)
	for _, m := range []MachineSpec{m1, m2, m3} {
		h := c.waitHealthy(m, 3*time.Minute)
		if len(h.Components) != 4 {
			t.Errorf("health of %s reports %d components, want 4: %+v", m.Name, len(h.Components), h.Components)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	members, err := cli.Members(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	voters := 0
	for _, m := range members {
		if !m.IsLearner {
			voters++
		}
	}
	if len(members) != 3 || voters != 3 {
		t.Fatalf("etcd members %v, want 3 voters", members)
	}
	t.Logf("three machines Ready after %v", time.Since(start).Round(time.Second))

	t.Run("a crashed component is restarted", func(t *testing.T) {
		before := c.waitHealthy(m2, time.Minute).Components["kube-scheduler"]
		if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		c.eventually("m2's kube-scheduler to be restarted and healthy", time.Minute, func() error {
			after := c.waitHealthy(m2, time.Minute).Components["kube-scheduler"]
			if after.Restarts != before.Restarts+1 || after.PID == before.PID || after.LastError == "" {
				return fmt.Errorf("scheduler state %+v, before %+v", after, before)
			}
			return nil
		})
	})

	t.Run("a deleted Node is registered again", func(t *testing.T) {
		nodeRegisteredAgain(t, c, m2)
	})

	t.Run("heartbeats go to the local API server while the load balancer is down", func(t *testing.T) {
		heartbeatsWithoutLB(t, c, m1, m2, m3)
	})

	t.Run("freeze makes the node NotReady, thaw Ready", func(t *testing.T) {
		if err := h.Freeze("ns1", "m3"); err != nil {
			t.Fatal(err)
		}
		frozen := time.Now()
		checkFrozenWhole(t, h, "ns1", "m3")
		if g, ok, err := h.MachineCgroups("ns1", "m3"); ok {
			if limit, err := g.MemoryLimit(); err != nil || limit != m3.MemoryLimit {
				t.Errorf("m3's memory limit %d bytes (%v), want its spec's %d", limit, err, m3.MemoryLimit)
			}
		} else if err != nil {
			t.Fatal(err)
		}
		c.waitNodeReady("m3", corev1.ConditionUnknown, 2*time.Minute)
		t.Logf("m3 NotReady %v after freeze", time.Since(frozen).Round(time.Second))
		if err := h.Thaw("ns1", "m3"); err != nil {
			t.Fatal(err)
		}
		c.waitNodeReady("m3", corev1.ConditionTrue, time.Minute)
	})

	t.Run("freezing only etcd fails its probe, the Node stays Ready; thaw heals it", func(t *testing.T) {
		c.waitHealthy(m3, time.Minute)
		if err := h.FreezeProcess("ns1", "m3", "etcd"); err != nil {
			t.Fatal(err)
		}
		// One failed probe of a component that answered is not yet a
		// failure (agent's failureThreshold): a busy host's slow answer.
		c.eventually("m3's agent to see etcd's probe fail while it still counts etcd healthy", time.Minute, func() error {
			hl, err := health(m3)
			if err != nil {
				return err
			}
			pr := hl.Probes[bootstrap.Etcd]
			if pr.Failures == 0 {
				return fmt.Errorf("etcd's probe has not failed yet: %+v", pr)
			}
			if !pr.OK || !hl.Healthy {
				t.Fatalf("etcd reported failing after %d failed probe(s): %+v (machine healthy %v)", pr.Failures, pr, hl.Healthy)
			}
			return nil
		})
		c.eventually("m3's EtcdHealthy False while its Node stays Ready", time.Minute, func() error {
			ready, n, err := c.nodeCondition("m3")
			if err != nil {
				return err
			}
			if ready != corev1.ConditionTrue {
				return fmt.Errorf("Ready=%q: freezing etcd froze more than etcd", ready)
			}
			for _, cond := range n.Status.Conditions {
				if cond.Type == agent.ComponentConditionTypes[bootstrap.Etcd] && cond.Status == corev1.ConditionFalse {
					return nil
				}
			}
			return fmt.Errorf("conditions %+v", n.Status.Conditions)
		})
		if procs, err := h.Processes("ns1", "m3"); err == nil {
			for _, p := range procs {
				if stopped := p.State == "T"; stopped != (processName(p.Cmdline) == "etcd") {
					t.Errorf("process %d (%s) state %s: only etcd should be stopped", p.PID, p.Comm, p.State)
				}
			}
		}
		if err := h.FreezeProcess("ns1", "m3", "etcdctl"); err == nil || !strings.Contains(err.Error(), "runs no etcdctl process") {
			t.Errorf("freezing a process the machine does not run: %v", err)
		}
		if err := h.ThawProcess("ns1", "m3", "etcd"); err != nil {
			t.Fatal(err)
		}
		c.waitNodeReady("m3", corev1.ConditionTrue, time.Minute)
	})

	t.Run("load balancer survives a killed machine", func(t *testing.T) {
		if err := h.Kill("ns1", "m1"); err != nil {
			t.Fatal(err)
		}
		c.eventually("m1's processes to die", 10*time.Second, func() error {
			if procs, err := h.Processes("ns1", "m1"); err != nil || len(procs) > 0 {
				return fmt.Errorf("processes %v (%v)", procs, err)
			}
			return nil
		})
		killed := time.Now()
		c.eventually("the load balancer to serve after m1 was killed", 30*time.Second, c.listNodes)
		t.Logf("load balancer serving %v after the kill", time.Since(killed).Round(time.Millisecond))
		// Every one of several requests must succeed once m1 is out of
		// rotation, not just the lucky one.
		for i := range 10 {
			if err := c.listNodes(); err != nil {
				t.Fatalf("request %d through the load balancer: %v", i, err)
			}
		}
	})

	t.Run("stop leaves nothing behind", func(t *testing.T) {
		c.checkNoRaces()
		// A frozen machine stops too: its processes must be thawed to exit.
		if err := h.Freeze("ns1", "m3"); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"m1", "m2", "m3"} {
			// m1 was killed, but its pid file stays to check against.
			pid, err := readPID(h.Dir("ns1", name))
			if err != nil || pid <= 0 {
				t.Fatalf("pid of %s read as %d (%v): nothing to check its processes against", name, pid, err)
			}
			g, grouped, err := h.MachineCgroups("ns1", name)
			if err != nil || grouped != h.Cgroups {
				t.Fatalf("machine %s has cgroups: %v (%v); want %v", name, grouped, err, h.Cgroups)
			}
			if err := h.Stop("ns1", name); err != nil {
				t.Fatal(err)
			}
			if procs, err := GroupProcesses(pid); err != nil || len(procs) > 0 {
				t.Errorf("stray processes of %s: %v (%v)", name, procs, err)
			}
			if _, err := os.Stat(h.Dir("ns1", name)); !os.IsNotExist(err) {
				t.Errorf("directory of %s remains", name)
			}
			for ctl, dir := range g.Dirs {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("the %s cgroup of %s remains: %s", ctl, name, dir)
				}
			}
		}
		c.started = nil
	})
}

// threadNiceness reads the niceness of each of pid's threads, by thread ID,
// from /proc/<pid>/task/<tid>/stat (field 19).
func threadNiceness(pid int) (map[string]int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, task := range tasks {
		fields, err := testkit.ProcStat(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue // the thread ended
		}
		if len(fields) < 17 {
			return nil, fmt.Errorf("/proc/%d/task/%s/stat: %d fields after the name", pid, task.Name(), len(fields))
		}
		n, err := strconv.Atoi(fields[16])
		if err != nil {
			return nil, err
		}
		out[task.Name()] = n
	}
	return out, nil
}

// checkFrozenWhole checks that every process of frozen machine ns/name
// stopped: all in its cgroups, whose freezer is FROZEN, with a Host that
// gives machines cgroups (every process then sleeps uninterruptibly, D), or
// stopped by SIGSTOP (T) without.
func checkFrozenWhole(t *testing.T, h *Host, ns, name string) {
	t.Helper()
	procs, err := h.Processes(ns, name)
	if err != nil || len(procs) < 5 {
		t.Fatalf("machine %s/%s processes %v (%v): want the agent, etcd and three Kubernetes components", ns, name, procs, err)
	}
	g, grouped, err := h.MachineCgroups(ns, name)
	if err != nil || grouped != h.Cgroups {
		t.Fatalf("machine %s/%s has cgroups: %v (%v); want %v, as its Host gives them", ns, name, grouped, err, h.Cgroups)
	}
	want := "T"
	if grouped {
		want = "D"
		if frozen, err := g.Frozen(); err != nil || !frozen {
			t.Errorf("machine %s/%s freezer frozen: %v (%v), want true", ns, name, frozen, err)
		}
		inGroup, err := g.Procs()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			if !slices.Contains(inGroup, p.PID) {
				t.Errorf("process %d (%s) of machine %s/%s is not in its freezer cgroup %v", p.PID, p.Comm, ns, name, inGroup)
			}
			if held, err := g.Holds(p.PID); err != nil || !held {
				t.Errorf("process %d (%s) of machine %s/%s is not in all of its cgroups (%v)", p.PID, p.Comm, ns, name, err)
			}
		}
	}
	for _, p := range procs {
		if now, err := readProc(p.PID); err != nil || now.State != want {
			t.Errorf("process %d (%s) of frozen machine %s/%s is in state %q (%v), want %s", p.PID, p.Comm, ns, name, now.State, err, want)
		}
	}
}
