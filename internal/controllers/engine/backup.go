package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// Records of the backups, on the owner: they move with it (clusterctl
// move copies no status), and status.backup is rebuilt from them.
const (
	// BackupSucceededAnnotation is the newest verified snapshot (a
	// BackupRecord in JSON).
	BackupSucceededAnnotation = "controlplane.cluster.x-k8s.io/qcp-backup-succeeded"
	// BackupFailedAnnotation is the newest failed attempt.
	BackupFailedAnnotation = "controlplane.cluster.x-k8s.io/qcp-backup-failed"
)

// Keys of the Secrets spec.backup names.
const (
	BackupAccessKeyIDKey     = "accessKeyID"
	BackupSecretAccessKeyKey = "secretAccessKey"
	BackupCAKey              = "ca.crt"
	BackupEncryptionKeyKey   = "key"
)

const (
	// BackupRetry is how long a failed snapshot waits before the next
	// attempt, whatever the schedule says.
	BackupRetry = time.Minute
	// SnapshotTimeout bounds a snapshot's stream and upload.
	SnapshotTimeout = 30 * time.Minute
	// backupURLLifetime is how long the URL a machine reads a snapshot
	// through is valid: the verification's own bound, and a margin.
	backupURLLifetime = 15 * time.Minute
	// defaultKeepLast is retention's count when spec.backup.retention
	// sets neither a count nor an age.
	defaultKeepLast = 7
)

// BackupConfig is an owner's spec.backup, with what its Secrets hold.
type BackupConfig struct {
	Spec     controlplanev1.BackupSpec
	Target   s3store.Target
	Schedule backup.Schedule
	// Key and Encryption are the age identity of an encrypted backup;
	// nil otherwise.
	Key        []byte
	Encryption *backup.Encryption
	Owner      backup.ClusterRef
	// Authorities are the Secrets (in the owner's namespace) of the
	// certificate authorities an encrypted backup holds, by purpose;
	// the owner's controller sets them.
	Authorities map[string]string
}

// LoadBackup reads spec (nil: no backups) and the Secrets it names in
// owner's namespace. The error names the Secret or field at fault and the
// fix.
func LoadBackup(ctx context.Context, c client.Reader, owner client.Object, kind string, spec *controlplanev1.BackupSpec) (*BackupConfig, error) {
	if spec == nil {
		return nil, nil
	}
	cfg := &BackupConfig{Spec: *spec, Owner: backup.ClusterRef{Namespace: owner.GetNamespace(), Kind: kind, Name: owner.GetName()}}
	var err error
	if cfg.Schedule, err = backup.ParseSchedule(spec.Schedule.IntervalSeconds, spec.Schedule.Cron); err != nil {
		return nil, fmt.Errorf("spec.backup.schedule: %w", err)
	}
	creds, err := secretData(ctx, c, owner.GetNamespace(), spec.Target.CredentialsSecret, "spec.backup.target.credentialsSecret",
		BackupAccessKeyIDKey, BackupSecretAccessKeyKey)
	if err != nil {
		return nil, err
	}
	cfg.Target = s3store.Target{Endpoint: spec.Target.Endpoint, Bucket: spec.Target.Bucket, Prefix: spec.Target.Prefix, Region: spec.Target.Region,
		AccessKeyID: string(creds[BackupAccessKeyIDKey]), SecretAccessKey: string(creds[BackupSecretAccessKeyKey]), CA: creds[BackupCAKey]}
	if _, err := s3store.Open(cfg.Target); err != nil {
		return nil, fmt.Errorf("spec.backup.target: %w", err)
	}
	if e := spec.Encryption; e != nil {
		data, err := secretData(ctx, c, owner.GetNamespace(), e.KeySecret, "spec.backup.encryption.keySecret", BackupEncryptionKeyKey)
		if err != nil {
			return nil, err
		}
		cfg.Key = data[BackupEncryptionKeyKey]
		if cfg.Encryption, err = backup.ParseKey(cfg.Key); err != nil {
			return nil, fmt.Errorf("Secret %s/%s (spec.backup.encryption.keySecret), key %q: %w", owner.GetNamespace(), e.KeySecret, BackupEncryptionKeyKey, err)
		}
	}
	return cfg, nil
}

