package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/cloudinit"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// moveAddressRange is the loopback range of TestMove's machines, which both
// of its management clusters' process providers allocate from.
const moveAddressRange = "127.22.0.0/16"

// TestMove: `clusterctl move` takes two running clusters from one local
// management cluster to a second one on this host, both installed by
// `clusterctl init` from the release, while a writer and the invariant
// monitor run against each one's etcd: a 3-machine stacked control plane,
// and a control plane on a 3-member EtcdCluster, whose etcd-only machines
// registered their Nodes (clusterctl's preflight refuses a Machine without
// one). The target's process provider takes over the running machines: it
// shares the source's machine root and address reservations, as two
// process providers on one host do. With only the process provider running
// on the target (the control plane and EtcdCluster controllers stopped),
// the Machines there already carry the etcd member records that say etcd
// was bootstrapped, the very members etcd lists. Once every controller
// runs: the same Machines, no machine process restarted (the same PIDs),
// the same etcd members, the control planes Available and the EtcdCluster
// ready, and a scale to 5 of each cluster's etcd succeeds. The source keeps
// no object of either cluster, and nothing acknowledged is lost.
func TestMove(t *testing.T) {
	requireShared(t)
	testkit.RequireBinaries(t, "clusterctl")
	parallel(t, 4*time.Minute)
	// The source's manager writes the bootstrap data QCP wrote before
	// cloud-config; the target's, started after the move, is the upgrade.
	from := ownManagement(t, moveAddressRange, []string{"--bootstrap-format=" + bootstrap.Format})
	to := managementWithoutManager(t, from)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	const name = "moved"
	s := newScenario(t, from, name, 3)
	e := newEtcdScenario(t, from, name+"-etcd", 3, 1)
	s.startTraffic(3)
	e.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)
	e.waitEtcdReady(convergeTimeout, 3)
	e.waitExternalAvailable(convergeTimeout, etcdScenarioControlPlane)
	if got := s.waitNodes(); got[bootstrap.Format] != 3 || len(got) != 1 {
		t.Errorf("%s's machines by bootstrap data format: %v; want 3 of the old qcp format", s.name, got)
	}
	oldEtcd := e.waitNodes()
	if want := 3 + etcdScenarioControlPlane; oldEtcd[bootstrap.Format] != want || len(oldEtcd) != 1 {
		t.Errorf("%s's machines by bootstrap data format: %v; want %d of the old qcp format", e.name, oldEtcd, want)
	}
	before := map[*scenario]moveRecord{s: s.moveRecord(ctx), e: e.moveRecord(ctx)}
	t.Logf("before the move: %s; %s", before[s], before[e])

	// The target runs the process provider (and serves QCP's webhooks,
	// which the move's creates need), but no control plane controller.
	to.managerArgs = []string{"--controllers=process"}
	if err := to.startManager(ctx, ""); err != nil {
		t.Fatal(err)
	}
	out := testkit.Clusterctl(t, nil, "move", "--kubeconfig", from.env.Kubeconfig, "--to-kubeconfig", to.env.Kubeconfig, "--namespace", ns)
	t.Logf("clusterctl move:\n%s", out)
	for _, sc := range []*scenario{s, e} {
		sc.checkNothingLeft(ctx, from)
		// From here on the scenario is the target's.
		if err := sc.bound.stop(); err != nil {
			t.Error(err)
		}
		sc.mgmt, sc.c = to, to.fenced(to.env.Client)
		sc.bound = startMachineBound(sc, 3, 1)
		// The fact that etcd was bootstrapped came with the Machines: each
		// carries its member's ID, with no control plane or EtcdCluster
		// controller running on the target to have written it.
		sc.checkMovedRecords(ctx, before[sc])
	}

	if err := to.manager.Stop(); err != nil {
		t.Fatal(err)
	}
	to.managerArgs = nil
	if err := to.startManager(ctx, ""); err != nil {
		t.Fatal(err)
	}
	s.waitAvailable(convergeTimeout, 3)
	e.waitEtcdReady(convergeTimeout, 3)
	e.waitExternalAvailable(convergeTimeout, etcdScenarioControlPlane)
	for _, sc := range []*scenario{s, e} {
		sc.eventually(convergeTimeout, "the moved machines running, with the processes and etcd members they had", func(ctx context.Context) error {
			if after := sc.moveRecord(ctx); after.String() != before[sc].String() {
				return fmt.Errorf("after the move: %s", after)
			}
			return nil
		})
	}

	// The old-format machines kept running across the move and the new
	// manager; a rollout replaces them with cloud-config machines, and new
	// etcd machines join the old ones.
	e.scaleEtcd(ctx, 5)
	s.rollOut(func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Rollout.After = metav1.Now() }, nil)
	s.waitAvailable(convergeTimeout, 3)
	if got := s.waitNodes(); got[cloudinit.Format] != 3 || len(got) != 1 {
		t.Errorf("%s's machines by bootstrap data format after the rollout: %v; want 3 booted from cloud-config", s.name, got)
	}
	e.waitEtcdReady(convergeTimeout, 5)
	if got := e.waitNodes(); got[cloudinit.Format] != 2 || got[bootstrap.Format] != oldEtcd[bootstrap.Format] {
		t.Errorf("%s's machines by bootstrap data format after the scale-up: %v; want the %d old ones and 2 booted from cloud-config", e.name, got, oldEtcd[bootstrap.Format])
	}
	s.finish()
	e.finish()
}

