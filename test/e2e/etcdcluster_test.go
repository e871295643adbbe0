package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/cloudinit"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// etcdScenarioControlPlane is the size of the QuorumControlPlane every
// EtcdCluster scenario runs on its EtcdCluster.
const etcdScenarioControlPlane = 2

// newEtcdScenario creates, all at once, a Cluster named name with a
// ProcessCluster (three failure domains), a ProcessMachineTemplate, an
// EtcdCluster of replicas members and a QuorumControlPlane of
// etcdScenarioControlPlane machines using it through spec.etcd.clusterRef,
// and registers the end-of-scenario checks on the EtcdCluster's machines,
// which may never be more than replicas + surge.
func newEtcdScenario(t testing.TB, mgmt *management, name string, replicas int32, surge int, edits ...func(*etcdv1.EtcdCluster)) *scenario {
	t.Helper()
	testkit.RequireBinaries(t, "etcd", "kube", "capi-manager")
	s := &scenario{t: t, mgmt: mgmt, c: mgmt.fenced(mgmt.env.Client), name: name,
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
	cp := newControlPlane(name, etcdScenarioControlPlane)
	cp.Spec.Etcd.ClusterRef = &controlplanev1.LocalObjectReference{Name: name}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.create(ctx,
		&infrav1.ProcessCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: infrav1.ProcessClusterSpec{FailureDomains: failureDomains}},
		&infrav1.ProcessMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
		&clusterv1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: clusterv1.ClusterSpec{
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessCluster", Name: name,
				},
				ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: controlplanev1.GroupVersion.Group, Kind: "QuorumControlPlane", Name: name,
				},
			},
		},
		ec, cp,
	)
	s.bound = startMachineBound(s, int(replicas), surge)
	t.Cleanup(s.release)
	t.Cleanup(s.dumpOnFailure)
	return s
}

// changeEtcdQuota sets the EtcdCluster's quotaBackendBytes and waits for
// every member to run with it: each restarted in place once, one at a
// time, and no machine replaced.
func (s *scenario) changeEtcdQuota(ctx context.Context, quota int64) {
	s.t.Helper()
	before, _ := s.bound.restarts()
	seen := s.bound.machinesSeen()
	ec, err := s.etcdCluster(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	orig := ec.DeepCopy()
	ec.Spec.QuotaBackendBytes = ptr.To(quota)
	if err := s.c.Patch(ctx, ec, client.MergeFrom(orig)); err != nil {
		s.t.Fatalf("changing EtcdCluster %s's quota: %v", s.name, err)
	}
	cli := s.workloadEtcd(ctx)
	s.eventually(3*time.Minute, "every member running with the new quota", func(ctx context.Context) error {
		return eachMember(ctx, cli, func(st etcd.MemberStatus) error {
			if st.DBSizeQuota != quota {
				return fmt.Errorf("member %x runs with a quota of %d bytes, want %d", st.ID, st.DBSizeQuota, quota)
			}
			return nil
		})
	})
	s.waitEtcdReady(time.Minute, 3)
	after, most := s.bound.restarts()
	if got := after[len(before):]; len(got) != 3 || len(slices.Compact(slices.Sorted(slices.Values(got)))) != 3 {
		s.t.Errorf("restarted %v for the quota change; want each of the 3 members once", got)
	}
	if most > 1 {
		s.t.Errorf("%d members disrupted at once, want 1", most)
	}
	if n := s.bound.machinesSeen(); n != seen {
		s.t.Errorf("%d machines seen before the quota change, %d after: a quota change replaces none", seen, n)
	}
}

// etcdCluster reads the scenario's EtcdCluster.
func (s *scenario) etcdCluster(ctx context.Context) (*etcdv1.EtcdCluster, error) {
	ec := &etcdv1.EtcdCluster{}
	return ec, s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, ec)
}

