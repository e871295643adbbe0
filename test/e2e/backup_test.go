package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/objectstore"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// backupKeep is the scenario's retention: fewer than the snapshots it
// waits for, so that retention has to delete.
const backupKeep = 2

// TestBackups is issue 35's backups on a 3-machine control plane under a
// writer and the invariant monitor, into a real S3 store (versitygw) on a
// 10-second schedule, encrypted:
//   - three snapshots are taken and verified, each from a follower, never
//     the leader;
//   - retention keeps exactly backupKeep, and no orphan object;
//   - each kept snapshot's object matches its manifest's size and SHA-256,
//     and a scratch restore of it, made here with the key, serves the
//     manifest's revision; without the key, or with another, it cannot be
//     opened, and its ciphertext does not restore;
//   - status.backup and BackupsHealthy report the last one;
//   - with the schedule at a day, a version upgrade creates its first new
//     machine only after a snapshot started after the upgrade was asked
//     for was verified, and a scale-down to one deletes its first machine
//     only after another such snapshot;
//   - a missing credentials Secret and a wrong bucket each turn
//     BackupsHealthy False, naming the fault;
//   - restore: after a last snapshot the cluster is deleted, machines and
//     all, and a new 3-machine cluster is built from it with
//     spec.restore.from.cluster. A missing credentials Secret, a bucket
//     that does not exist, the wrong key and a corrupt snapshot (a byte
//     flipped) are each named in its Restored condition while no machine
//     is created. Then it holds every key of the snapshot's revision,
//     serves a revision above the bumped one, runs on new addresses,
//     takes the old kubeconfig's credentials at its new endpoint, and
//     lists no Node of the old machines; a writer and the monitor run
//     while it grows from one machine to three.
func TestBackups(t *testing.T) {
	mgmt := requireShared(t)
	testkit.RequireBinaries(t, "versitygw")
	parallel(t, 6*time.Minute, "kube-previous")
	requirePreviousKube(t, mgmt)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	name := "backup"
	srv, _ := testkit.StartObjectStore(t, "backups")
	target := testkit.StoreTarget(srv, "backups")
	target.Prefix = "e2e" // as spec.backup says below
	store, err := s3store.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	key, err := backup.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := backup.ParseKey(key)
	storeSecret(t, mgmt, name+"-s3", srv)
	keySecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-key", Namespace: ns}, Data: map[string][]byte{engine.BackupEncryptionKeyKey: key}}
	if err := mgmt.env.Client.Create(ctx, keySecret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgmt.env.Client.Delete(context.Background(), keySecret) })
	spec := &controlplanev1.BackupSpec{
		Target:     controlplanev1.BackupTarget{Endpoint: srv.Endpoint, Bucket: "backups", Prefix: "e2e", CredentialsSecret: name + "-s3"},
		Schedule:   controlplanev1.BackupSchedule{IntervalSeconds: ptr.To[int32](10)},
		Retention:  controlplanev1.BackupRetention{KeepLast: ptr.To[int32](backupKeep)},
		Encryption: &controlplanev1.BackupEncryption{KeySecret: name + "-key"},
	}
	s := newScenario(t, mgmt, name, 3, withoutAutorepair, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Version = binaries.PreviousKubeVersion
		cp.Spec.Backup = spec.DeepCopy()
	})
	s.waitAvailable(convergeTimeout, 3)
	s.startTraffic(3)
	s.waitWrites(20)

	// Three verified snapshots, the last one's record in status.
	seen := map[string]controlplanev1.BackupRecord{}
	s.eventually(4*time.Minute, "three verified backups", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if st := cp.Status.Backup; st != nil && st.LastSuccessful != nil {
			seen[st.LastSuccessful.Object] = *st.LastSuccessful
		}
		if len(seen) < 3 {
			return fmt.Errorf("%d verified so far (status.backup %+v)", len(seen), cp.Status.Backup)
		}
		return nil
	})
	s.stopTraffic(ctx)

	cp, err := s.controlPlane(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := conditions.Get(cp, controlplanev1.BackupsHealthyCondition); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("BackupsHealthy is %+v, want True", c)
	}
	last := cp.Status.Backup.LastSuccessful
	if last.Stored != backupKeep || cp.Status.Backup.Stored != backupKeep {
		t.Errorf("status.backup says %d (record %d) stored, want %d", cp.Status.Backup.Stored, last.Stored, backupKeep)
	}
	if v := last.VerifiedTime; v == nil || v.Before(&last.Time) {
		t.Errorf("status.backup.lastSuccessful began at %v and was verified at %v; want its verification time, not before its start", last.Time, v)
	}

	// The store, once the schedule is a day and the snapshot in flight (if
	// any) is done: exactly backupKeep snapshots, each with its manifest.
	s.setBackup(ctx, func(b *controlplanev1.BackupSpec) { b.Schedule.IntervalSeconds = ptr.To[int32](86400) })
	var manifests []backup.Manifest
	s.eventually(time.Minute, fmt.Sprintf("%d snapshots and their manifests in the store", backupKeep), func(ctx context.Context) error {
		var err error
		manifests, err = storedBackups(ctx, store, name)
		return err
	})
	if cp, err = s.controlPlane(ctx); err != nil {
		t.Fatal(err)
	}
	last = cp.Status.Backup.LastSuccessful
	if !slices.ContainsFunc(manifests, func(m backup.Manifest) bool { return m.Snapshot == last.Object && m.Revision == last.Revision }) {
		t.Errorf("status.backup.lastSuccessful %+v is not among the stored manifests", last)
	}
	etcdBin, err := binaries.Path("etcd", binaries.EtcdVersion)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := backup.NewKey()
	wrong, _ := backup.ParseKey(other)
	for _, m := range manifests {
		if m.TakenFrom == m.Leader || m.Verified == nil || m.Verified.Revision != m.Revision || !m.Encrypted {
			t.Errorf("manifest %s: taken from %s, leader %s, verified %+v, encrypted %v; want a follower's, verified, encrypted",
				m.Snapshot, m.TakenFrom, m.Leader, m.Verified, m.Encrypted)
		}
		if sum, size := objectSum(ctx, t, store, m.Snapshot); sum != m.SHA256 || size != m.Size {
			t.Errorf("%s: the stored object is %d bytes with SHA-256 %s; its manifest says %d, %s", m.Snapshot, size, sum, m.Size, m.SHA256)
		}
		restored := restoreObject(ctx, t, store, m, enc, etcdBin)
		if restored.Revision != m.Revision {
			t.Errorf("%s: a scratch restore serves revision %d; its manifest says %d", m.Snapshot, restored.Revision, m.Revision)
		}
		for what, e := range map[string]*backup.Encryption{"without the key": nil, "with another key": wrong} {
			r, err := store.Get(ctx, m.Snapshot)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := backup.Open(r, m, e); err == nil {
				t.Errorf("%s opened %s", what, m.Snapshot)
			}
			r.Close()
		}
		r, err := store.Get(ctx, m.Snapshot)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := backup.ScratchRestore(ctx, etcdBin, filepath.Join(t.TempDir(), "scratch"), r); err == nil {
			t.Errorf("the ciphertext of %s restored as a snapshot", m.Snapshot)
		}
		r.Close()
	}

	// Risky steps: the schedule at a day, and a snapshot counts for them
	// for 10 s, which the last scheduled one has outlived once the upgrade
	// is asked for.
	// Retention keeps them all now: the snapshot each step waited for must
	// stay to be read.
	s.setBackup(ctx, func(b *controlplanev1.BackupSpec) {
		b.Schedule.IntervalSeconds, b.MaxAgeBeforeRiskyChangeSeconds = ptr.To[int32](86400), ptr.To[int32](10)
		b.Retention.KeepLast = ptr.To[int32](100)
	})
	s.startTraffic(3)
	s.riskyStepAfterBackup(ctx, store, "upgrading", func() {
		s.patchControlPlane(ctx, func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Version = version })
	}, func(ctx context.Context, _ time.Time) (time.Time, error) {
		ms, err := s.machines(ctx)
		if err != nil {
			return time.Time{}, err
		}
		var first time.Time
		for _, m := range ms {
			if at := m.CreationTimestamp.Time; m.Spec.Version == version && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
		if first.IsZero() {
			return first, errors.New("no machine of the new version yet")
		}
		return first, nil
	})
	s.eventually(10*time.Minute, "every machine upgraded", func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if m.Spec.Version != version || !m.DeletionTimestamp.IsZero() {
				return fmt.Errorf("machine %s runs %s (deleting: %v)", m.Name, m.Spec.Version, !m.DeletionTimestamp.IsZero())
			}
		}
		if len(ms) != 3 {
			return fmt.Errorf("%d machines", len(ms))
		}
		return nil
	})
	s.waitAvailable(3*time.Minute, 3)
	s.riskyStepAfterBackup(ctx, store, "scaling down", func() { s.scale(ctx, 1) }, func(_ context.Context, asked time.Time) (time.Time, error) {
		if at, ok := s.bound.firstDeletion(asked); ok {
			return at, nil
		}
		return time.Time{}, errors.New("no machine deleted yet")
	})
	s.waitAvailable(3*time.Minute, 1)
	s.stopTraffic(ctx)
	// Bad input, last: each fault is named in BackupsHealthy, without
	// waiting for the minute a failed attempt waits before the next (the
	// recovery after a failure is TestBackupScheduleAndStatus's).
	s.setBackup(ctx, func(b *controlplanev1.BackupSpec) { b.Target.CredentialsSecret = name + "-missing" })
	s.eventually(time.Minute, "BackupsHealthy naming the missing Secret", s.backupsHealthy(metav1.ConditionFalse, "Secret default/backup-missing (spec.backup.target.credentialsSecret) does not exist"))
	s.setBackup(ctx, func(b *controlplanev1.BackupSpec) {
		b.Target.CredentialsSecret, b.Target.Bucket, b.Schedule.IntervalSeconds = name+"-s3", "no-such-bucket", ptr.To[int32](10)
	})
	s.eventually(time.Minute, "BackupsHealthy naming the missing bucket", s.backupsHealthy(metav1.ConditionFalse, "NoSuchBucket"))
	s.setBackup(ctx, func(b *controlplanev1.BackupSpec) { b.Target.Bucket = "backups" })

	// Restore: the cluster is lost, machines and all, after a last
	// snapshot; a new one is built from it, through bad input first.
	lost := s.loseCluster(ctx, store)
	restored := restoreWithBadInput(ctx, t, mgmt, name+"-restored", srv, store, lost, key)
	restored.checkRestoredData(ctx, lost)
	restored.startTraffic(3)
	restored.checkRestoredCluster(ctx, lost)
	restored.stopTraffic(ctx)
	// Every status QCP wrote for the control planes passed the CRD's
	// schema (status.lastOperation.kind once lacked Snapshot).
	for _, cp := range []string{name, restored.name} {
		if lines := mgmt.invalidWrites("QuorumControlPlane " + ns + "/" + cp); len(lines) > 0 {
			t.Errorf("the API server refused %d writes of control plane %s as invalid; the first: %s", len(lines), cp, lines[0])
		}
	}
}

