package backup_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestSnapshotStoreAndScratchRestore takes snapshots of a real 3-member
// etcd from a follower while a writer runs, streams them (plain and
// encrypted) into a real S3 store, reads them back, and restores each into
// a scratch etcd, which serves the snapshot's revision and every key
// acknowledged before the snapshot began. A wrong key, a flipped byte in
// the stored object and a flipped byte in the plaintext are each refused.
func TestSnapshotStoreAndScratchRestore(t *testing.T) {
	testkit.RequireBinaries(t, "etcd", "versitygw")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "bk", 3)
	srv, store := testkit.StartObjectStore(t, "backups")
	w, err := testkit.StartWriter(cl.Config(ps[0].ClientURL(), ps[1].ClientURL(), ps[2].ClientURL()), testkit.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			w.Stop(sctx)
		}
	}()
	if err := w.WaitAcknowledged(ctx, 200); err != nil {
		t.Fatal(err)
	}
	leader, err := cli.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	members, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var follower uint64
	for _, m := range members {
		if m.ID != leader.ID {
			follower = m.ID
			break
		}
	}
	key, err := backup.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	enc, err := backup.ParseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	etcdBin, err := binaries.Path("etcd", binaries.EtcdVersion)
	if err != nil {
		t.Fatal(err)
	}
	owner := backup.ClusterRef{Namespace: "ns", Kind: "QuorumControlPlane", Name: "c1"}
	for _, e := range []*backup.Encryption{nil, enc} {
		before := w.Acknowledged()
		leaderBefore, _ := cli.Leader(ctx)
		r, err := cli.Snapshot(ctx, follower)
		if err != nil {
			t.Fatal(err)
		}
		started := time.Now()
		name := backup.Name(owner, started, e != nil)
		size, sum, err := backup.Upload(ctx, store, name, r, e)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		leaderAfter, _ := cli.Leader(ctx)
		m := backup.Manifest{Format: backup.FormatVersion, Snapshot: name, Cluster: owner, Revision: 1, Size: size, SHA256: sum, Encrypted: e != nil}
		if e != nil {
			m.Recipient = e.Recipient()
		}
		restored := readAndRestore(ctx, t, store, m, e, etcdBin)
		if restored.Revision < leaderBefore.Revision || restored.Revision > leaderAfter.Revision {
			t.Errorf("encrypted=%v: restored revision %d, outside the leader's %d..%d around the snapshot", e != nil, restored.Revision, leaderBefore.Revision, leaderAfter.Revision)
		}
		// The writer's 4 workers each wrote their key before the first
		// snapshot.
		if restored.Keys < 4 {
			t.Errorf("encrypted=%v: %d keys restored after %d acknowledged writes", e != nil, restored.Keys, before)
		}
		t.Logf("encrypted=%v: %d bytes, revision %d, %d keys (%d writes acknowledged before)", e != nil, size, restored.Revision, restored.Keys, before)

		// Tampering.
		flipped := flipByte(t, filepath.Join(srv.DataDir, "backups", name), size/2)
		obj, err := store.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := backup.CheckStored(obj, m); err == nil || !strings.Contains(err.Error(), "not what was written") {
			t.Errorf("encrypted=%v: a flipped byte passed the read-back check: %v", e != nil, err)
		}
		obj.Close()
		if e != nil {
			other, _ := backup.NewKey()
			wrong, _ := backup.ParseKey(other)
			obj, _ := store.Get(ctx, name)
			if _, err := backup.Open(obj, m, wrong); err == nil || !strings.Contains(err.Error(), "decrypting") {
				t.Errorf("a wrong key opened the snapshot: %v", err)
			}
			obj.Close()
			obj, _ = store.Get(ctx, name)
			if _, err := backup.Open(obj, m, nil); err == nil || !strings.Contains(err.Error(), "no key was given") {
				t.Errorf("no key opened the snapshot: %v", err)
			}
			obj.Close()
			// The flipped chunk fails authentication.
			obj, _ = store.Get(ctx, name)
			plain, err := backup.Open(obj, m, e)
			if err == nil {
				_, err = io.Copy(io.Discard, plain)
			}
			if err == nil {
				t.Error("age took a flipped byte")
			}
			obj.Close()
		} else {
			// Without encryption, etcd's own hash refuses it.
			obj, _ := store.Get(ctx, name)
			if _, err := backup.ScratchRestore(ctx, etcdBin, t.TempDir()+"/scratch", obj); err == nil || !strings.Contains(err.Error(), "refused the snapshot") {
				t.Errorf("a snapshot with a flipped byte restored: %v", err)
			}
			obj.Close()
		}
		flipped()
	}
	stopped = true
	if rep := w.Stop(ctx); rep.Err() != nil {
		t.Fatal(rep.Err())
	}
}

func readAndRestore(ctx context.Context, t *testing.T, store *s3store.Store, m backup.Manifest, enc *backup.Encryption, etcdBin string) backup.Restored {
	t.Helper()
	obj, err := store.Get(ctx, m.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	if err := backup.CheckStored(obj, m); err != nil {
		t.Fatal(err)
	}
	obj.Close()
	obj, err = store.Get(ctx, m.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	plain, err := backup.Open(obj, m, enc)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "scratch")
	restored, err := backup.ScratchRestore(ctx, etcdBin, dir, plain)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the scratch directory %s is still there (%v)", dir, err)
	}
	return restored
}

// flipByte flips one byte of the file at off, and returns what puts it back.
func flipByte(t *testing.T, path string, off int64) func() {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the object's file in the store's directory: %v", err)
	}
	orig := bytes.Clone(b)
	b[off] ^= 0xff
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.WriteFile(path, orig, 0o600); err != nil {
			t.Error(fmt.Errorf("restoring %s: %w", path, err))
		}
	}
}
