package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// newEtcdScenario creates a Cluster named name with a ProcessCluster (three
// failure domains), a ProcessMachineTemplate and an EtcdCluster of
// replicas members, and registers the end-of-scenario checks on the
// EtcdCluster's machines, which may never be more than replicas + surge.
func newEtcdScenario(t testing.TB, mgmt *management, name string, replicas int32, surge int, edits ...func(*etcdv1.EtcdCluster)) *scenario {
	t.Helper()
	testkit.RequireBinaries(t, "etcd", "kube", "capi-manager")
	s := &scenario{t: t, mgmt: mgmt, c: mgmt.env.Client, name: name,
		selector: client.MatchingLabels{clusterv1.ClusterNameLabel: name, etcdv1.EtcdClusterNameLabel: name}}
	ec := &etcdv1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{clusterv1.ClusterNameLabel: name}},
		Spec: etcdv1.EtcdClusterSpec{
			Replicas: ptr.To(replicas), Version: "v3.6.16",
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachineTemplate", Name: name},
		},
	}
	for _, edit := range edits {
		edit(ec)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.create(ctx,
		&infrav1.ProcessCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: infrav1.ProcessClusterSpec{FailureDomains: failureDomains}},
		&infrav1.ProcessMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
		&clusterv1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: clusterv1.ClusterSpec{InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessCluster", Name: name,
			}},
		},
		ec,
	)
	s.bound = startMachineBound(s, int(replicas), surge)
	t.Cleanup(s.dumpOnFailure)
	return s
}

// etcdCluster reads the scenario's EtcdCluster.
func (s *scenario) etcdCluster(ctx context.Context) (*etcdv1.EtcdCluster, error) {
	ec := &etcdv1.EtcdCluster{}
	return ec, s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, ec)
}

// waitEtcdReady waits until the EtcdCluster is ready with replicas healthy
// voters on as many machines, its endpoints listing each, and returns it.
func (s *scenario) waitEtcdReady(timeout time.Duration, replicas int) *etcdv1.EtcdCluster {
	s.t.Helper()
	var ec *etcdv1.EtcdCluster
	s.eventually(timeout, fmt.Sprintf("EtcdCluster %s ready with %d healthy voters", s.name, replicas), func(ctx context.Context) error {
		var err error
		if ec, err = s.etcdCluster(ctx); err != nil {
			return err
		}
		last := ec.Status.LastOperation
		if ec.Status.ObservedGeneration < ec.Generation {
			return fmt.Errorf("status is of generation %d, the spec's is %d", ec.Status.ObservedGeneration, ec.Generation)
		}
		if !ec.Status.Ready || !ec.Status.CreationComplete || !conditions.IsTrue(ec, etcdv1.AvailableCondition) {
			return fmt.Errorf("ready %v, creationComplete %v, Available %q; last operation %s %s: %s", ec.Status.Ready, ec.Status.CreationComplete,
				conditions.GetMessage(ec, etcdv1.AvailableCondition), last.Kind, last.Target, last.Reason)
		}
		if got := ptr.Deref(ec.Status.ReadyReplicas, 0); got != int32(replicas) || ptr.Deref(ec.Status.Replicas, 0) != int32(replicas) {
			return fmt.Errorf("%d machines, %d with a healthy voter; want %d", ptr.Deref(ec.Status.Replicas, 0), got, replicas)
		}
		if eps := strings.Split(ec.Status.Endpoints, ","); len(eps) != replicas {
			return fmt.Errorf("endpoints %q, want %d", ec.Status.Endpoints, replicas)
		}
		return nil
	})
	return ec
}

// scaleEtcd sets the EtcdCluster's replicas through the scale subresource.
func (s *scenario) scaleEtcd(ctx context.Context, replicas int32) {
	s.t.Helper()
	s.scaleObject(ctx, &etcdv1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}}, replicas)
}

