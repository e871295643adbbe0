package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// RestoreRecordAnnotation records, on the owner, the restore its first
// machine was created with (a RestoreStatus in JSON); status.restore is
// rebuilt from it.
const RestoreRecordAnnotation = "controlplane.cluster.x-k8s.io/qcp-restore"

// restoreURLLifetime is how long the first machine's presigned URL reads
// the snapshot. A machine that has not started its restore by then fails
// its bootstrap, and the planner replaces it (a new one gets a new URL).
const restoreURLLifetime = time.Hour

// Restore is a snapshot a new cluster starts from, checked: its manifest
// exists, the stored object's size and SHA-256 match it, and it decrypts
// with the key.
type Restore struct {
	Manifest backup.Manifest
	// URL reads the snapshot for restoreURLLifetime.
	URL string
	// CA is the store's CA, Key the age identity of an encrypted
	// snapshot.
	CA, Key []byte
	// Authorities are those stored beside the snapshot; nil when it holds
	// none (it is not encrypted).
	Authorities backup.Authorities
}

// Bootstrap is what the first machine's bootstrap data carries.
func (r *Restore) Bootstrap() *bootstrap.EtcdRestore {
	return &bootstrap.EtcdRestore{URL: r.URL, CA: string(r.CA), Snapshot: r.Manifest.Snapshot, Size: r.Manifest.Size, SHA256: r.Manifest.SHA256,
		Revision: r.Manifest.Revision, Key: string(r.Key), BumpRevision: backup.BumpRevision}
}

// Record is what the owner records when its first machine is created.
func (r *Restore) Record(now time.Time) controlplanev1.RestoreStatus {
	st := controlplanev1.RestoreStatus{Object: r.Manifest.Snapshot, Revision: r.Manifest.Revision, StartRevision: r.Manifest.Revision + backup.BumpRevision,
		Authorities: controlplanev1.NewAuthorities}
	if r.Authorities != nil {
		st.Authorities = controlplanev1.RestoredAuthorities
	}
	st.Time = &metav1.Time{Time: now}
	return st
}

// checkedSnapshots remembers, per owner, the snapshots whose content was
// read through and found whole, so that each round does not download it
// again; a failure is tried again after restoreRecheck.
var checkedSnapshots sync.Map // restoreCheckKey → restoreCheck

type restoreCheckKey struct {
	owner            types.UID
	snapshot, sha256 string
}

type restoreCheck struct {
	err error
	at  time.Time
}

const restoreRecheck = 30 * time.Second

// RestorePoll is how often an owner whose snapshot cannot be used looks
// again: no watch tells of a fixed store or Secret.
const RestorePoll = 15 * time.Second

// ResolveRestore finds and checks the snapshot spec names for owner (of
// kind, with backup spec b, whose target and key it falls back to). The
// error names the field or Secret at fault and the fix; no machine is
// created while there is one.
func ResolveRestore(ctx context.Context, c client.Reader, owner client.Object, kind string, spec *controlplanev1.RestoreSpec, b *controlplanev1.BackupSpec, now time.Time) (*Restore, error) {
	from := spec.From
	target, field := from.Target, "spec.restore.from.target"
	if target == nil && b != nil {
		target, field = &b.Target, "spec.backup.target"
	}
	if target == nil {
		return nil, errors.New("spec.restore.from.target: no object store is named; set it, or spec.backup.target")
	}
	creds, err := secretData(ctx, c, owner.GetNamespace(), target.CredentialsSecret, field+".credentialsSecret", BackupAccessKeyIDKey, BackupSecretAccessKeyKey)
	if err != nil {
		return nil, err
	}
	st := s3store.Target{Endpoint: target.Endpoint, Bucket: target.Bucket, Prefix: target.Prefix, Region: target.Region,
		AccessKeyID: string(creds[BackupAccessKeyIDKey]), SecretAccessKey: string(creds[BackupSecretAccessKeyKey]), CA: creds[BackupCAKey]}
	store, err := s3store.Open(st)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	if err := store.Check(ctx); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	r := &Restore{CA: st.CA}
	if r.Manifest, err = restoreManifest(ctx, store, owner.GetNamespace(), kind, from); err != nil {
		return nil, err
	}
	var enc *backup.Encryption
	if r.Manifest.Encrypted {
		e, efield := from.Encryption, "spec.restore.from.encryption"
		if e == nil && b != nil && b.Encryption != nil {
			e, efield = b.Encryption, "spec.backup.encryption"
		}
		if e == nil {
			return nil, fmt.Errorf("snapshot %s is encrypted (to %s): name the Secret with its key in spec.restore.from.encryption.keySecret", r.Manifest.Snapshot, r.Manifest.Recipient)
		}
		data, err := secretData(ctx, c, owner.GetNamespace(), e.KeySecret, efield+".keySecret", BackupEncryptionKeyKey)
		if err != nil {
			return nil, err
		}
		if enc, err = backup.ParseKey(data[BackupEncryptionKeyKey]); err != nil {
			return nil, fmt.Errorf("Secret %s/%s (%s.keySecret), key %q: %w", owner.GetNamespace(), e.KeySecret, efield, BackupEncryptionKeyKey, err)
		}
		if enc.Recipient() != r.Manifest.Recipient {
			return nil, fmt.Errorf("snapshot %s is encrypted to %s, and the key in Secret %s/%s (%s.keySecret) is another one's (%s): give the key the backup was encrypted with",
				r.Manifest.Snapshot, r.Manifest.Recipient, owner.GetNamespace(), e.KeySecret, efield, enc.Recipient())
		}
		r.Key = data[BackupEncryptionKeyKey]
	}
	key := restoreCheckKey{owner: owner.GetUID(), snapshot: r.Manifest.Snapshot, sha256: r.Manifest.SHA256}
	v, ok := checkedSnapshots.Load(key)
	if !ok || (v.(restoreCheck).err != nil && now.Sub(v.(restoreCheck).at) >= restoreRecheck) {
		v = restoreCheck{err: checkSnapshot(ctx, store, r.Manifest, enc), at: now}
		checkedSnapshots.Store(key, v)
	}
	if err := v.(restoreCheck).err; err != nil {
		return nil, err
	}
	if r.Manifest.Authorities != "" && enc != nil {
		if r.Authorities, err = readAuthorities(ctx, store, r.Manifest, enc); err != nil {
			return nil, err
		}
	}
	if r.URL, err = store.PresignGet(ctx, r.Manifest.Snapshot, restoreURLLifetime); err != nil {
		return nil, err
	}
	return r, nil
}

