package process_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/cloudinit"
	"github.com/qcp-dev/qcp/internal/controllers/process"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestProcessProvider runs the process provider through CAPI core: one
// stacked machine to Running, two more joining etcd, a frozen machine going
// NotReady and back, a manager restart, the load balancer surviving a
// killed machine, and a Machine deletion leaving nothing behind. The steps
// share one workload cluster because each machine costs about half a GiB.
func TestProcessProvider(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real machines; not run with -short")
	}
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	host := &machinehost.Host{Root: w.host()}
	w.createCluster(ctx)

	// Bad input first: it is cheap and must not disturb what follows.
	w.createMachine(ctx, "bad-data", "fd-a", []byte("{not a bootstrap document"))
	w.createMachine(ctx, "bad-version", "fd-a", w.bootstrapDoc(bootstrap.NewMember(), func(d *bootstrap.Document) {
		d.Versions.Kubernetes = "v1.99.0"
	}))
	w.createMachineFormat(ctx, "unknown-format", "fd-a", "qcp-unknown", w.bootstrapDoc(bootstrap.NewMember()))
	w.createMachineFormat(ctx, "bad-cloud-config", "fd-a", cloudinit.Format, []byte("## template: jinja\n#cloud-config\nwrite_files:\n- path: /etc/x\n  content: [a\nruncmd: []\n"))
	w.createMachine(ctx, "too-small", "fd-a", w.bootstrapDoc(bootstrap.NewMember()))
	w.createMachine(ctx, "m1", "fd-a", w.bootstrapDoc(bootstrap.NewMember()))
	// late-binary waits for an etcd build that is installed only at the end.
	w.createMachine(ctx, "late-binary", "fd-a", w.etcdOnlyDoc("late", func(d *bootstrap.Document) { d.Versions.Etcd = lateEtcdVersion }))

	t.Run("corrupt bootstrap data, an unknown format, malformed cloud-config and a missing binary surface as conditions, and nothing starts", func(t *testing.T) {
		bad := w.waitCondition(ctx, "bad-data", machinehost.ReasonInvalidBootstrapData)
		if !strings.Contains(bad.Message, "bootstrap") || !strings.Contains(bad.Message, "fix") {
			t.Errorf("message %q does not name the cause and the fix", bad.Message)
		}
		for name, says := range map[string]string{"unknown-format": `format "qcp-unknown"`, "bad-cloud-config": "cloud-config line 5"} {
			if c := w.waitCondition(ctx, name, machinehost.ReasonInvalidBootstrapData); !strings.Contains(c.Message, says) {
				t.Errorf("machine %s: message %q does not name the fault (%s)", name, c.Message, says)
			}
		}
		if c := w.waitCondition(ctx, "too-small", machinehost.ReasonInvalidSpec); !strings.Contains(c.Message, "spec.memory") || !strings.Contains(c.Message, "give it 1Gi or more") {
			t.Errorf("machine too-small (spec.memory 64Mi): message %q does not name the field and the fix", c.Message)
		}
		missing := w.waitCondition(ctx, "bad-version", machinehost.ReasonBinaryMissing)
		if !strings.Contains(missing.Message, "v1.99.0") || !strings.Contains(missing.Message, "make binaries") {
			t.Errorf("message %q does not name the missing version and how to build it", missing.Message)
		}
		// CAPI core mirrors the ProcessMachine's Ready condition onto the
		// Machine, so a user reading the Machine sees the cause too.
		w.eventually(ctx, "Machine bad-data InfrastructureReady naming the cause", func(ctx context.Context) error {
			m := &clusterv1.Machine{}
			if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bad-data"}, m); err != nil {
				return err
			}
			c := conditions.Get(m, clusterv1.MachineInfrastructureReadyCondition)
			if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "bootstrap") {
				return fmt.Errorf("InfrastructureReady = %+v", c)
			}
			return nil
		})
		for _, name := range []string{"bad-data", "bad-version", "unknown-format", "bad-cloud-config", "too-small"} {
			if _, err := os.Stat(host.Dir(ns, name)); !os.IsNotExist(err) {
				t.Errorf("machine %s has a directory (%v): it half-started", name, err)
			}
			if st, _ := host.Status(ns, name); st.Running {
				t.Errorf("machine %s runs", name)
			}
		}
	})

	t.Run("a stacked machine reaches Running with a Ready node carrying its zone", func(t *testing.T) {
		w.initializeControlPlane(ctx)
		w.waitRunning(ctx, "m1")
		node := w.waitNodeReady(ctx, "m1", corev1.ConditionTrue)
		if got := node.Labels[corev1.LabelTopologyZone]; got != "fd-a" {
			t.Errorf("zone label = %q, want fd-a", got)
		}
		if node.Spec.ProviderID != "process://default/m1" {
			t.Errorf("providerID = %q", node.Spec.ProviderID)
		}
		pm := w.processMachine(ctx, "m1")
		if pm.Status.FailureDomain != "fd-a" || pm.Spec.ProviderID != node.Spec.ProviderID {
			t.Errorf("ProcessMachine failure domain %q, providerID %q", pm.Status.FailureDomain, pm.Spec.ProviderID)
		}
		// The manager runs with --machine-network=auto, as root, on a
		// loopback --address-range: auto falls back to loopback addresses,
		// and the machine says so and why.
		if c := conditions.Get(pm, process.OwnNetworkCondition); c == nil || c.Status != metav1.ConditionFalse || c.Reason != process.LoopbackAddressReason ||
			!strings.Contains(c.Message, "--address-range="+addressRange+" is a loopback prefix") || !strings.Contains(c.Message, "no partition can cut it off") {
			t.Errorf("OwnNetwork = %+v; want False, %s, naming the loopback --address-range=%s and what it rules out", c, process.LoopbackAddressReason, addressRange)
		}
		// As root the manager gives machines cgroups, and spec.memory sizes them.
		g, ok, err := host.MachineCgroups(ns, "m1")
		if err != nil || !ok {
			t.Fatalf("machine m1 has cgroups: %v (%v); want them, as qcp-manager runs as root", ok, err)
		}
		want := resource.MustParse(machineMemory)
		if limit, err := g.MemoryLimit(); err != nil || limit != want.Value() {
			t.Errorf("machine m1's memory limit %d bytes (%v), want its spec.memory, %s", limit, err, machineMemory)
		}
	})

	addrs := map[string]string{"m1": w.address(ctx, "m1")}
	etcdClient := w.etcdClient(t, addrs["m1"])

	t.Run("two more machines join as learners and are promoted: a 3-member etcd over TLS", func(t *testing.T) {
		// The invariant monitor watches membership while the members join.
		monitor := testkit.StartMonitor(etcdClient, 3, 200*time.Millisecond)
		defer func() {
			monitor.SampleNow(ctx)
			if err := monitor.Stop().Err(); err != nil {
				t.Errorf("membership invariants broken while joining: %v", err)
			}
		}()
		for _, m := range []struct{ name, fd string }{{"m2", "fd-b"}, {"m3", "fd-c"}} {
			w.createMachine(ctx, m.name, m.fd, w.bootstrapDoc(bootstrap.JoinMember("https://"+addrs["m1"]+":2379")))
			addrs[m.name] = w.address(ctx, m.name)
			learner := w.addLearner(ctx, etcdClient, addrs[m.name])
			w.promote(ctx, etcdClient, learner)
			w.waitRunning(ctx, m.name)
			w.waitNodeReady(ctx, m.name, corev1.ConditionTrue)
		}
		// A member's name is listed once it has started and published it,
		// which its Node being Ready does not wait for: the machine's API
		// server also reaches the members that were there before it.
		w.eventually(ctx, "m1, m2 and m3 started voters over TLS", func(ctx context.Context) error {
			members, err := etcdClient.Members(ctx)
			if err != nil {
				return err
			}
			var voters []string
			for _, m := range members {
				if !m.IsLearner && strings.HasPrefix(m.PeerURLs[0], "https://") {
					voters = append(voters, m.Name)
				}
			}
			slices.Sort(voters)
			if strings.Join(voters, ",") != "m1,m2,m3" {
				return fmt.Errorf("voters over TLS = %v, want m1, m2, m3 (members %v)", voters, members)
			}
			return nil
		})
		w.eventually(ctx, "load balancer backends for 3 machines", func(ctx context.Context) error {
			pc := &infrav1.ProcessCluster{}
			if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, pc); err != nil {
				return err
			}
			if len(pc.Status.Backends) != 3 {
				return fmt.Errorf("backends %v", pc.Status.Backends)
			}
			return nil
		})
	})

	t.Run("a frozen machine's node goes NotReady through the workload controller manager, and back when thawed", func(t *testing.T) {
		if err := host.Freeze(ns, "m3"); err != nil {
			t.Fatal(err)
		}
		thawed := false
		defer func() {
			if !thawed {
				_ = host.Thaw(ns, "m3")
			}
		}()
		w.waitNodeReady(ctx, "m3", corev1.ConditionUnknown)
		if err := host.Thaw(ns, "m3"); err != nil {
			t.Fatal(err)
		}
		thawed = true
		w.waitNodeReady(ctx, "m3", corev1.ConditionTrue)
	})

	t.Run("restarting qcp-manager leaves machines and the load balancer running and re-attached", func(t *testing.T) {
		before := w.pids(ctx, host)
		if err := w.manager.Stop(); err != nil {
			t.Fatal(err)
		}
		w.startManager()
		// The new manager reconciles every object when it starts and each
		// running machine again every liveness period; over two periods
		// nothing may be started twice or restarted. That it still manages
		// the machines is shown by the next steps: it notices a killed
		// machine and stops a deleted one.
		window := 2*process.LivenessPeriod + 2*time.Second
		deadline := time.Now().Add(window)
		for time.Now().Before(deadline) {
			if after := w.pids(ctx, host); fmt.Sprint(before) != fmt.Sprint(after) {
				t.Fatalf("PIDs changed across a manager restart: before %v, after %v", before, after)
			}
			if agents := len(processesMentioning(t, "qcp-agent run --dir "+w.host()+"/")); agents != 3 {
				t.Fatalf("%d machine agents run, want 3 (no duplicates)", agents)
			}
			if lbs := len(processesMentioning(t, "qcp-agent lb --dir "+w.host()+"/")); lbs != 1 {
				t.Fatalf("%d load balancers run, want 1", lbs)
			}
			time.Sleep(250 * time.Millisecond)
		}
	})

	t.Run("the load balancer keeps serving when a machine is killed", func(t *testing.T) {
		if err := host.Kill(ns, "m1"); err != nil {
			t.Fatal(err)
		}
		wl := w.workload()
		w.eventually(ctx, "listing nodes through the load balancer with m1 dead", func(ctx context.Context) error {
			// Three lists in a row must succeed, not one lucky one.
			for range 3 {
				if _, err := wl.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
		w.waitCondition(ctx, "m1", "AgentExited")
		w.checkStaysDead(ctx, t, host, "m1")
	})

	t.Run("a Machine being deleted leaves the load balancer first; once deleted, every process and its directory are gone", func(t *testing.T) {
		// The deletion removes m2's logs: look for keys in them first.
		w.leaks.Run(ctx, t)
		dir := host.Dir(ns, "m2")
		pid := w.processMachine(ctx, "m2").Status.PID
		if pid <= 0 {
			t.Fatalf("ProcessMachine m2 reports pid %d: nothing to check its processes against", pid)
		}
		// A pre-drain hook holds the deletion, as QCP's does until the
		// machine's etcd member is removed; its API server must leave the
		// load balancer meanwhile, while the machine still runs.
		m2 := &clusterv1.Machine{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "m2"}, m2); err != nil {
			t.Fatal(err)
		}
		hook := clusterv1.PreDrainDeleteHookAnnotationPrefix + "/test"
		hooked := m2.DeepCopy()
		hooked.Annotations = map[string]string{hook: ""}
		if err := w.c.Patch(ctx, hooked, client.MergeFrom(m2)); err != nil {
			t.Fatal(err)
		}
		if err := w.c.Delete(ctx, hooked); err != nil {
			t.Fatal(err)
		}
		backend := net.JoinHostPort(addrs["m2"], strconv.Itoa(process.APIServerPort))
		w.eventually(ctx, "m2 out of the load balancer's backends while its deletion waits", func(ctx context.Context) error {
			pc := &infrav1.ProcessCluster{}
			if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.cluster}, pc); err != nil {
				return err
			}
			if slices.Contains(pc.Status.Backends, backend) {
				return fmt.Errorf("backends %v", pc.Status.Backends)
			}
			return nil
		})
		if pm := w.processMachine(ctx, "m2"); !pm.DeletionTimestamp.IsZero() {
			t.Fatal("ProcessMachine m2 is being deleted: the hook did not hold the Machine, so this step shows nothing")
		}
		held := &clusterv1.Machine{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "m2"}, held); err != nil {
			t.Fatal(err)
		}
		released := held.DeepCopy()
		delete(released.Annotations, hook)
		if err := w.c.Patch(ctx, released, client.MergeFrom(held)); err != nil {
			t.Fatal(err)
		}
		w.eventually(ctx, "ProcessMachine m2 gone", func(ctx context.Context) error {
			err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "m2"}, &infrav1.ProcessMachine{})
			if isNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there (%v)", err)
		})
		if procs, err := machinehost.GroupProcesses(int(pid)); err != nil || len(procs) != 0 {
			t.Errorf("processes of m2 remain: %v (%v)", procs, err)
		}
		if strays := processesMentioning(t, dir); len(strays) != 0 {
			t.Errorf("processes still use m2's directory: %v", strays)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("m2's directory %s remains (%v)", dir, err)
		}
	})

	t.Run("metrics count the killed and the deleted machine and the load balancer's backends", func(t *testing.T) {
		// The manager was restarted before the kill, so its counters start there.
		want := map[string]float64{
			`qcp_process_machine_exits_total{cluster="c1",namespace="default"}`: 1,
			`qcp_process_machine_stops_total{cluster="c1",namespace="default"}`: 1,
			`qcp_process_lb_backends{cluster="c1",namespace="default"}`:         2,
		}
		w.eventually(ctx, "metrics of the kill and the deletion", func(ctx context.Context) error {
			for series, v := range want {
				got, err := testkit.Metric(ctx, w.metrics, series)
				if err != nil {
					return err
				}
				if got != v {
					return fmt.Errorf("%s = %v, want %v", series, got, v)
				}
			}
			return nil
		})
	})

	// Clusters of their own, deleted at the end of their steps; they start
	// no control plane.
	c2, c3 := w.withCluster(t, "c2"), w.withCluster(t, "c3")
	t.Run("a ProcessCluster waits for a Cluster to own it, then for the cluster CA, and says which", func(t *testing.T) {
		c3.t = t
		c3.testClusterWaits(stepContext(ctx, t))
	})
	t.Run("deleting a Cluster stops its load balancer, releases its address and lets the ProcessCluster go", func(t *testing.T) {
		c3.t = t
		c3.testClusterDeletion(stepContext(ctx, t))
	})
	t.Run("a ProcessMachine waits for the cluster's infrastructure, then for its bootstrap data, and says which", func(t *testing.T) {
		c2.t = t
		c2.testMachineWaits(stepContext(ctx, t), "c2-m1")
	})
	t.Run("a paused Cluster's machine is neither started nor stopped, nor its load balancer, until the Cluster resumes", func(t *testing.T) {
		c2.t = t
		c2.testPausedMachine(stepContext(ctx, t), "c2-m1")
	})

	t.Run("a fixed bootstrap Secret and a newly installed binary are picked up without any other change", func(t *testing.T) {
		// bad-data and late-binary failed for reasons only a human fixes.
		// Nothing watches the Secret or the binary directory: the
		// provider's periodic recheck must find the fixes. Etcd-only
		// documents keep the fixed machines out of this cluster's etcd and
		// API servers.
		w.waitCondition(ctx, "late-binary", machinehost.ReasonBinaryMissing)
		secret := &corev1.Secret{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bad-data-bootstrap"}, secret); err != nil {
			t.Fatal(err)
		}
		secret.Data["value"] = w.etcdOnlyDoc("fixed")
		if err := w.c.Update(ctx, secret); err != nil {
			t.Fatal(err)
		}
		pinnedEtcd, err := os.Readlink(filepath.Join(w.machineBins, "etcd-"+binaries.EtcdVersion))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(pinnedEtcd, filepath.Join(w.machineBins, "etcd-"+lateEtcdVersion)); err != nil {
			t.Fatal(err)
		}
		// The recheck runs every 30 s; three minutes leave room for a slow start.
		fixCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		for _, name := range []string{"bad-data", "late-binary"} {
			w.eventually(fixCtx, name+" running after its fix", func(ctx context.Context) error {
				pm := &infrav1.ProcessMachine{}
				if err := w.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pm); err != nil {
					return err
				}
				c := conditions.Get(pm, process.ProcessRunningCondition)
				if c == nil || c.Status != metav1.ConditionTrue {
					return fmt.Errorf("condition %+v", c)
				}
				return nil
			})
			if st, err := host.Status(ns, name); err != nil || !st.Running {
				t.Errorf("host reports %s %+v (%v), want running", name, st, err)
			}
		}
	})

	t.Run("private keys are only in 0600 machine files: never in logs, events or status", func(t *testing.T) {
		w.leaks.Run(ctx, t)
	})
}