// waitNodes waits until every Machine of the scenario's cluster is linked
// to its Node, which clusterctl move requires, and returns how many
// machines booted from each bootstrap data format. A machine booted from
// cloud-config has no machine.json, and its agent registered its Node
// without a providerID or a zone: QCP gave the Node the Machine's (CAPI
// core links by providerID). One booted from the old qcp format has its
// machine.json. An etcd machine's Node is tainted and labelled as one.
func (s *scenario) waitNodes() map[string]int {
	s.t.Helper()
	host := &machinehost.Host{Root: s.mgmt.machines()}
	var formats map[string]int
	s.eventually(convergeTimeout, "every Machine of the cluster linked to its Node", func(ctx context.Context) error {
		formats = map[string]int{}
		ms, err := s.clusterMachines(ctx)
		if err != nil {
			return err
		}
		wl, err := s.workload(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if !m.Status.NodeRef.IsDefined() {
				return fmt.Errorf("machine %s has no Node yet", m.Name)
			}
			data := &corev1.Secret{}
			if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: ptr.Deref(m.Spec.Bootstrap.DataSecretName, "")}, data); err != nil {
				return err
			}
			format := string(data.Data["format"])
			_, err := os.Stat(filepath.Join(host.Dir(ns, m.Spec.InfrastructureRef.Name), agent.MachineFile))
			if (format == bootstrap.Format) != (err == nil) || format != bootstrap.Format && format != cloudinit.Format {
				return fmt.Errorf("machine %s: bootstrap data of format %q, %s: %v; want cloud-config and none, or qcp and one", m.Name, format, agent.MachineFile, err)
			}
			formats[format]++
			n, err := wl.CoreV1().Nodes().Get(ctx, m.Status.NodeRef.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if n.Spec.ProviderID != m.Spec.ProviderID || n.Labels[engine.ZoneLabel] != m.Spec.FailureDomain {
				return fmt.Errorf("Node %s of machine %s: providerID %q, zone %q; want the Machine's %q and %q", n.Name, m.Name, n.Spec.ProviderID, n.Labels[engine.ZoneLabel], m.Spec.ProviderID, m.Spec.FailureDomain)
			}
			if _, etcdOnly := m.Labels[etcdv1.EtcdClusterNameLabel]; !etcdOnly {
				continue
			}
			etcdTaint := corev1.Taint{Key: agent.EtcdNodeRole, Effect: corev1.TaintEffectNoExecute}
			if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return etcdTaint.MatchTaint(&t) }) {
				return fmt.Errorf("Node %s of etcd machine %s has taints %v, want %s", n.Name, m.Name, n.Spec.Taints, etcdTaint.ToString())
			}
			if _, ok := n.Labels[agent.EtcdNodeRole]; !ok {
				return fmt.Errorf("Node %s of etcd machine %s has labels %v, want %s", n.Name, m.Name, n.Labels, agent.EtcdNodeRole)
			}
		}
		return nil
	})
	return formats
}

// clusterMachines lists every Machine of the scenario's cluster: an
// EtcdCluster's and the control plane's.
func (s *scenario) clusterMachines(ctx context.Context) ([]clusterv1.Machine, error) {
	var list clusterv1.MachineList
	err := s.reader(ctx).List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{clusterv1.ClusterNameLabel: s.name})
	return list.Items, err
}

// checkMovedRecords fails the scenario unless its etcd machines, on the
// management cluster it now reads, carry the member IDs etcd listed before
// the move.
func (s *scenario) checkMovedRecords(ctx context.Context, before moveRecord) {
	s.t.Helper()
	machines, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	recorded := map[string]string{}
	for _, m := range machines {
		recorded[m.Spec.InfrastructureRef.Name] = m.Annotations[engine.MemberIDAnnotation]
	}
	if !maps.Equal(recorded, before.memberIDs) {
		s.t.Errorf("%s: member records on the target before its controllers ran: %v, want %v (etcd's members before the move)", s.name, recorded, before.memberIDs)
	}
}