// restoreManifest is the manifest of the snapshot from names: the object
// it names, or the newest verified snapshot of its cluster.
func restoreManifest(ctx context.Context, store *s3store.Store, namespace, kind string, from controlplanev1.RestoreSource) (backup.Manifest, error) {
	if from.Object != "" {
		m, err := ReadManifest(ctx, store, from.Object)
		if err != nil {
			return m, fmt.Errorf("spec.restore.from.object: %w; only a verified snapshot, which has a manifest, is restored", err)
		}
		if m.Verified == nil {
			return m, fmt.Errorf("spec.restore.from.object: snapshot %s was never verified; name another", from.Object)
		}
		return m, nil
	}
	ref := backup.ClusterRef{Namespace: namespace, Kind: kind, Name: from.Cluster}
	manifests, _, err := StoredBackups(ctx, store, ref)
	if err != nil && len(manifests) == 0 {
		return backup.Manifest{}, fmt.Errorf("spec.restore.from.cluster: listing the backups of %s %s/%s: %w", kind, namespace, from.Cluster, err)
	}
	manifests = slices.DeleteFunc(manifests, func(m backup.Manifest) bool { return m.Verified == nil })
	if len(manifests) == 0 {
		return backup.Manifest{}, fmt.Errorf("spec.restore.from.cluster: the store holds no verified snapshot of %s %s/%s under %s: check the cluster's name, the target's bucket and prefix",
			kind, namespace, from.Cluster, backup.Dir(ref))
	}
	return slices.MaxFunc(manifests, func(a, b backup.Manifest) int { return a.Started.Compare(b.Started) }), nil
}

// checkSnapshot reads the stored snapshot through: its size and SHA-256
// must be the manifest's, and it must decrypt whole.
func checkSnapshot(ctx context.Context, store *s3store.Store, m backup.Manifest, enc *backup.Encryption) error {
	body, err := store.Get(ctx, m.Snapshot)
	if err != nil {
		return fmt.Errorf("reading snapshot %s: %w", m.Snapshot, err)
	}
	defer body.Close()
	counted := backup.NewCounter(body)
	plain, err := backup.Open(counted, m, enc)
	if err != nil {
		return err
	}
	_, readErr := io.Copy(io.Discard, plain)
	// What is left of the object is read whatever the decryption said: a
	// checksum that does not match names the fault better than a chunk
	// that does not authenticate.
	if _, err := io.Copy(io.Discard, counted); err != nil {
		return fmt.Errorf("reading snapshot %s: %w", m.Snapshot, err)
	}
	if err := counted.Check(m); err != nil {
		return err
	}
	if readErr != nil {
		return fmt.Errorf("reading snapshot %s: %w", m.Snapshot, readErr)
	}
	return nil
}