// TestEtcdClusterCreateAndScale creates an EtcdCluster of 3 on its own
// machines, checks the contract (status and Secrets), and scales it to 5
// and back to 3 with writes going on: learners first, one membership
// change at a time, nothing lost.
func TestEtcdClusterCreateAndScale(t *testing.T) {
	mgmt := requireShared(t)
	t.Parallel()
	s := newEtcdScenario(t, mgmt, "etcd-scale", 3, 1)
	s.startTraffic(3)
	ec := s.waitEtcdReady(5*time.Minute, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if !ec.Status.Initialized || !conditions.IsTrue(ec, etcdv1.EtcdInitializedCondition) || !conditions.IsTrue(ec, etcdv1.EtcdCACertificatesAvailableCondition) {
		t.Errorf("initialized %v, EtcdInitialized %v, EtcdCACertificatesAvailable %v", ec.Status.Initialized,
			conditions.IsTrue(ec, etcdv1.EtcdInitializedCondition), conditions.IsTrue(ec, etcdv1.EtcdCACertificatesAvailableCondition))
	}
	for _, purpose := range []secret.Purpose{secret.EtcdCA, secret.APIServerEtcdClient} {
		var sec corev1.Secret
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, purpose)}, &sec); err != nil {
			t.Fatalf("contract Secret %s: %v", secret.Name(s.name, purpose), err)
		}
		if sec.Type != clusterv1.ClusterSecretType || sec.Labels[clusterv1.ClusterNameLabel] != s.name || len(sec.Data[secret.TLSCrtDataName]) == 0 {
			t.Errorf("Secret %s: type %s, labels %v, keys %d", sec.Name, sec.Type, sec.Labels, len(sec.Data))
		}
	}
	machines, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		if ip := internalIP(&m); !strings.Contains(ec.Status.Endpoints, "https://"+ip+":2379") {
			t.Errorf("endpoints %q do not list machine %s (%s)", ec.Status.Endpoints, m.Name, ip)
		}
	}

	s.scaleEtcd(ctx, 5)
	s.waitEtcdReady(10*time.Minute, 5)
	s.scaleEtcd(ctx, 3)
	s.waitEtcdReady(10*time.Minute, 3)
	wr, mr := s.traffic.stop(ctx)
	s.traffic = nil
	t.Logf("writer: %s", wr)
	if err := wr.Err(); err != nil {
		t.Error(err)
	}
	if err := mr.Err(); err != nil {
		t.Error(err)
	}
	if mr.MaxLearners > 1 || mr.MaxVoters > 5 {
		t.Errorf("membership went to %d voters and %d learners at once; want at most 5 voters and 1 learner", mr.MaxVoters, mr.MaxLearners)
	}
	s.finish()

	// Deleting the EtcdCluster releases its machines' hooks and deletes
	// them; it goes once they are gone.
	if err := s.c.Delete(ctx, &etcdv1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	s.eventually(3*time.Minute, "the EtcdCluster and its machines gone", func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		if ec, err := s.etcdCluster(ctx); !isNotFound(err) {
			return fmt.Errorf("EtcdCluster still there (%v), %d machines; Deleting: %s", err, len(ms), conditions.GetMessage(ec, etcdv1.DeletingCondition))
		}
		if len(ms) > 0 {
			return fmt.Errorf("%d machines left", len(ms))
		}
		return nil
	})
}

// TestEtcdClusterFlappingAndReplacement: a member frozen for less than
// unhealthyMemberTimeoutSeconds and thawed is left alone; a killed member
// is removed once the timeout passes, and only then replaced (never more
// than 3 machines), back to 3 healthy members.
func TestEtcdClusterFlappingAndReplacement(t *testing.T) {
	mgmt := requireShared(t)
	t.Parallel()
	const timeout = 30 * time.Second
	s := newEtcdScenario(t, mgmt, "etcd-replace", 3, 0, func(ec *etcdv1.EtcdCluster) {
		ec.Spec.UnhealthyMemberTimeoutSeconds = ptr.To(int32(timeout / time.Second))
	})
	s.startTraffic(3)
	s.waitEtcdReady(5*time.Minute, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	host := &machinehost.Host{Root: s.mgmt.env.MachineRoot()}
	machines, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	members := func(ctx context.Context) ([]string, error) {
		ec, err := s.etcdCluster(ctx)
		if err != nil {
			return nil, err
		}
		var ids []string
		for _, m := range ec.Status.Members {
			ids = append(ids, m.ID)
		}
		return ids, nil
	}
	before, err := members(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Flapping: frozen for a third of the timeout, then thawed.
	flapper := machines[0].Name
	s.freeze(host, flapper, "")
	s.holds(timeout/3, "no machine replaced while "+flapper+" is frozen", s.machinesStay(3))
	if err := host.Thaw(ns, flapper); err != nil {
		t.Fatal(err)
	}
	s.holds(timeout+20*time.Second, "no machine replaced and no member removed after "+flapper+" was thawed", func(ctx context.Context) error {
		if err := s.machinesStay(3)(ctx); err != nil {
			return err
		}
		ids, err := members(ctx)
		if err == nil && len(ids) != len(before) {
			return fmt.Errorf("members %v, were %v", ids, before)
		}
		return nil
	})
	s.waitEtcdReady(2*time.Minute, 3)

	// Replacement: killed, removed after the timeout, then replaced.
	victim := machines[1].Name
	killed := time.Now()
	if err := host.Kill(ns, victim); err != nil {
		t.Fatal(err)
	}
	s.holds(timeout/2, "machine "+victim+" kept before its member is unhealthy for "+timeout.String(), s.machinesStay(3))
	s.eventually(5*time.Minute, "machine "+victim+" replaced", func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if m.Name == victim {
				return fmt.Errorf("machine %s still there", victim)
			}
		}
		return nil
	})
	s.waitEtcdReady(5*time.Minute, 3)
	if gone := s.bound.departures(); len(gone) != 1 || gone[0] != victim {
		t.Errorf("machines that left: %v; want only %s", gone, victim)
	}
	t.Logf("killed member replaced, 3 healthy members again after %s", time.Since(killed).Round(time.Second))
	s.finish()
}