// lateEtcdVersion names an etcd build that is not installed until a test
// links it to the pinned one.
const lateEtcdVersion = "v3.99.0"

// etcdOnlyDoc is a bootstrap document for a single-member etcd of its own,
// named after the cluster and suffix: a machine that runs it stays out of
// the cluster's etcd and serves no API server behind its load balancer.
func (w *world) etcdOnlyDoc(suffix string, mutate ...func(*bootstrap.Document)) []byte {
	return w.marshal(bootstrap.NewEtcdOnly(w.cluster+"-"+suffix, w.cas.Etcd, bootstrap.NewMember()), mutate...)
}

// checkStaysDead checks that a machine whose agent died is not restarted:
// over two liveness periods no agent runs in its directory, the host
// reports it stopped, and its condition stays AgentExited.
func (w *world) checkStaysDead(ctx context.Context, t *testing.T, host *machinehost.Host, name string) {
	t.Helper()
	agent := "qcp-agent run --dir " + host.Dir(ns, name)
	for deadline := time.Now().Add(2*process.LivenessPeriod + 2*time.Second); time.Now().Before(deadline); {
		st, err := host.Status(ns, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Running {
			t.Fatalf("machine %s was restarted (agent pid %d)", name, st.PID)
		}
		if procs := processesMentioning(t, agent); len(procs) != 0 {
			t.Fatalf("machine %s was restarted: %v", name, procs)
		}
		if c := conditions.Get(w.processMachine(ctx, name), process.ProcessRunningCondition); c == nil || c.Reason != process.AgentExitedReason {
			t.Fatalf("machine %s condition turned %+v after its agent died", name, c)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// pids returns the agent PID of every running machine and of the load
// balancer, as the host sees them.
func (w *world) pids(ctx context.Context, host *machinehost.Host) map[string]int {
	out := map[string]int{}
	for _, name := range []string{"m1", "m2", "m3"} {
		st, err := host.Status(ns, name)
		if err != nil || !st.Running {
			w.t.Fatalf("machine %s not running (%v)", name, err)
		}
		out[name] = st.PID
	}
	lb, err := host.LBStatus(ns, w.cluster)
	if err != nil || !lb.Running {
		w.t.Fatalf("load balancer not running (%v)", err)
	}
	out["lb"] = lb.PID
	return out
}

func (w *world) etcdClient(t *testing.T, addr string) *etcd.Client {
	kp, err := certs.IssueEtcdClient(w.cas.Etcd, "test-client", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c, err := etcd.New(etcd.Config{
		Endpoints: []string{"https://" + addr + ":2379"}, CAPEM: w.cas.Etcd.CertPEM,
		CertPEM: kp.CertPEM, KeyPEM: kp.KeyPEM, AutoSyncInterval: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// addLearner adds the machine at addr as a learner, retrying what etcd
// refuses only for a while (a cluster that just changed is "unhealthy").
func (w *world) addLearner(ctx context.Context, c *etcd.Client, addr string) uint64 {
	var id uint64
	w.eventually(ctx, "adding learner "+addr, func(ctx context.Context) error {
		m, _, err := c.AddLearner(ctx, "https://"+addr+":2380")
		if err != nil {
			if etcd.IsRetryable(err) {
				return err
			}
			w.t.Fatalf("adding learner %s: %v", addr, err)
		}
		id = m.ID
		return nil
	})
	return id
}

func (w *world) promote(ctx context.Context, c *etcd.Client, id uint64) {
	w.eventually(ctx, fmt.Sprintf("promoting learner %x", id), func(ctx context.Context) error {
		return c.Promote(ctx, id)
	})
}

// processesMentioning lists the live processes whose command line contains s.
func processesMentioning(t *testing.T, s string) []machinehost.Proc {
	t.Helper()
	procs, err := machinehost.ProcessesMatching(s)
	if err != nil {
		t.Fatal(err)
	}
	return procs
}