// readAuthorities reads the authorities stored beside snapshot m.
func readAuthorities(ctx context.Context, store *s3store.Store, m backup.Manifest, enc *backup.Encryption) (backup.Authorities, error) {
	body, err := store.Get(ctx, m.Authorities)
	if err != nil {
		return nil, fmt.Errorf("reading the certificate authorities stored beside snapshot %s: %w", m.Snapshot, err)
	}
	defer body.Close()
	counted := backup.NewCounter(io.LimitReader(body, 1<<20))
	plain, err := backup.Open(counted, backup.Manifest{Snapshot: m.Authorities, Encrypted: true, Recipient: m.Recipient}, enc)
	if err != nil {
		return nil, err
	}
	var cas backup.Authorities
	if err := json.NewDecoder(plain).Decode(&cas); err != nil {
		return nil, fmt.Errorf("the certificate authorities stored beside snapshot %s: %w", m.Snapshot, err)
	}
	if _, err := io.Copy(io.Discard, counted); err != nil {
		return nil, err
	}
	if counted.SHA256() != m.AuthoritiesSHA256 {
		return nil, fmt.Errorf("the certificate authorities stored beside snapshot %s are not what was written (SHA-256 %s, the manifest says %s)",
			m.Snapshot, counted.SHA256(), m.AuthoritiesSHA256)
	}
	return cas, nil
}

// ReadRestoreRecord reads the owner's restore record; nil without one.
func ReadRestoreRecord(owner client.Object) *controlplanev1.RestoreStatus {
	v, ok := owner.GetAnnotations()[RestoreRecordAnnotation]
	if !ok {
		return nil
	}
	var st controlplanev1.RestoreStatus
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		return nil
	}
	return &st
}

// RestoreAuthorities creates the authority Secrets of cluster from a
// backup's, so that the restored cluster keeps its credentials: CAPI's
// names, type and label, owned by owner, as LookupOrGenerate makes them.
// A Secret that exists must hold the backup's authority: a restore never
// replaces one, nor starts beside another. It returns the Secrets it
// created.
func RestoreAuthorities(ctx context.Context, c client.Client, cluster *clusterv1.Cluster, owner metav1.OwnerReference, cas backup.Authorities) ([]string, error) {
	var created []string
	for _, purpose := range slices.Sorted(maps.Keys(cas)) {
		name := secret.Name(cluster.Name, secret.Purpose(purpose))
		var have corev1.Secret
		err := c.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, &have)
		switch {
		case err == nil:
			if !bytes.Equal(have.Data[secret.TLSCrtDataName], cas[purpose][secret.TLSCrtDataName]) {
				return created, fmt.Errorf("Secret %s/%s holds another certificate authority than the backup's: the restore would cut the old credentials off; delete the Secret, and QCP puts the backup's in its place",
					cluster.Namespace, name)
			}
			continue
		case !apierrors.IsNotFound(err):
			return created, err
		}
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: name,
				Labels:          map[string]string{clusterv1.ClusterNameLabel: cluster.Name},
				OwnerReferences: []metav1.OwnerReference{owner}},
			Type: clusterv1.ClusterSecretType,
			Data: cas[purpose],
		}
		if err := c.Create(ctx, s); err != nil {
			return created, fmt.Errorf("creating Secret %s/%s from the backup's certificate authority: %w", cluster.Namespace, name, err)
		}
		created = append(created, name)
	}
	return created, nil
}

// SetRestoreSourceCondition sets owner's Restored condition from a
// resolution of its snapshot, before the first machine: False naming the
// fault (nothing is made until it is fixed), or the snapshot found.
func SetRestoreSourceCondition(owner interface {
	client.Object
	conditions.Setter
}, res *Restore, err error) {
	switch {
	case err != nil:
		conditions.Set(owner, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionFalse,
			Reason: controlplanev1.RestoreSourceInvalidReason, Message: "No machine is created until the snapshot can be restored: " + err.Error()})
	case res != nil && ReadRestoreRecord(owner) == nil:
		conditions.Set(owner, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.RestoringReason,
			Message: fmt.Sprintf("Snapshot %s (revision %d) is found and checked; the first machine restores it", res.Manifest.Snapshot, res.Manifest.Revision)})
	}
}

