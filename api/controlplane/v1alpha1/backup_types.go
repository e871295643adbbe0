package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BackupSpec configures scheduled, verified etcd backups to an
// S3-compatible object store. A snapshot is taken from a healthy follower
// (a one-member cluster's only member), streamed to the store, read back,
// and restored into a scratch etcd on one of the cluster's machines, which
// must serve the revision its manifest records. Only then does it count.
type BackupSpec struct {
	// target is the object store.
	// +required
	Target BackupTarget `json:"target"`
	// schedule says when to take a snapshot.
	// +required
	Schedule BackupSchedule `json:"schedule"`
	// retention says which snapshots to keep. The newest verified one is
	// always kept.
	// +optional
	Retention BackupRetention `json:"retention,omitempty,omitzero"`
	// maxAgeBeforeRiskyChangeSeconds: a rollout's first machine (a version
	// upgrade, a template change, an etcd upgrade) and every scale-down
	// wait until a snapshot verified less than this long ago exists, and
	// take one if none does. The age counts from the verification, so a
	// snapshot that takes longer than this to take and verify still lets
	// the step go. Remediation never waits. Defaults to 3600.
	// +optional
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=2592000
	MaxAgeBeforeRiskyChangeSeconds *int32 `json:"maxAgeBeforeRiskyChangeSeconds,omitempty"`
	// encryption encrypts each snapshot on its way to the store (age,
	// X25519). A snapshot holds every Secret of the cluster; without
	// encryption, the store's own protection is all it has.
	// +optional
	Encryption *BackupEncryption `json:"encryption,omitempty"`
}

// BackupTarget is an S3-compatible bucket and the credentials to reach it.
type BackupTarget struct {
	// endpoint is the store's URL: https://host[:port], without a path.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^https?://[^/]+/?$`
	Endpoint string `json:"endpoint"`
	// bucket holds the snapshots; it must exist.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	Bucket string `json:"bucket"`
	// prefix is put before every object name. Snapshots go below
	// <prefix>/<namespace>/<kind>/<name>/.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Prefix string `json:"prefix,omitempty"`
	// region is the bucket's region; us-east-1 if empty.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Region string `json:"region,omitempty"`
	// credentialsSecret names a Secret in this object's namespace with
	// the keys accessKeyID and secretAccessKey, and optionally ca.crt: a
	// PEM bundle to trust for the store's certificate.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	CredentialsSecret string `json:"credentialsSecret"`
}

// BackupSchedule is an interval or a cron expression, exactly one.
// +kubebuilder:validation:MinProperties=1
// +kubebuilder:validation:MaxProperties=1
type BackupSchedule struct {
	// intervalSeconds takes a snapshot when the last one is this old.
	// +optional
	// +kubebuilder:validation:Minimum=10
	// +kubebuilder:validation:Maximum=2592000
	IntervalSeconds *int32 `json:"intervalSeconds,omitempty"`
	// cron is a standard five-field cron expression in UTC
	// ("0 */6 * * *"), or a descriptor such as "@hourly".
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Cron string `json:"cron,omitempty"`
}

// BackupRetention says which snapshots to keep.
// +kubebuilder:validation:MinProperties=1
type BackupRetention struct {
	// keepLast keeps this many of the newest snapshots. Defaults to 7
	// when maxAgeSeconds is not set either.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	KeepLast *int32 `json:"keepLast,omitempty"`
	// maxAgeSeconds deletes snapshots older than this.
	// +optional
	// +kubebuilder:validation:Minimum=60
	MaxAgeSeconds *int64 `json:"maxAgeSeconds,omitempty"`
}

// BackupEncryption names the key snapshots are encrypted with.
type BackupEncryption struct {
	// keySecret names a Secret in this object's namespace whose key "key"
	// holds an age X25519 identity (the AGE-SECRET-KEY-1… line that
	// age-keygen writes). Keep a copy elsewhere: without it no snapshot can
	// be restored.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	KeySecret string `json:"keySecret"`
}