// TestEtcdClusterUpgrade rolls an EtcdCluster from etcd v3.5 to v3.6: each
// member is replaced in turn (learner first, promoted, leadership moved off
// the outgoing member), with writes going on, until every member reports
// the new version.
func TestEtcdClusterUpgrade(t *testing.T) {
	mgmt := requireShared(t)
	t.Parallel()
	testkit.RequireBinaries(t, "etcd-previous")
	from, to := binaries.PreviousEtcdVersion, binaries.EtcdVersion
	s := newEtcdScenario(t, mgmt, "etcd-upgrade", 3, 1, func(ec *etcdv1.EtcdCluster) { ec.Spec.Version = from })
	s.startTraffic(3)
	s.waitEtcdReady(5*time.Minute, 3)
	s.eventually(time.Minute, "every member reporting "+from, s.membersRun(from))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ec, err := s.etcdCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := ec.DeepCopy()
	ec.Spec.Version = to
	if err := s.c.Patch(ctx, ec, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.eventually(15*time.Minute, "every machine up to date", func(ctx context.Context) error {
		ec, err := s.etcdCluster(ctx)
		if err != nil {
			return err
		}
		last := ec.Status.LastOperation
		if ec.Status.ObservedGeneration < ec.Generation {
			return fmt.Errorf("status is of generation %d, the spec's is %d", ec.Status.ObservedGeneration, ec.Generation)
		}
		if got := ptr.Deref(ec.Status.UpToDateReplicas, 0); got != 3 || ptr.Deref(ec.Status.Replicas, 0) != 3 || !ec.Status.Ready {
			return fmt.Errorf("%d of %d machines up to date, ready %v; last operation %s %s: %s", got, ptr.Deref(ec.Status.Replicas, 0), ec.Status.Ready,
				last.Kind, last.Target, last.Reason)
		}
		return nil
	})
	s.eventually(time.Minute, "every member reporting "+to, s.membersRun(to))
	t.Logf("etcd %s → %s: every member replaced in %s", from, to, time.Since(start).Round(time.Second))
	if gone := s.bound.departures(); len(gone) != 3 {
		t.Errorf("machines replaced: %v; want the 3 that ran %s", gone, from)
	}
	s.finish()
}

// membersRun checks that every member answers with etcd version (v-less,
// as etcd reports it) and that there are 3.
func (s *scenario) membersRun(version string) func(context.Context) error {
	return func(ctx context.Context) error {
		cfg, err := s.etcdConfig(ctx)
		if err != nil {
			return err
		}
		cli, err := etcd.New(cfg)
		if err != nil {
			return err
		}
		defer cli.Close()
		if len(cfg.Endpoints) != 3 {
			return fmt.Errorf("%d machines with an address, want 3", len(cfg.Endpoints))
		}
		for _, ep := range cfg.Endpoints {
			st, err := cli.Status(ctx, ep)
			if err != nil {
				return err
			}
			if st.Version != strings.TrimPrefix(version, "v") {
				return fmt.Errorf("member at %s runs etcd %s, want %s", ep, st.Version, version)
			}
		}
		return nil
	}
}