// invalidWrites are the lines of qcp-manager's logs where the API server
// refused a write of object (kind namespace/name) as invalid.
func (m *management) invalidWrites(object string) []string {
	logs, _ := filepath.Glob(filepath.Join(m.env.Dir, "qcp-manager*.log"))
	var found []string
	for _, path := range logs {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, object) && strings.Contains(line, "is invalid") {
				found = append(found, strings.TrimSpace(line))
			}
		}
	}
	return found
}

// riskyStepAfterBackup waits until the newest verified snapshot is older
// than the 10 s a risky step takes it for, asks for the step (act), and
// checks that the step's first change to a machine (firstChange says
// when, given when the step was asked for) came only after a snapshot
// started after the ask was verified.
func (s *scenario) riskyStepAfterBackup(ctx context.Context, store *s3store.Store, what string, act func(), firstChange func(context.Context, time.Time) (time.Time, error)) {
	s.t.Helper()
	s.eventually(time.Minute, "the last snapshot verified more than 10 s ago", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if st := cp.Status.Backup; st == nil || st.LastSuccessful == nil || st.LastSuccessful.VerifiedTime == nil ||
			time.Since(st.LastSuccessful.VerifiedTime.Time) < 11*time.Second {
			return fmt.Errorf("status.backup %+v", st)
		}
		return nil
	})
	asked := time.Now()
	act()
	// The first snapshot begun after the ask: a later one (the rollout's
	// scale-down of its surge takes none, but a scale-down does) proves
	// nothing about the order.
	var verified time.Time
	s.eventually(3*time.Minute, "a snapshot taken before "+what, func(ctx context.Context) error {
		manifests, _, err := engine.StoredBackups(ctx, store, backup.ClusterRef{Namespace: ns, Kind: "QuorumControlPlane", Name: s.name})
		if err != nil {
			return err
		}
		var first *backup.Manifest
		for _, m := range manifests {
			if !m.Started.Before(asked) && m.Verified != nil && (first == nil || m.Started.Before(first.Started)) {
				first = &m
			}
		}
		if first == nil {
			return fmt.Errorf("no snapshot begun after %s was asked for at %s", what, asked)
		}
		verified = first.Verified.Time
		return nil
	})
	s.eventually(3*time.Minute, "a machine changed by "+what, func(ctx context.Context) error {
		first, err := firstChange(ctx, asked)
		if err != nil {
			return err
		}
		// Machine timestamps have whole seconds.
		if first.Before(verified.Truncate(time.Second)) {
			s.t.Errorf("%s changed its first machine at %s, before the snapshot it waits for was verified at %s", what, first, verified)
		}
		return nil
	})
}

