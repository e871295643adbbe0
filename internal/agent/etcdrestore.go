package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/qcp-dev/qcp/internal/backup"
)

// restoreDir holds a restore's download and its restored data until the
// data moves into place; the agent removes it before each attempt.
const restoreDir = "etcd-restore"

// restoreEtcd builds the etcd data directory from the bootstrap data's
// snapshot, before etcd's first start: it downloads the snapshot through
// its checksum and decryption, and restores it with etcdutl, as member
// a.machine.Name of a new cluster initialCluster, its revision bumped and
// marked compacted. A data directory that exists is left alone: the
// restore already happened, and etcd may have written since. The data
// moves into place only once whole, so that a restore cut short is begun
// again, never started from.
func (a *machineCtx) restoreEtcd(ctx context.Context, initialCluster string) error {
	r := a.doc.Etcd.Local.Restore
	data := filepath.Join(a.dir, "etcd")
	if _, err := os.Stat(data); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	m := backup.Manifest{Snapshot: r.Snapshot, Size: r.Size, SHA256: r.SHA256, Encrypted: r.Key != ""}
	var enc *backup.Encryption
	if r.Key != "" {
		var err error
		if enc, err = backup.ParseKey([]byte(r.Key)); err != nil {
			return fmt.Errorf("etcd.local.restore.key: %w", err)
		}
	}
	dir := filepath.Join(a.dir, restoreDir)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	snap, body, err := openStored(ctx, a.dir, r.URL, []byte(r.CA), m, enc)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", r.Snapshot, err)
	}
	defer body.Close()
	member := backup.Member{Name: a.machine.Name, InitialCluster: initialCluster, Token: a.doc.ClusterName, PeerURL: a.url("https", EtcdPeerPort)}
	if err := backup.RestoreData(ctx, a.bins["etcd"], snap, dir, data, member, r.BumpRevision); err != nil {
		return fmt.Errorf("snapshot %s: %w", r.Snapshot, err)
	}
	a.log.Info("etcd restored from a snapshot", "snapshot", r.Snapshot, "revision", r.Revision, "bumpRevision", r.BumpRevision)
	return nil
}