// secretData reads Secret name and checks that it holds keys.
func secretData(ctx context.Context, c client.Reader, namespace, name, field string, keys ...string) (map[string][]byte, error) {
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("Secret %s/%s (%s) does not exist: create it with the keys %s", namespace, name, field, strings.Join(keys, " and "))
		}
		return nil, fmt.Errorf("reading Secret %s/%s (%s): %w", namespace, name, field, err)
	}
	for _, k := range keys {
		if len(s.Data[k]) == 0 {
			return nil, fmt.Errorf("Secret %s/%s (%s) has no key %q: add it", namespace, name, field, k)
		}
	}
	return s.Data, nil
}

// backupRecord reads one of the owner's backup records.
func backupRecord(owner client.Object, key string) *controlplanev1.BackupRecord {
	v, ok := owner.GetAnnotations()[key]
	if !ok {
		return nil
	}
	var r controlplanev1.BackupRecord
	if json.Unmarshal([]byte(v), &r) != nil {
		return nil
	}
	return &r
}

// BackupNext is when the next snapshot is due: the schedule's time after
// the last verified one, and not before BackupRetry after a failure that
// came later.
func BackupNext(owner client.Object, cfg *BackupConfig) time.Time {
	var last time.Time
	if ok := backupRecord(owner, BackupSucceededAnnotation); ok != nil {
		last = ok.Time.Time
	}
	next := cfg.Schedule.Next(last)
	if failed := backupRecord(owner, BackupFailedAnnotation); failed != nil && !failed.Time.Time.Before(last) {
		next = latest(next, failed.Time.Add(BackupRetry))
	}
	return next
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// defaultMaxAgeBeforeRisky is spec.backup.maxAgeBeforeRiskyChangeSeconds
// when unset.
const defaultMaxAgeBeforeRisky = time.Hour

// ReadBackup sets s.Backup from spec.backup (nil: no backups), its
// configuration (cfg, or cfgErr why it cannot be used) and the owner's
// records: whether a snapshot is due, the newest verified one, when a
// failed one may be tried again, and how old one may be for a risky step.
func ReadBackup(owner client.Object, spec *controlplanev1.BackupSpec, cfg *BackupConfig, cfgErr error, s *quorum.State) {
	if spec == nil {
		return
	}
	b := &s.Backup
	b.Configured, b.MaxAgeBeforeRisky = true, defaultMaxAgeBeforeRisky
	if v := spec.MaxAgeBeforeRiskyChangeSeconds; v != nil {
		b.MaxAgeBeforeRisky = time.Duration(*v) * time.Second
	}
	var lastStarted time.Time
	if ok := backupRecord(owner, BackupSucceededAnnotation); ok != nil {
		// The age a risky step allows counts from the verification: counted
		// from the start, a snapshot that took longer than the allowed age
		// (seconds on a loaded host, minutes for a large database) was too
		// old as soon as it was verified, and the step took one snapshot
		// after another without end.
		lastStarted, b.LastVerified = ok.Time.Time, ok.Time.Time
		if ok.VerifiedTime != nil {
			b.LastVerified = ok.VerifiedTime.Time
		}
	}
	if failed := backupRecord(owner, BackupFailedAnnotation); failed != nil && !failed.Time.Time.Before(lastStarted) {
		b.RetryAt = failed.Time.Add(BackupRetry)
	}
	switch {
	case cfgErr != nil:
		b.Problem = cfgErr.Error()
	case cfg == nil:
		b.Problem = "the backup configuration was not read"
	default:
		b.Due = !s.Now.Before(BackupNext(owner, cfg))
	}
}

// BackupStatus is status.backup and the BackupsHealthy condition of an
// owner with backups configured (cfg, or cfgErr why they cannot be
// taken). stored is how many snapshots the store held at the last
// retention pass (-1: unknown). It returns nil and no condition when the
// owner has no spec.backup.
func BackupStatus(owner client.Object, spec *controlplanev1.BackupSpec, cfg *BackupConfig, cfgErr error) (*controlplanev1.BackupStatus, *metav1.Condition) {
	if spec == nil {
		return nil, nil
	}
	st := &controlplanev1.BackupStatus{
		LastSuccessful: backupRecord(owner, BackupSucceededAnnotation),
		LastFailed:     backupRecord(owner, BackupFailedAnnotation),
	}
	if st.LastSuccessful != nil {
		st.Stored = st.LastSuccessful.Stored
	}
	cond := &metav1.Condition{Type: controlplanev1.BackupsHealthyCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.BackupsHealthyReason}
	switch {
	case cfgErr != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, controlplanev1.BackupConfigInvalidReason, cfgErr.Error()
	case st.LastFailed != nil && (st.LastSuccessful == nil || !st.LastFailed.Time.Before(&st.LastSuccessful.Time)):
		cond.Status, cond.Reason = metav1.ConditionFalse, controlplanev1.BackupFailedReason
		cond.Message = fmt.Sprintf("the backup started at %s failed: %s", st.LastFailed.Time.UTC().Format(time.RFC3339), st.LastFailed.Message)
	case st.LastSuccessful == nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionUnknown, controlplanev1.BackupPendingReason, "no snapshot taken yet; the first is taken once the cluster is healthy"
	default:
		cond.Message = fmt.Sprintf("the last snapshot (revision %d, %d bytes, from member %s) was verified; %d stored",
			st.LastSuccessful.Revision, st.LastSuccessful.SizeBytes, st.LastSuccessful.Member, st.Stored)
	}
	if cfg != nil {
		st.NextTime = &metav1.Time{Time: BackupNext(owner, cfg)}
	}
	return st, cond
}

// snapshot takes step d: it streams member d.MemberID's database into the
// store, has the agent of machine (the member's) restore it into a scratch
// etcd, writes the manifest once verified, applies retention, and records
// the outcome on the owner. A failure removes what it stored, and is
// recorded too.
func (x Executor) snapshot(ctx context.Context, d quorum.Decision, machine *clusterv1.Machine) error {
	cfg := x.Backup
	if cfg == nil {
		return errors.New("taking a snapshot: no backup configuration")
	}
	started := x.Now()
	m, stored, err := x.takeSnapshot(ctx, d, machine, cfg, started)
	rec := controlplanev1.BackupRecord{Time: metav1.Time{Time: started}, Object: m.Snapshot, Revision: m.Revision, SizeBytes: m.Size, Member: d.Machine}
	if err != nil {
		rec.Message = err.Error()
		if rerr := x.recordBackup(ctx, BackupFailedAnnotation, rec); rerr != nil {
			log.FromContext(ctx).Error(rerr, "recording the failed backup")
		}
		x.Metrics.backupFailed(x.Owner)
		return err
	}
	rec.Stored = stored
	if m.Verified != nil {
		rec.VerifiedTime = &metav1.Time{Time: m.Verified.Time}
	}
	x.Metrics.backupSucceeded(x.Owner, m, x.Now().Sub(started))
	return x.recordBackup(ctx, BackupSucceededAnnotation, rec)
}

func (x Executor) recordBackup(ctx context.Context, key string, rec controlplanev1.BackupRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return x.recordOnOwner(ctx, key, string(b))
}

// takeSnapshot does the work of snapshot, and returns the verified
// manifest and how many snapshots the store keeps after retention.
func (x Executor) takeSnapshot(ctx context.Context, d quorum.Decision, machine *clusterv1.Machine, cfg *BackupConfig, started time.Time) (backup.Manifest, int32, error) {
	m := backup.Manifest{Format: backup.FormatVersion, Cluster: cfg.Owner, Started: started, Encrypted: cfg.Encryption != nil,
		Snapshot: backup.Name(cfg.Owner, started, cfg.Encryption != nil), TakenFrom: idHex(d.MemberID)}
	if cfg.Encryption != nil {
		m.Recipient = cfg.Encryption.Recipient()
	}
	host := MachineIP(machine)
	switch {
	case host == "":
		return m, 0, fmt.Errorf("machine %s has no address to verify the snapshot on", d.Machine)
	case x.AgentTLS == nil:
		return m, 0, fmt.Errorf("qcp-manager has no client certificate for machine %s's agent yet", d.Machine)
	}
	store, err := s3store.Open(cfg.Target)
	if err != nil {
		return m, 0, err
	}
	members, err := x.Etcd.Members(ctx)
	if err != nil {
		return m, 0, fmt.Errorf("reading the members before the snapshot: %w", err)
	}
	for _, mb := range members {
		m.Members = append(m.Members, idHex(mb.ID))
	}
	if leader, err := x.Etcd.Leader(ctx); err == nil {
		m.Leader, m.EtcdVersion = idHex(leader.ID), leader.Version
	}
	sctx, cancel := context.WithTimeout(ctx, SnapshotTimeout)
	defer cancel()
	r, err := x.Etcd.Snapshot(sctx, d.MemberID)
	if err != nil {
		return m, 0, err
	}
	m.Size, m.SHA256, err = backup.Upload(sctx, store, m.Snapshot, r, cfg.Encryption)
	r.Close()
	if err != nil {
		return m, 0, fmt.Errorf("streaming the snapshot of member %x to the store: %w", d.MemberID, err)
	}
	// From here on, a failure takes the object back out: a snapshot
	// without a verified manifest is no backup.
	fail := func(err error) (backup.Manifest, int32, error) {
		rerr := errors.Join(store.Remove(context.WithoutCancel(ctx), m.Snapshot), removeAuthorities(context.WithoutCancel(ctx), store, m))
		if rerr != nil {
			err = fmt.Errorf("%w (and removing the unverified snapshot: %v)", err, rerr)
		}
		return m, 0, err
	}
	if cfg.Encryption != nil && len(cfg.Authorities) > 0 {
		if err := x.storeAuthorities(ctx, store, cfg, &m); err != nil {
			return fail(err)
		}
	}
	u, err := store.PresignGet(ctx, m.Snapshot, backupURLLifetime)
	if err != nil {
		return fail(err)
	}
	res, err := agent.VerifyBackup(ctx, x.AgentTLS, host, agent.BackupVerifyRequest{URL: u, CA: cfg.Target.CA, Manifest: m, Key: cfg.Key})
	if err != nil {
		return fail(fmt.Errorf("verifying snapshot %s on machine %s: %w", m.Snapshot, d.Machine, err))
	}
	m.Revision, m.Finished = res.Revision, x.Now()
	m.Verified = &backup.Verification{Time: m.Finished, Revision: res.Revision, Where: res.Machine}
	if err := store.PutSmall(ctx, backup.ManifestName(m.Snapshot), m.Encode(), "application/json"); err != nil {
		return fail(err)
	}
	stored, err := prune(ctx, store, cfg, x.Now())
	if err != nil {
		// The snapshot is good; retention tries again after the next.
		log.FromContext(ctx).Error(err, "applying the backup retention")
	}
	return m, stored, nil
}

// storeAuthorities stores the owner's certificate authorities beside
// snapshot m, encrypted to its key, and names them in m. Only an encrypted
// backup holds them: the authorities' keys sign every credential of the
// cluster.
func (x Executor) storeAuthorities(ctx context.Context, store *s3store.Store, cfg *BackupConfig, m *backup.Manifest) error {
	cas := backup.Authorities{}
	for purpose, name := range cfg.Authorities {
		var s corev1.Secret
		if err := x.Client.Get(ctx, client.ObjectKey{Namespace: cfg.Owner.Namespace, Name: name}, &s); err != nil {
			return fmt.Errorf("reading certificate authority Secret %s to store beside the snapshot: %w", name, err)
		}
		cas[purpose] = s.Data
	}
	b, err := json.Marshal(cas)
	if err != nil {
		return err
	}
	name := backup.AuthoritiesName(m.Snapshot)
	_, sum, err := backup.Upload(ctx, store, name, bytes.NewReader(b), cfg.Encryption)
	if err != nil {
		return fmt.Errorf("storing the certificate authorities beside the snapshot: %w", err)
	}
	m.Authorities, m.AuthoritiesSHA256 = name, sum
	return nil
}

// removeAuthorities removes the authorities stored beside m, if any.
func removeAuthorities(ctx context.Context, store *s3store.Store, m backup.Manifest) error {
	if m.Authorities == "" {
		return nil
	}
	return store.Remove(ctx, m.Authorities)
}

// prune applies retention to the owner's snapshots in the store, and
// removes snapshots without a manifest (uploads cut short) once they are
// an hour old. It returns how many snapshots are kept.
func prune(ctx context.Context, store *s3store.Store, cfg *BackupConfig, now time.Time) (int32, error) {
	manifests, snapshots, err := StoredBackups(ctx, store, cfg.Owner)
	errs := []error{err}
	for _, o := range snapshots {
		if !slices.ContainsFunc(manifests, func(m backup.Manifest) bool { return m.Snapshot == o.Name }) && now.Sub(o.LastModified) > time.Hour {
			errs = append(errs, store.Remove(ctx, o.Name), store.Remove(ctx, backup.AuthoritiesName(o.Name)))
		}
	}
	keep := int(0)
	if k := cfg.Spec.Retention.KeepLast; k != nil {
		keep = int(*k)
	}
	var maxAge time.Duration
	if a := cfg.Spec.Retention.MaxAgeSeconds; a != nil {
		maxAge = time.Duration(*a) * time.Second
	}
	if keep == 0 && maxAge == 0 {
		keep = defaultKeepLast
	}
	expired := backup.Expired(manifests, keep, maxAge, now)
	for _, m := range expired {
		// The manifest goes last: a snapshot without one is cleaned up
		// later, a manifest without its snapshot would be a lie.
		errs = append(errs, store.Remove(ctx, m.Snapshot), removeAuthorities(ctx, store, m), store.Remove(ctx, backup.ManifestName(m.Snapshot)))
	}
	return int32(len(manifests) - len(expired)), errors.Join(errs...)
}

// StoredBackups lists owner's backups in the store: the manifests, read,
// and the snapshot objects, with a manifest or not. A manifest that cannot
// be read is left out and named in the error.
func StoredBackups(ctx context.Context, store *s3store.Store, owner backup.ClusterRef) ([]backup.Manifest, []s3store.Object, error) {
	objs, err := store.List(ctx, backup.Dir(owner))
	if err != nil {
		return nil, nil, err
	}
	var manifests []backup.Manifest
	var snapshots []s3store.Object
	var errs []error
	for _, o := range objs {
		if backup.IsAuthorities(o.Name) {
			continue // removed with its snapshot
		}
		if !backup.IsManifest(o.Name) {
			snapshots = append(snapshots, o)
			continue
		}
		m, err := ReadManifest(ctx, store, backup.SnapshotOf(o.Name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		manifests = append(manifests, m)
	}
	return manifests, snapshots, errors.Join(errs...)
}

// ReadManifest reads the manifest of snapshot object snapshot.
func ReadManifest(ctx context.Context, store *s3store.Store, snapshot string) (backup.Manifest, error) {
	name := backup.ManifestName(snapshot)
	r, err := store.Get(ctx, name)
	if err != nil {
		return backup.Manifest{}, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return backup.Manifest{}, fmt.Errorf("reading manifest %s: %w", name, err)
	}
	m, err := backup.DecodeManifest(b)
	if err != nil {
		return backup.Manifest{}, fmt.Errorf("manifest %s: %w", name, err)
	}
	return m, nil
}

func idHex(id uint64) string { return fmt.Sprintf("%x", id) }

// SetBackupStatus sets status.backup (through status) and the
// BackupsHealthy condition of owner from obs; without spec.backup it
// removes both.
func SetBackupStatus(owner interface {
	client.Object
	conditions.Setter
}, spec *controlplanev1.BackupSpec, obs *Observation, status **controlplanev1.BackupStatus) {
	st, cond := BackupStatus(owner, spec, obs.Backup, obs.BackupErr)
	*status = st
	if cond == nil {
		conditions.Delete(owner, controlplanev1.BackupsHealthyCondition)
		return
	}
	conditions.Set(owner, *cond)
}