// SetRestoreStatus sets status.restore (through status) and the Restored
// condition from owner's record, once its first machine was created to
// restore; before that, SetRestoreSourceCondition set the condition.
// requested: spec.restore is set; initialized: the restored cluster runs;
// problem: why the snapshot cannot be read this round.
func SetRestoreStatus(owner interface {
	client.Object
	conditions.Setter
}, requested, initialized bool, problem error, status **controlplanev1.RestoreStatus) {
	rec := ReadRestoreRecord(owner)
	*status = rec
	switch {
	case !requested:
		conditions.Delete(owner, controlplanev1.RestoredCondition)
	case rec == nil:
	case !initialized && problem != nil:
		conditions.Set(owner, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.RestoreSourceInvalidReason,
			Message: fmt.Sprintf("The first machine restores snapshot %s; if it has to be replaced, the next one waits until the snapshot can be read again: %v", rec.Object, problem)})
	case !initialized:
		conditions.Set(owner, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.RestoringReason,
			Message: fmt.Sprintf("The first machine restores snapshot %s (revision %d) and starts at revision %d", rec.Object, rec.Revision, rec.StartRevision)})
	case rec.Authorities == controlplanev1.RestoredAuthorities:
		conditions.Set(owner, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.RestoredReason,
			Message: fmt.Sprintf("Restored snapshot %s (revision %d), starting at revision %d, with the certificate authorities from the backup: existing credentials keep working",
				rec.Object, rec.Revision, rec.StartRevision)})
	default:
		conditions.Set(owner, metav1.Condition{Type: controlplanev1.RestoredCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.RestoredNewAuthoritiesReason,
			Message: fmt.Sprintf("Restored snapshot %s (revision %d), starting at revision %d, with new certificate authorities: the backup was not encrypted, so it holds none; credentials issued before the restore (client certificates, service-account tokens) no longer work",
				rec.Object, rec.Revision, rec.StartRevision)})
	}
}

// PrepareRestore is what an owner does each round while its etcd is still
// to be restored from spec: it finds and checks the snapshot
// (ResolveRestore), puts the backup's certificate authorities in place
// before any are generated (RestoreAuthorities, owned by ownerRef), and
// sets the Restored condition. An error is the source's fault: the owner
// then makes nothing.
func PrepareRestore(ctx context.Context, c client.Client, recorder record.EventRecorder, owner interface {
	client.Object
	conditions.Setter
}, ownerRef metav1.OwnerReference, kind string, cluster *clusterv1.Cluster, spec *controlplanev1.RestoreSpec, b *controlplanev1.BackupSpec, now time.Time) (*Restore, error) {
	res, err := ResolveRestore(ctx, c, owner, kind, spec, b, now)
	if err == nil && res.Authorities != nil {
		var created []string
		created, err = RestoreAuthorities(ctx, c, cluster, ownerRef, res.Authorities)
		for _, name := range created {
			recorder.Eventf(owner, corev1.EventTypeNormal, "AuthorityRestored", "Created Secret %s from the certificate authority in the backup", name)
		}
	}
	SetRestoreSourceCondition(owner, res, err)
	return res, err
}

// RecordRestore records on owner, before its first machine is created,
// the restore that machine starts from.
func RecordRestore(ctx context.Context, c client.Client, recorder record.EventRecorder, owner client.Object, res *Restore, now time.Time) error {
	b, err := json.Marshal(res.Record(now))
	if err != nil {
		return err
	}
	if err := (Executor{Client: c, Owner: owner}).recordOnOwner(ctx, RestoreRecordAnnotation, string(b)); err != nil {
		return fmt.Errorf("recording the restore of snapshot %s before creating the first machine: %w", res.Manifest.Snapshot, err)
	}
	recorder.Eventf(owner, corev1.EventTypeNormal, "Restoring", "Creating the first machine from snapshot %s (revision %d)", res.Manifest.Snapshot, res.Manifest.Revision)
	return nil
}

// PlannerRestore is the planner's view of a restore (State.Restore, while
// etcd never had a member): the snapshot found, or why it cannot be used.
// A problem that arises once the first machine was created no longer
// stops the owner's rounds; the planner then waits only where it would
// create a first machine again.
func PlannerRestore(res *Restore, err error) quorum.RestoreState {
	switch {
	case err != nil:
		return quorum.RestoreState{Requested: true, Problem: err.Error()}
	case res != nil:
		return quorum.RestoreState{Requested: true, Snapshot: res.Manifest.Snapshot}
	}
	return quorum.RestoreState{}
}

// BackupSecrets are the Secrets spec.backup b and spec.restore r name: the
// stores' credentials and the keys.
func BackupSecrets(b *controlplanev1.BackupSpec, r *controlplanev1.RestoreSpec) []string {
	var out []string
	if b != nil {
		out = append(out, b.Target.CredentialsSecret)
		if b.Encryption != nil {
			out = append(out, b.Encryption.KeySecret)
		}
	}
	if r != nil {
		if t := r.From.Target; t != nil {
			out = append(out, t.CredentialsSecret)
		}
		if e := r.From.Encryption; e != nil {
			out = append(out, e.KeySecret)
		}
	}
	return out
}