// etcdBackedUp waits for the EtcdCluster's first verified backup and checks
// it: BackupsHealthy, status.backup, and its manifest in the store, taken
// from a follower.
func (s *scenario) etcdBackedUp(ctx context.Context, store *s3store.Store) {
	s.t.Helper()
	var last *controlplanev1.BackupRecord
	s.eventually(2*time.Minute, "the EtcdCluster's first verified backup", func(ctx context.Context) error {
		ec, err := s.etcdCluster(ctx)
		if err != nil {
			return err
		}
		if st := ec.Status.Backup; st == nil || st.LastSuccessful == nil || !conditions.IsTrue(ec, controlplanev1.BackupsHealthyCondition) {
			return fmt.Errorf("status.backup %+v, BackupsHealthy %+v", ec.Status.Backup, conditions.Get(ec, controlplanev1.BackupsHealthyCondition))
		}
		last = ec.Status.Backup.LastSuccessful
		return nil
	})
	m, err := readStoredManifest(ctx, store, last.Object)
	if err != nil {
		s.t.Fatal(err)
	}
	if m.Cluster.Kind != "EtcdCluster" || m.Cluster.Name != s.name || m.Revision != last.Revision || m.TakenFrom == m.Leader {
		s.t.Errorf("manifest %+v; want the EtcdCluster's, at revision %d, from a follower", m, last.Revision)
	}
}

// waitEtcdReady waits until the EtcdCluster is ready with replicas healthy
// voters on as many machines, its endpoints listing each, and returns it.
func (s *scenario) waitEtcdReady(timeout time.Duration, replicas int) *etcdv1.EtcdCluster {
	s.t.Helper()
	var ec *etcdv1.EtcdCluster
	s.eventually(timeout, fmt.Sprintf("EtcdCluster %s ready with %d healthy voters", s.name, replicas), s.etcdReady(replicas, &ec))
	return ec
}

// etcdReady is waitEtcdReady's check; it leaves the EtcdCluster it read
// in *ec.
func (s *scenario) etcdReady(replicas int, ec **etcdv1.EtcdCluster) func(context.Context) error {
	return func(ctx context.Context) error {
		var err error
		if *ec, err = s.etcdCluster(ctx); err != nil {
			return err
		}
		return etcdReadyWith(*ec, replicas)
	}
}

func etcdReadyWith(ec *etcdv1.EtcdCluster, replicas int) error {
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
}

// scaleEtcd sets the EtcdCluster's replicas through the scale subresource.
func (s *scenario) scaleEtcd(ctx context.Context, replicas int32) {
	s.t.Helper()
	s.scaleObject(ctx, &etcdv1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}}, replicas)
}