// readStoredManifest reads the manifest of snapshot object name, which
// must record its verification.
func readStoredManifest(ctx context.Context, store *s3store.Store, name string) (backup.Manifest, error) {
	m, err := engine.ReadManifest(ctx, store, name)
	if err == nil && m.Verified == nil {
		err = fmt.Errorf("manifest of %s without a verification", name)
	}
	return m, err
}

// storeSecret creates Secret name with srv's credentials and CA, in
// spec.backup.target.credentialsSecret's form, deleted when t ends.
func storeSecret(t testing.TB, mgmt *management, name string, srv *objectstore.Server) {
	t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string][]byte{
		engine.BackupAccessKeyIDKey: []byte(srv.AccessKeyID), engine.BackupSecretAccessKeyKey: []byte(srv.SecretAccessKey), engine.BackupCAKey: srv.CA}}
	if err := mgmt.env.Client.Create(t.Context(), sec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgmt.env.Client.Delete(context.Background(), sec) })
}

// setBackup changes the control plane's spec.backup.
func (s *scenario) setBackup(ctx context.Context, change func(*controlplanev1.BackupSpec)) {
	s.t.Helper()
	if err := retry(ctx, func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		before := cp.DeepCopy()
		change(cp.Spec.Backup)
		return s.c.Patch(ctx, cp, client.MergeFrom(before))
	}); err != nil {
		s.t.Fatal(err)
	}
}

