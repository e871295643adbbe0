package backup

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// BumpRevision is how far a restore moves etcd's revision past the
// snapshot's (etcdutl snapshot restore --bump-revision, with
// --mark-compacted). A client that watched the lost cluster may have seen
// revisions up to the snapshot's plus whatever was written after it; the
// restored cluster must start above all of them, so that such a client's
// next watch is told its revision was compacted and relists, instead of
// silently skipping events. One billion covers 10,000 writes a second for
// more than a day past the snapshot, far beyond any schedule's gap, and
// leaves room for 9 billion such restores in etcd's int64 revision (the
// same figure OpenShift's quorum restore uses).
const BumpRevision = 1_000_000_000

// Member is who a restored data directory belongs to.
type Member struct {
	// Name is the member's name; InitialCluster is name=peerURL of the
	// new cluster, Token its --initial-cluster-token, PeerURL the
	// member's own.
	Name, InitialCluster, Token, PeerURL string
}

// RestoreData writes snapshot into work and restores it with etcdBin's
// etcdutl as the data directory dataDir of member m, its revision bumped
// by bump and marked compacted. etcdutl checks the snapshot's own hash.
// dataDir appears only once the restore is whole; work is left for the
// caller to remove.
func RestoreData(ctx context.Context, etcdBin string, snapshot io.Reader, work, dataDir string, m Member, bump int64) error {
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	file := filepath.Join(work, "snapshot.db")
	if err := writeFile(file, snapshot); err != nil {
		return err
	}
	restored := filepath.Join(work, "data")
	cmd := exec.CommandContext(ctx, etcdBin, "etcdutl", "snapshot", "restore", file, "--data-dir", restored,
		"--name", m.Name, "--initial-cluster", m.InitialCluster, "--initial-cluster-token", m.Token,
		"--initial-advertise-peer-urls", m.PeerURL, "--bump-revision", strconv.FormatInt(bump, 10), "--mark-compacted")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("etcdutl snapshot restore refused the snapshot: %w: %s", err, lastLine(out))
	}
	return os.Rename(restored, dataDir)
}