// managementWithoutManager starts a second management cluster for the
// machines of from, installed like every other from the release, whose
// qcp-manager the caller starts: it keeps its process machines in from's
// machine root and allocates from from's address range, so that it takes
// over the machines a move brings.
func managementWithoutManager(t *testing.T, from *management) *management {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e, err := localenv.Start(ctx, localenv.Options{Repository: repository})
	if err != nil {
		t.Fatal(err)
	}
	m := &management{env: e, binDir: from.binDir, addressRange: from.addressRange, machineRoot: from.env.MachineRoot()}
	t.Cleanup(func() {
		if err := m.refused(); err != nil {
			t.Error(err)
		}
		m.stop()
	})
	return m
}

// moveRecord is what a move must not change: each machine's processes,
// the load balancer's, and the etcd members.
type moveRecord struct {
	// processes are, per machine and for the load balancer ("lb"), the
	// command and PID of every process running from its directory.
	processes map[string][]string
	// memberIDs are etcd's member IDs by member name, which is the
	// process machine's.
	memberIDs map[string]string
}

func (r moveRecord) String() string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(r.processes)) {
		fmt.Fprintf(&b, "%s: member %q, processes %v; ", name, r.memberIDs[name], r.processes[name])
	}
	return b.String()
}

// moveRecord reads the scenario's machines as its management cluster and
// etcd see them now.
func (s *scenario) moveRecord(ctx context.Context) moveRecord {
	s.t.Helper()
	host := &machinehost.Host{Root: s.mgmt.machines()}
	r := moveRecord{processes: map[string][]string{}, memberIDs: map[string]string{}}
	dirs := map[string]string{"lb": host.LBDir(ns, s.name)}
	machines, err := s.clusterMachines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range machines {
		// Keyed by the process machine's name, which names its etcd member.
		dirs[m.Spec.InfrastructureRef.Name] = host.Dir(ns, m.Spec.InfrastructureRef.Name)
	}
	for name, dir := range dirs {
		procs, err := machinehost.ProcessesMatching(dir)
		if err != nil {
			s.t.Fatal(err)
		}
		r.processes[name] = []string{}
		for _, p := range procs {
			if strings.Contains(p.Cmdline+" ", dir+" ") || strings.Contains(p.Cmdline, dir+"/") || strings.Contains(p.Cmdline, dir+"=") {
				r.processes[name] = append(r.processes[name], fmt.Sprintf("%s/%d", p.Comm, p.PID))
			}
		}
		slices.Sort(r.processes[name])
	}
	cli, _, err := s.etcdClient(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	defer cli.Close()
	members, err := cli.Members(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range members {
		r.memberIDs[m.Name] = engine.FormatMemberID(m.ID)
	}
	return r
}

// checkNothingLeft fails the scenario if from keeps any object of its
// cluster: clusterctl move deletes what it moved from the source.
func (s *scenario) checkNothingLeft(ctx context.Context, from *management) {
	s.t.Helper()
	c := from.env.Client
	inCluster := client.MatchingLabels{clusterv1.ClusterNameLabel: s.name}
	for _, list := range []client.ObjectList{&clusterv1.MachineList{}, &infrav1.ProcessMachineList{}, &corev1.SecretList{}} {
		if err := c.List(ctx, list, client.InNamespace(ns), inCluster); err != nil {
			s.t.Fatal(err)
		}
		if n := len(itemsOf(list)); n > 0 {
			s.t.Errorf("the source management cluster keeps %d %T of cluster %s after the move: %v", n, list, s.name, itemsOf(list))
		}
	}
	for _, obj := range []client.Object{
		&clusterv1.Cluster{}, &controlplanev1.QuorumControlPlane{}, &etcdv1.EtcdCluster{}, &infrav1.ProcessCluster{}, &infrav1.ProcessMachineTemplate{},
	} {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, obj); !isNotFound(err) {
			s.t.Errorf("the source management cluster keeps %T %s after the move (%v)", obj, s.name, err)
		}
	}
	var secrets corev1.SecretList
	if err := c.List(ctx, &secrets, client.InNamespace(ns)); err != nil {
		s.t.Fatal(err)
	}
	for _, sec := range secrets.Items {
		if strings.HasPrefix(sec.Name, s.name+"-") {
			s.t.Errorf("the source management cluster keeps Secret %s after the move", sec.Name)
		}
	}
}

// itemsOf names the items of list.
func itemsOf(list client.ObjectList) []string {
	items, _ := meta.ExtractList(list)
	var names []string
	for _, o := range items {
		if obj, err := meta.Accessor(o); err == nil {
			names = append(names, obj.GetName())
		}
	}
	return names
}