// backupsHealthy is a condition for eventually: BackupsHealthy has status
// want and a message containing says.
func (s *scenario) backupsHealthy(want metav1.ConditionStatus, says string) func(context.Context) error {
	return func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		c := conditions.Get(cp, controlplanev1.BackupsHealthyCondition)
		if c == nil || c.Status != want || !strings.Contains(c.Message, says) {
			return fmt.Errorf("BackupsHealthy is %+v", c)
		}
		return nil
	}
}

// storedBackups reads the manifests of control plane name's backups, and
// fails unless the store holds exactly backupKeep snapshots, each with its
// manifest.
func storedBackups(ctx context.Context, store *s3store.Store, name string) ([]backup.Manifest, error) {
	manifests, objs, err := engine.StoredBackups(ctx, store, backup.ClusterRef{Namespace: ns, Kind: "QuorumControlPlane", Name: name})
	if err != nil {
		return nil, err
	}
	var snapshots []string
	for _, o := range objs {
		snapshots = append(snapshots, o.Name)
	}
	if len(manifests) != backupKeep || len(snapshots) != backupKeep {
		return nil, fmt.Errorf("the store holds %d manifests and the snapshots %v; retention keeps %d of each", len(manifests), snapshots, backupKeep)
	}
	for _, m := range manifests {
		if !slices.Contains(snapshots, m.Snapshot) {
			return nil, fmt.Errorf("manifest of %s without its snapshot (snapshots %v)", m.Snapshot, snapshots)
		}
	}
	return manifests, nil
}

// objectSum reads object name and returns its SHA-256 and size.
func objectSum(ctx context.Context, t *testing.T, store *s3store.Store, name string) (string, int64) {
	t.Helper()
	r, err := store.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), n
}

// restoreObject restores snapshot m into a scratch etcd here, decrypted
// with enc.
func restoreObject(ctx context.Context, t *testing.T, store *s3store.Store, m backup.Manifest, enc *backup.Encryption, etcdBin string) backup.Restored {
	t.Helper()
	r, err := store.Get(ctx, m.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	plain, err := backup.Open(r, m, enc)
	if err != nil {
		t.Fatal(err)
	}
	restored, err := backup.ScratchRestore(ctx, etcdBin, filepath.Join(t.TempDir(), "scratch"), plain)
	if err != nil {
		t.Fatalf("%s: %v", m.Snapshot, err)
	}
	return restored
}
