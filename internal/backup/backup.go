// Package backup is the format of QCP's etcd backups: a snapshot object,
// optionally encrypted with age, and beside it a manifest that says what
// it holds and how to check it. It also restores a snapshot into a scratch
// etcd, to prove that it restores. It links no object store client: the
// machines' agent uses it with presigned URLs, and qcp-manager with
// internal/backup/s3store.
package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"path"
	"slices"
	"strings"
	"time"

	"filippo.io/age"
)

// FormatVersion is the manifest format this code writes and reads.
const FormatVersion = 1

// Manifest describes one snapshot. It is stored as <snapshot>.json beside
// the snapshot object, and written after the snapshot is complete: a
// snapshot without a manifest is an upload that did not finish.
type Manifest struct {
	Format int `json:"format"`
	// Snapshot is the snapshot object's name, below the store's prefix.
	Snapshot string `json:"snapshot"`
	// Cluster is the owner: namespace, kind and name.
	Cluster ClusterRef `json:"cluster"`
	// EtcdVersion is the version of the member that wrote the snapshot,
	// which a restore must run.
	EtcdVersion string `json:"etcdVersion"`
	// Revision is etcd's revision at the snapshot.
	Revision int64 `json:"revision"`
	// Members are the cluster's member IDs (hex) when it was taken.
	Members []string `json:"members"`
	// TakenFrom is the member ID (hex) that served the snapshot, and
	// Leader the ID of the leader then.
	TakenFrom string `json:"takenFrom"`
	Leader    string `json:"leader"`
	// Size and SHA256 are those of the stored object (the ciphertext when
	// encrypted).
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Encrypted: the object is an age file for Recipient.
	Encrypted bool   `json:"encrypted,omitempty"`
	Recipient string `json:"recipient,omitempty"`
	// Started and Finished bound the snapshot and its upload.
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Verified is set once the snapshot was read back and restored.
	Verified *Verification `json:"verified,omitempty"`
	// Authorities names the object that holds the cluster's certificate
	// authorities (AuthoritiesName), stored only beside an encrypted
	// snapshot, encrypted to the same key; AuthoritiesSHA256 is its
	// SHA-256.
	Authorities       string `json:"authorities,omitempty"`
	AuthoritiesSHA256 string `json:"authoritiesSHA256,omitempty"`
}

// Authorities are a cluster's certificate authorities as a backup holds
// them: each authority's Secret data, by its purpose (CAPI's Secret name
// suffix: ca, etcd, proxy, sa), so that a cluster of another name can be
// given them.
type Authorities map[string]map[string][]byte