// BackupStatus reports the backups.
type BackupStatus struct {
	// lastSuccessful is the newest snapshot that was stored and verified.
	// +optional
	LastSuccessful *BackupRecord `json:"lastSuccessful,omitempty"`
	// lastFailed is the newest attempt that failed, and why.
	// +optional
	LastFailed *BackupRecord `json:"lastFailed,omitempty"`
	// stored is how many snapshots of this cluster the store holds.
	// +optional
	Stored int32 `json:"stored,omitempty"`
	// nextTime is when the schedule takes the next snapshot.
	// +optional
	NextTime *metav1.Time `json:"nextTime,omitempty"`
}

// BackupRecord is one snapshot attempt.
type BackupRecord struct {
	// time is when the snapshot began.
	// +required
	Time metav1.Time `json:"time"`
	// verifiedTime is when the snapshot was verified (restored into a
	// scratch etcd that answered): the end of a successful one. Unset on a
	// failed attempt, and on records written before the field existed.
	// +optional
	VerifiedTime *metav1.Time `json:"verifiedTime,omitempty"`
	// object is the snapshot's name in the store, below the prefix.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Object string `json:"object,omitempty"`
	// revision is etcd's revision in the snapshot.
	// +optional
	Revision int64 `json:"revision,omitempty"`
	// sizeBytes is the stored object's size.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// member is the etcd member the snapshot was taken from.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Member string `json:"member,omitempty"`
	// stored is how many snapshots the store kept after this one's
	// retention pass.
	// +optional
	Stored int32 `json:"stored,omitempty"`
	// message says why an attempt failed.
	// +optional
	// +kubebuilder:validation:MaxLength=10240
	Message string `json:"message,omitempty"`
}

// RestoreSpec builds a new cluster's etcd from a stored snapshot instead of
// an empty one. It is read only until etcd has its first member: the
// first machine restores the snapshot, the others join it as learners.
type RestoreSpec struct {
	// from names the snapshot.
	// +required
	From RestoreSource `json:"from"`
}

// RestoreSource is a snapshot in an object store: the newest verified
// snapshot of a named cluster, or one object.
// +kubebuilder:validation:XValidation:rule="has(self.cluster) != has(self.object)",message="set exactly one of cluster (the newest verified snapshot of that cluster) and object (one snapshot, as status.backup names it)"
type RestoreSource struct {
	// target is the object store; empty: spec.backup.target.
	// +optional
	Target *BackupTarget `json:"target,omitempty"`
	// cluster restores the newest verified snapshot that the control
	// plane (for an EtcdCluster: the EtcdCluster) of this name in this
	// namespace stored under the target.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Cluster string `json:"cluster,omitempty"`
	// object restores this snapshot, named as status.backup names it
	// (below the target's prefix). Its manifest must exist: only a
	// verified snapshot is restored.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Object string `json:"object,omitempty"`
	// encryption is the key of an encrypted snapshot; empty:
	// spec.backup.encryption.
	// +optional
	Encryption *BackupEncryption `json:"encryption,omitempty"`
}

// Authorities of a restored cluster: the ones in the backup (existing
// credentials keep working), or new ones (the backup was not encrypted, so
// it holds none).
const (
	RestoredAuthorities = "FromBackup"
	NewAuthorities      = "New"
)

// RestoreStatus is what a restore restored.
type RestoreStatus struct {
	// object is the snapshot restored, below the target's prefix.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Object string `json:"object,omitempty"`
	// revision is etcd's revision in the snapshot.
	// +optional
	Revision int64 `json:"revision,omitempty"`
	// startRevision is the revision the restored cluster starts from: the
	// snapshot's, bumped, so that a client watching from before the
	// restore is told its revision was compacted instead of missing
	// events.
	// +optional
	StartRevision int64 `json:"startRevision,omitempty"`
	// authorities says where the certificate authorities came from:
	// FromBackup or New.
	// +optional
	// +kubebuilder:validation:Enum=FromBackup;New
	Authorities string `json:"authorities,omitempty"`
	// time is when the first machine was created to restore it.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
	// nodesRemoved are the Nodes of machines that no longer exist that
	// QCP deleted once the restored cluster ran.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MaxLength=253
	NodesRemoved []string `json:"nodesRemoved,omitempty"`
}