// TestEtcdClusterCreateAndScale creates an EtcdCluster of 3 on its own
// machines and a QuorumControlPlane on it together. The control plane
// waits, naming the EtcdCluster, until it is creationComplete, then
// becomes Available and stores its data there; then each etcd-only
// machine registers its Node, tainted and labelled as etcd's, and CAPI
// links its Machine to it. The test checks the
// contract (status and Secrets), and scales the EtcdCluster to 5 and back
// to 3 with writes going on: learners first, one membership change at a
// time, nothing lost, the control plane Available throughout. Then it
// changes the EtcdCluster's quota, which restarts its etcd-only machines
// in place, one at a time, with no API server on them to carry it.
func TestEtcdClusterCreateAndScale(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 55*time.Second)
	// Backed up (issue 35): the EtcdCluster's own path through the
	// engine, and its scale-down below waits for a recent snapshot.
	srv, store := testkit.StartObjectStore(t, "etcd-backups")
	storeSecret(t, mgmt, "etcd-scale-s3", srv)
	s := newEtcdScenario(t, mgmt, "etcd-scale", 3, 1, func(ec *etcdv1.EtcdCluster) {
		ec.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
		ec.Spec.Backup = &controlplanev1.BackupSpec{
			Target:   controlplanev1.BackupTarget{Endpoint: srv.Endpoint, Bucket: "etcd-backups", CredentialsSecret: "etcd-scale-s3"},
			Schedule: controlplanev1.BackupSchedule{IntervalSeconds: ptr.To[int32](3600)},
		}
	})
	s.controlPlaneWaitsForEtcd(5 * time.Minute)
	s.startTraffic(3)
	ec := s.waitEtcdReady(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s.waitExternalAvailable(convergeTimeout, etcdScenarioControlPlane)
	if got, want := s.waitNodes(), 3+etcdScenarioControlPlane; got[cloudinit.Format] != want || len(got) != 1 {
		t.Errorf("machines by bootstrap data format: %v; want %d booted from cloud-config", got, want)
	}
	s.runNoEtcd(ctx)
	s.storesInEtcdCluster(ctx)
	s.checkOwnedByCluster(ctx, ec)
	if !ec.Status.Initialized || !conditions.IsTrue(ec, etcdv1.EtcdInitializedCondition) || !conditions.IsTrue(ec, etcdv1.EtcdCACertificatesAvailableCondition) {
		t.Errorf("initialized %v, EtcdInitialized %v, EtcdCACertificatesAvailable %v", ec.Status.Initialized,
			conditions.IsTrue(ec, etcdv1.EtcdInitializedCondition), conditions.IsTrue(ec, etcdv1.EtcdCACertificatesAvailableCondition))
	}
	for _, purpose := range []secret.Purpose{secret.EtcdCA, secret.APIServerEtcdClient} {
		var sec corev1.Secret
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, purpose)}, &sec); err != nil {
			t.Fatalf("contract Secret %s: %v", secret.Name(s.name, purpose), err)
		}
		if sec.Type != clusterv1.ClusterSecretType || sec.Labels[clusterv1.ClusterNameLabel] != s.name || len(sec.Data[secret.TLSCrtDataName]) == 0 {
			t.Errorf("Secret %s: type %s, labels %v, keys %d", sec.Name, sec.Type, sec.Labels, len(sec.Data))
		}
		if purpose != secret.EtcdCA {
			continue
		}
		if ca, err := certs.ParseKeyPair(sec.Data[secret.TLSCrtDataName], sec.Data[secret.TLSKeyDataName]); err != nil || ca.Cert.PublicKeyAlgorithm != x509.ECDSA {
			t.Errorf("etcd CA %s: %v, want an ECDSA key pair", sec.Name, err)
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

	s.etcdBackedUp(ctx, store)

	available := s.watchAvailable()
	s.scaleEtcd(ctx, 5)
	s.waitEtcdReady(10*time.Minute, 5)
	s.scaleEtcd(ctx, 3)
	s.waitEtcdReady(10*time.Minute, 3)
	s.changeEtcdQuota(ctx, 64<<20)
	if err := available.stop(); err != nil {
		t.Error(err)
	}
	_, mr := s.stopTraffic(ctx)
	s.checkI6(mr)
	if mr.MaxLearners > 1 || mr.MaxVoters > 5 {
		t.Errorf("membership went to %d voters and %d learners at once; want at most 5 voters and 1 learner", mr.MaxVoters, mr.MaxLearners)
	}
	s.finish()
	// A marker, then a snapshot after it, for the restore below.
	marker := s.etcdSnapshotAfterMarker(ctx, store)

	// Deleting the EtcdCluster waits for the control plane that stores
	// its data there; once that is deleted, it releases its machines'
	// hooks and deletes them, and goes once they are gone.
	if err := s.c.Delete(ctx, &etcdv1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	s.eventually(time.Minute, "the EtcdCluster's deletion waiting for the control plane", func(ctx context.Context) error {
		ec, err := s.etcdCluster(ctx)
		if err != nil {
			return err
		}
		if c := conditions.Get(ec, etcdv1.DeletingCondition); c == nil || c.Reason != etcdv1.DeletingWaitingForControlPlaneReason || !strings.Contains(c.Message, s.name) {
			return fmt.Errorf("Deleting condition %+v", c)
		}
		return nil
	})
	s.holds(10*time.Second, "the EtcdCluster's machines kept while the control plane exists", s.machinesStay(3))
	if err := s.c.Delete(ctx, &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	s.eventually(5*time.Minute, "the EtcdCluster and its machines gone", func(ctx context.Context) error {
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

	// Restore (issue 35): a new EtcdCluster of one member from the lost
	// one's newest snapshot, under a new control plane. The backup was not
	// encrypted, so the restore has a new etcd CA, and says so.
	r := newEtcdScenario(t, mgmt, "etcd-restored", 1, 1, func(ec *etcdv1.EtcdCluster) {
		ec.Spec.Restore = &controlplanev1.RestoreSpec{From: controlplanev1.RestoreSource{Cluster: s.name,
			Target: &controlplanev1.BackupTarget{Endpoint: srv.Endpoint, Bucket: "etcd-backups", CredentialsSecret: "etcd-scale-s3"}}}
	})
	r.waitEtcdReady(convergeTimeout, 1)
	r.waitExternalAvailable(convergeTimeout, etcdScenarioControlPlane)
	resp, err := r.workloadEtcd(ctx).Raw().Get(ctx, restoreMarkerKey)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != s.name {
		t.Errorf("the restored EtcdCluster holds %v at %s; the snapshot held %q", resp.Kvs, restoreMarkerKey, s.name)
	}
	if min := marker.Revision + backup.BumpRevision; resp.Header.Revision < min {
		t.Errorf("the restored EtcdCluster serves revision %d; the snapshot's was %d, bumped it must be at least %d", resp.Header.Revision, marker.Revision, min)
	}
	ec, err = r.etcdCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := conditions.Get(ec, controlplanev1.RestoredCondition); c == nil || c.Status != metav1.ConditionTrue || c.Reason != controlplanev1.RestoredNewAuthoritiesReason {
		t.Errorf("Restored is %+v; want True, with new authorities", c)
	}
	if st := ec.Status.Restore; st == nil || st.Object != marker.Snapshot || st.Authorities != controlplanev1.NewAuthorities {
		t.Errorf("status.restore is %+v; want snapshot %s, with new authorities", st, marker.Snapshot)
	}
}

// restoreMarkerKey is a key a scenario writes before its last snapshot,
// to find in the restore.
const restoreMarkerKey = "/e2e/restore-marker"

// etcdSnapshotAfterMarker writes restoreMarkerKey (the scenario's name)
// into the EtcdCluster, then has it take a snapshot, and returns that
// snapshot's manifest.
func (s *scenario) etcdSnapshotAfterMarker(ctx context.Context, store *s3store.Store) backup.Manifest {
	s.t.Helper()
	if _, err := s.workloadEtcd(ctx).Raw().Put(ctx, restoreMarkerKey, s.name); err != nil {
		s.t.Fatal(err)
	}
	asked := time.Now()
	ec, err := s.etcdCluster(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	before := ec.DeepCopy()
	ec.Spec.Backup.Schedule.IntervalSeconds = ptr.To[int32](10)
	if err := s.c.Patch(ctx, ec, client.MergeFrom(before)); err != nil {
		s.t.Fatal(err)
	}
	return s.snapshotAfter(store, backup.ClusterRef{Namespace: ns, Kind: "EtcdCluster", Name: s.name}, asked)
}

// TestEtcdClusterFlappingAndReplacement: a member frozen for less than
// unhealthyMemberTimeoutSeconds and thawed is left alone; a killed member
// is removed once the timeout passes, and only then replaced (never more
// than 3 machines), back to 3 healthy members. Then two of three are
// killed: with quorumLossRecovery FromSurvivor, QCP rebuilds etcd from the
// one left (issue 35); scaled to 5, three of five are killed, leaving one
// member that lagged and one current, and QCP rebuilds from the current
// one. Deleting the Cluster alone then takes the
// EtcdCluster and every machine with it.
func TestEtcdClusterFlappingAndReplacement(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 6*time.Minute)
	const timeout = 30 * time.Second
	s := newEtcdScenario(t, mgmt, "etcd-replace", 3, 0, func(ec *etcdv1.EtcdCluster) {
		ec.Spec.UnhealthyMemberTimeoutSeconds = ptr.To(int32(timeout / time.Second))
		ec.Spec.QuorumLossRecovery = &controlplanev1.QuorumLossRecovery{
			Policy: controlplanev1.RecoveryFromSurvivor, AfterSeconds: ptr.To(int32(recoveryAfter / time.Second)),
		}
	})
	s.startTraffic(3)
	s.waitEtcdReady(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s.waitExternalAvailable(convergeTimeout, etcdScenarioControlPlane)
	controlPlane, err := s.controlPlaneMachines(ctx)
	if err != nil {
		t.Fatal(err)
	}
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
	s.waitEtcdReady(convergeTimeout, 3)
	if gone := s.bound.departures(); len(gone) != 1 || gone[0] != victim {
		t.Errorf("machines that left: %v; want only %s", gone, victim)
	}
	t.Logf("killed member replaced, 3 healthy members again after %s", time.Since(killed).Round(time.Second))
	// No control plane rollout: its machines are the ones of before.
	s.waitExternalAvailable(2*time.Minute, etcdScenarioControlPlane)
	if err := s.controlPlaneUnchanged(controlPlane)(ctx); err != nil {
		t.Error(err)
	}
	s.finish()
	// Issue 35: two of three lost for good; the policy recovers. Then
	// three of five, leaving a lagging member and a current one.
	s.loseEtcdMajorityAndRecover(ctx, host, 3)
	s.scaleEtcd(ctx, 5)
	s.waitEtcdReady(10*time.Minute, 5)
	s.loseEtcdMajorityAndRecover(ctx, host, 5)
	s.deleteOnlyTheCluster(ctx)
}

// deleteOnlyTheCluster deletes the scenario's Cluster alone, as
// `kubectl delete cluster` does, and waits for everything to go with it:
// CAPI deletes the control plane only once the Cluster's other machines,
// the EtcdCluster's among them, are gone, so the EtcdCluster must go
// first, on its own.
func (s *scenario) deleteOnlyTheCluster(ctx context.Context) {
	s.t.Helper()
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}}
	if err := s.c.Delete(ctx, cluster); err != nil {
		s.t.Fatal(err)
	}
	s.eventually(5*time.Minute, "the Cluster, its EtcdCluster and every machine gone", func(ctx context.Context) error {
		var ms clusterv1.MachineList
		if err := s.reader(ctx).List(ctx, &ms, client.InNamespace(ns), client.MatchingLabels{clusterv1.ClusterNameLabel: s.name}); err != nil {
			return err
		}
		if len(ms.Items) > 0 {
			return fmt.Errorf("%d machines left, the first %s", len(ms.Items), ms.Items[0].Name)
		}
		if _, err := s.etcdCluster(ctx); !isNotFound(err) {
			return fmt.Errorf("the EtcdCluster is still there (%v)", err)
		}
		if err := s.reader(ctx).Get(ctx, client.ObjectKeyFromObject(cluster), cluster); !isNotFound(err) {
			return fmt.Errorf("the Cluster is still there (%v)", err)
		}
		return nil
	})
}

// TestEtcdClusterUpgrade rolls an EtcdCluster from etcd v3.5 to v3.6: each
// member is replaced in turn (learner first, promoted, leadership moved off
// the outgoing member), with writes going on, until every member reports
// the new version.
func TestEtcdClusterUpgrade(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 50*time.Second)
	testkit.RequireBinaries(t, "etcd-previous")
	from, to := binaries.PreviousEtcdVersion, binaries.EtcdVersion
	s := newEtcdScenario(t, mgmt, "etcd-upgrade", 3, 1, func(ec *etcdv1.EtcdCluster) { ec.Spec.Version = from })
	s.startTraffic(3)
	s.waitEtcdReady(convergeTimeout, 3)
	s.eventually(time.Minute, "every member reporting "+from, s.membersRun(from))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s.waitExternalAvailable(convergeTimeout, etcdScenarioControlPlane)
	controlPlane, err := s.controlPlaneMachines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	probe := s.startAPIProbe(false)
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
	// The control plane did not roll, and its API answered throughout.
	gap := probe.stop()
	t.Logf("longest time the workload API did not answer during the etcd upgrade: %s", gap)
	if gap > maxAPIGap {
		t.Errorf("the workload API went %s without answering during the etcd upgrade, more than %s", gap.Round(time.Millisecond), maxAPIGap)
	}
	if err := s.controlPlaneUnchanged(controlPlane)(ctx); err != nil {
		t.Error(err)
	}
	s.finish()
}

// membersRun checks that every member answers with etcd version (v-less,
// as etcd reports it) and that there are 3.
func (s *scenario) membersRun(version string) func(context.Context) error {
	return func(ctx context.Context) error {
		cli, cfg, err := s.etcdClient(ctx)
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

// controlPlaneMachines lists the scenario's control plane Machines (the
// EtcdCluster's are not), oldest first.
func (s *scenario) controlPlaneMachines(ctx context.Context) ([]clusterv1.Machine, error) {
	cp := *s
	cp.selector = client.MatchingLabels{clusterv1.ClusterNameLabel: s.name, clusterv1.MachineControlPlaneLabel: ""}
	return cp.machines(ctx)
}

// waitExternalAvailable waits until a control plane on external etcd is
// Available with replicas Ready machines, its external etcd usable and
// its components healthy, and no etcd member of its own.
func (s *scenario) waitExternalAvailable(timeout time.Duration, replicas int) *controlplanev1.QuorumControlPlane {
	s.t.Helper()
	var cp *controlplanev1.QuorumControlPlane
	s.eventually(timeout, fmt.Sprintf("control plane %s Available with %d machines on external etcd", s.name, replicas), func(ctx context.Context) error {
		var err error
		if cp, err = s.controlPlane(ctx); err != nil {
			return err
		}
		return externalAvailable(cp, replicas)
	})
	return cp
}

func externalAvailable(cp *controlplanev1.QuorumControlPlane, replicas int) error {
	last := cp.Status.LastOperation
	switch {
	case !conditions.IsTrue(cp, controlplanev1.AvailableCondition):
		return fmt.Errorf("not Available: %s; last operation %s %s: %s", conditions.GetMessage(cp, controlplanev1.AvailableCondition), last.Kind, last.Target, last.Reason)
	case ptr.Deref(cp.Status.Replicas, 0) != int32(replicas) || ptr.Deref(cp.Status.ReadyReplicas, 0) != int32(replicas):
		return fmt.Errorf("%d machines, %d Ready, want %d; last operation %s: %s", ptr.Deref(cp.Status.Replicas, 0), ptr.Deref(cp.Status.ReadyReplicas, 0),
			replicas, last.Kind, last.Reason)
	case !conditions.IsTrue(cp, controlplanev1.EtcdClusterHealthyCondition) || !conditions.IsTrue(cp, controlplanev1.ControlPlaneComponentsHealthyCondition):
		return fmt.Errorf("etcd healthy: %s; components healthy: %s", conditions.GetMessage(cp, controlplanev1.EtcdClusterHealthyCondition),
			conditions.GetMessage(cp, controlplanev1.ControlPlaneComponentsHealthyCondition))
	case len(cp.Status.Etcd.Members) > 0:
		return fmt.Errorf("the control plane lists etcd members of its own: %+v", cp.Status.Etcd.Members)
	}
	return nil
}

// runNoEtcd checks that the control plane's machines run no etcd: nothing
// listens on their etcd client and peer ports.
func (s *scenario) runNoEtcd(ctx context.Context) {
	s.t.Helper()
	ms, err := s.controlPlaneMachines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range ms {
		for _, port := range []string{"2379", "2380"} {
			if conn, err := net.DialTimeout("tcp", net.JoinHostPort(internalIP(&m), port), time.Second); err == nil {
				_ = conn.Close()
				s.t.Errorf("control plane machine %s listens on etcd's port %s", m.Name, port)
			}
		}
	}
}

// controlPlaneUnchanged returns a check that the control plane's machines
// are still the ones of before: the same names and creation timestamps.
func (s *scenario) controlPlaneUnchanged(before []clusterv1.Machine) func(context.Context) error {
	want := map[string]metav1.Time{}
	for _, m := range before {
		want[m.Name] = m.CreationTimestamp
	}
	return func(ctx context.Context) error {
		ms, err := s.controlPlaneMachines(ctx)
		if err != nil {
			return err
		}
		got := map[string]metav1.Time{}
		for _, m := range ms {
			got[m.Name] = m.CreationTimestamp
			if !m.DeletionTimestamp.IsZero() {
				return fmt.Errorf("control plane machine %s is being deleted", m.Name)
			}
		}
		if len(got) != len(want) {
			return fmt.Errorf("control plane machines %v, were %v", got, want)
		}
		for name, at := range want {
			if g, ok := got[name]; !ok || !g.Equal(&at) {
				return fmt.Errorf("control plane machine %s: created %v, was created %v", name, g, at)
			}
		}
		return nil
	}
}

// availabilityWatch samples the control plane's Available condition in the
// background and remembers every sample where it was not True.
type availabilityWatch struct {
	cancel  context.CancelFunc
	done    chan struct{}
	samples int
	lapses  []string
}

func (s *scenario) watchAvailable() *availabilityWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &availabilityWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			cp, err := s.controlPlane(ctx)
			if err == nil {
				w.samples++
				if !conditions.IsTrue(cp, controlplanev1.AvailableCondition) {
					w.lapses = append(w.lapses, time.Now().Format(time.RFC3339)+": "+conditions.GetMessage(cp, controlplanev1.AvailableCondition))
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return w
}

// stop ends the watch and reports the lapses.
func (w *availabilityWatch) stop() error {
	w.cancel()
	<-w.done
	if w.samples == 0 {
		return errors.New("the control plane was never read")
	}
	if len(w.lapses) > 0 {
		return fmt.Errorf("the control plane was not Available in %d of %d samples: %s", len(w.lapses), w.samples, strings.Join(w.lapses, "; "))
	}
	return nil
}

// controlPlaneWaitsForEtcd checks that the control plane says it waits for
// the EtcdCluster, by name, and creates no machine until the EtcdCluster is
// creationComplete. The EtcdCluster is created paused, so that it cannot
// complete before the control plane has had its say; the check unpauses it.
func (s *scenario) controlPlaneWaitsForEtcd(timeout time.Duration) {
	s.t.Helper()
	noMachine := func(ctx context.Context) error {
		if ms, err := s.controlPlaneMachines(ctx); err != nil || len(ms) > 0 {
			return fmt.Errorf("%d control plane machines before EtcdCluster %s is creationComplete (%v)", len(ms), s.name, err)
		}
		return nil
	}
	said := ""
	s.eventually(timeout, "the control plane saying it waits for EtcdCluster "+s.name, func(ctx context.Context) error {
		if err := noMachine(ctx); err != nil {
			s.t.Fatal(err)
		}
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		c := conditions.Get(cp, controlplanev1.EtcdClusterHealthyCondition)
		if c == nil || c.Reason != controlplanev1.EtcdClusterWaitingReason || !strings.Contains(c.Message, fmt.Sprintf("EtcdCluster %q", s.name)) ||
			!conditions.IsFalse(cp, controlplanev1.AvailableCondition) {
			return fmt.Errorf("EtcdClusterHealthy %+v", c)
		}
		said = c.Message
		return nil
	})
	s.t.Logf("the control plane waits: %s", said)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ec, err := s.etcdCluster(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	before := ec.DeepCopy()
	delete(ec.Annotations, clusterv1.PausedAnnotation)
	if err := s.c.Patch(ctx, ec, client.MergeFrom(before)); err != nil {
		s.t.Fatal(err)
	}
	s.eventually(timeout, "EtcdCluster "+s.name+" creationComplete, with no control plane machine before", func(ctx context.Context) error {
		// Two kinds compared in order: live, as the cache's informers may
		// stand at different points.
		ctx = liveReads(ctx)
		ms, err := s.controlPlaneMachines(ctx)
		if err != nil {
			return err
		}
		ec, err := s.etcdCluster(ctx) // read last: a machine seen before it must not predate creationComplete
		if err != nil {
			return err
		}
		if ec.Status.CreationComplete {
			return nil
		}
		if len(ms) > 0 {
			s.t.Fatalf("control plane machine %s created before EtcdCluster %s is creationComplete", ms[0].Name, s.name)
		}
		return errors.New("not creationComplete yet")
	})
}

// storesInEtcdCluster checks that the API servers store their data in the
// EtcdCluster, at its endpoints.
func (s *scenario) storesInEtcdCluster(ctx context.Context) {
	s.t.Helper()
	ec, err := s.etcdCluster(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg, err := s.etcdConfig(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg.Endpoints = strings.Split(ec.Status.Endpoints, ",")
	s.storesIn(ctx, cfg)
}

// storesIn writes a ConfigMap through the workload API and reads it back
// with an etcd client of cfg: the API servers store their data there.
func (s *scenario) storesIn(ctx context.Context, cfg etcd.Config) {
	s.t.Helper()
	cs, err := s.workload(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	marker := "stored-in-" + s.name
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "e2e-etcd-path", Namespace: "default"}, Data: map[string]string{"marker": marker}}
	s.eventually(time.Minute, "a ConfigMap written through the workload API", func(ctx context.Context) error {
		_, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	cli, err := etcd.New(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Raw().Get(ctx, "/registry/configmaps/default/e2e-etcd-path")
	if err != nil {
		s.t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || !bytes.Contains(resp.Kvs[0].Value, []byte(marker)) {
		s.t.Fatalf("the ConfigMap written through the workload API is not in the etcd at %v (%d keys)", cfg.Endpoints, len(resp.Kvs))
	}
}

// checkOwnedByCluster checks that ec has an owner reference to the
// scenario's Cluster, by which clusterctl move takes it along.
func (s *scenario) checkOwnedByCluster(ctx context.Context, ec *etcdv1.EtcdCluster) {
	s.t.Helper()
	cluster := &clusterv1.Cluster{}
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, cluster); err != nil {
		s.t.Fatal(err)
	}
	if !slices.ContainsFunc(ec.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.Kind == "Cluster" && o.Name == cluster.Name && o.UID == cluster.UID
	}) {
		s.t.Errorf("EtcdCluster %s has owners %v; want Cluster %s (uid %s) among them", ec.Name, ec.OwnerReferences, cluster.Name, cluster.UID)
	}
}