// ClusterRef names the owner of a backup.
type ClusterRef struct {
	Namespace string `json:"namespace"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
}

// Verification records a snapshot's check.
type Verification struct {
	Time time.Time `json:"time"`
	// Revision is what the scratch etcd restored from it reported.
	Revision int64 `json:"revision"`
	// Where names the machine whose disk held the scratch restore.
	Where string `json:"where"`
}

// Dir is the directory of a cluster's backups, below the store's prefix.
func Dir(c ClusterRef) string { return path.Join(c.Namespace, strings.ToLower(c.Kind), c.Name) + "/" }

// Name is the object name of a snapshot of c taken at t: names sort by
// time.
func Name(c ClusterRef, t time.Time, encrypted bool) string {
	n := fmt.Sprintf("%s%s.db", Dir(c), t.UTC().Format("20060102T150405.000Z"))
	if encrypted {
		n += ".age"
	}
	return n
}

// ManifestName is the name of the manifest of snapshot object name.
func ManifestName(snapshot string) string { return snapshot + ".json" }

// SnapshotOf is the snapshot object that manifest name describes.
func SnapshotOf(manifest string) string { return strings.TrimSuffix(manifest, ".json") }

// IsManifest reports whether object name is a manifest.
func IsManifest(name string) bool { return strings.HasSuffix(name, ".json") }

// AuthoritiesName is the name of the authorities stored beside snapshot
// object snapshot.
func AuthoritiesName(snapshot string) string { return snapshot + ".authorities.age" }

// IsAuthorities reports whether object name holds a backup's authorities.
func IsAuthorities(name string) bool { return strings.HasSuffix(name, ".authorities.age") }

// Encode is the manifest as stored.
func (m Manifest) Encode() []byte {
	b, _ := json.MarshalIndent(m, "", "  ")
	return b
}

// DecodeManifest reads a stored manifest, refusing one of another format
// or with a field missing.
func DecodeManifest(b []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("not a QCP backup manifest: %w", err)
	}
	switch {
	case m.Format != FormatVersion:
		return Manifest{}, fmt.Errorf("manifest format %d, this QCP reads %d", m.Format, FormatVersion)
	case m.Snapshot == "" || m.Revision <= 0 || m.Size <= 0 || len(m.SHA256) != 64:
		return Manifest{}, fmt.Errorf("manifest of %q lacks its snapshot, revision, size or SHA-256", m.Snapshot)
	}
	return m, nil
}

// Encryption is the age key pair a backup is encrypted to.
type Encryption struct {
	identity *age.X25519Identity
}

// ParseKey reads an age X25519 identity (AGE-SECRET-KEY-1…, as age-keygen
// writes it; comment lines are skipped).
func ParseKey(data []byte) (*Encryption, error) {
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, err := age.ParseX25519Identity(line)
		if err != nil {
			return nil, errors.New("not an age identity: give the AGE-SECRET-KEY-1… line that age-keygen writes")
		}
		return &Encryption{identity: id}, nil
	}
	return nil, errors.New("no age identity found: give the AGE-SECRET-KEY-1… line that age-keygen writes")
}

// NewKey makes a new identity, in age-keygen's form.
func NewKey() ([]byte, error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, err
	}
	return []byte(id.String() + "\n"), nil
}

// Recipient is the public key snapshots are encrypted to.
func (e *Encryption) Recipient() string { return e.identity.Recipient().String() }

// Counter hashes and counts what passes through it.
type Counter struct {
	r io.Reader
	h hash.Hash
	n int64
}

// NewCounter counts and hashes what is read from r.
func NewCounter(r io.Reader) *Counter { return &Counter{r: r, h: sha256.New()} }

func (c *Counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// Size is the bytes read so far.
func (c *Counter) Size() int64 { return c.n }

// SHA256 is the hex SHA-256 of the bytes read so far.
func (c *Counter) SHA256() string { return hex.EncodeToString(c.h.Sum(nil)) }

// Seal returns a reader of src as it is to be stored: src itself, or an
// age stream of it (64 KiB chunks, each authenticated) when enc is set.
// The encryption runs as the reader is read; close the returned reader
// if the caller stops reading before the end.
func Seal(src io.Reader, enc *Encryption) io.ReadCloser {
	if enc == nil {
		return io.NopCloser(src)
	}
	pr, pw := io.Pipe()
	go func() {
		w, err := age.Encrypt(pw, enc.identity.Recipient())
		if err == nil {
			if _, err = io.Copy(w, src); err == nil {
				err = w.Close()
			}
		}
		pw.CloseWithError(err)
	}()
	return pr
}

// Open returns a reader of the snapshot stored as r: r itself, or the
// plaintext of an encrypted one. A wrong key fails here; a ciphertext
// changed in the middle fails on the read of its chunk.
func Open(r io.Reader, m Manifest, enc *Encryption) (io.Reader, error) {
	if !m.Encrypted {
		return r, nil
	}
	if enc == nil {
		return nil, fmt.Errorf("snapshot %s is encrypted (to %s), and no key was given", m.Snapshot, m.Recipient)
	}
	pr, err := age.Decrypt(r, enc.identity)
	if err != nil {
		return nil, fmt.Errorf("decrypting snapshot %s (encrypted to %s) with the key of %s: %w", m.Snapshot, m.Recipient, enc.Recipient(), err)
	}
	return pr, nil
}

// Check compares the size and SHA-256 of what was read with the
// manifest's.
func (c *Counter) Check(m Manifest) error {
	if c.Size() != m.Size || c.SHA256() != m.SHA256 {
		return fmt.Errorf("snapshot %s read back is %d bytes with SHA-256 %s; its manifest says %d bytes with %s: the stored object is not what was written",
			m.Snapshot, c.Size(), c.SHA256(), m.Size, m.SHA256)
	}
	return nil
}

// CheckStored reads a stored snapshot through and compares its size and
// SHA-256 with the manifest's.
func CheckStored(r io.Reader, m Manifest) error {
	c := NewCounter(r)
	if _, err := io.Copy(io.Discard, c); err != nil {
		return fmt.Errorf("reading snapshot %s back: %w", m.Snapshot, err)
	}
	return c.Check(m)
}

// Expired are the backups (manifests, any order) that retention removes:
// beyond the newest keepLast (0: no count limit), and older than maxAge
// (0: no age limit). The newest verified backup is always kept, so that
// retention never leaves a cluster without one it can restore.
func Expired(ms []Manifest, keepLast int, maxAge time.Duration, now time.Time) []Manifest {
	sorted := slices.SortedFunc(slices.Values(ms), func(a, b Manifest) int { return b.Started.Compare(a.Started) })
	keepVerified := slices.IndexFunc(sorted, func(m Manifest) bool { return m.Verified != nil })
	var out []Manifest
	for i, m := range sorted {
		if i == keepVerified {
			continue
		}
		if (keepLast > 0 && i >= keepLast) || (maxAge > 0 && now.Sub(m.Started) > maxAge) {
			out = append(out, m)
		}
	}
	return out
}

// Sink stores streams: s3store.Store.
type Sink interface {
	Put(ctx context.Context, name string, r io.Reader, contentType string) (int64, error)
}

// Upload streams snapshot (the member's stream, which etcd ends with the
// SHA-256 of the database) into the sink under name, sealed with enc,
// and returns the size and SHA-256 of what was stored.
func Upload(ctx context.Context, sink Sink, name string, snapshot io.Reader, enc *Encryption) (size int64, sum string, err error) {
	sealed := Seal(snapshot, enc)
	defer sealed.Close()
	c := NewCounter(sealed)
	n, err := sink.Put(ctx, name, c, "application/octet-stream")
	if err != nil {
		return 0, "", err
	}
	if n != c.Size() {
		return 0, "", fmt.Errorf("the store took %d bytes of snapshot %s, and %d were sent", n, name, c.Size())
	}
	return c.Size(), c.SHA256(), nil
}
