package backup

import (
	"context"
	"encoding/json"
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
	_, err := restore(ctx, etcdBin, snapshot, work, dataDir, m, bump, true)
	return err
}

// RestoreDB is RestoreData for db, the bbolt file of a stopped member's
// data directory (<data-dir>/member/snap/db), as when a cluster that lost
// its quorum starts again from a survivor's data. It copies db into work
// first, so that neither etcdutl nor a failed restore touches the
// member's own files, and returns the copy's status: its revision is the
// one kept, before the bump. Such a file carries no appended hash, so
// etcdutl's hash check is skipped (--skip-hash-check); ReadDBStatus checks
// bbolt's pages instead, before the restore.
//
// The member must have stopped: a running one changes the file as it is
// copied. One killed (SIGKILL) leaves a whole file, which may lack the
// writes of its last backend batch (etcd commits bbolt every 100 ms; the
// WAL holds the rest, and only etcd itself replays it).
func RestoreDB(ctx context.Context, etcdBin, db, work, dataDir string, m Member, bump int64) (DBStatus, error) {
	f, err := os.Open(db)
	if err != nil {
		return DBStatus{}, err
	}
	defer f.Close()
	return restore(ctx, etcdBin, f, work, dataDir, m, bump, false)
}

// restore writes src into work, reads its status unless it is a snapshot
// with its hash, and restores it into dataDir through work.
func restore(ctx context.Context, etcdBin string, src io.Reader, work, dataDir string, m Member, bump int64, hashed bool) (DBStatus, error) {
	if err := os.MkdirAll(work, 0o700); err != nil {
		return DBStatus{}, err
	}
	file := filepath.Join(work, "snapshot.db")
	if err := writeFile(file, src); err != nil {
		return DBStatus{}, err
	}
	var st DBStatus
	args := []string{"etcdutl", "snapshot", "restore", file, "--data-dir", filepath.Join(work, "data"),
		"--name", m.Name, "--initial-cluster", m.InitialCluster, "--initial-cluster-token", m.Token,
		"--initial-advertise-peer-urls", m.PeerURL, "--bump-revision", strconv.FormatInt(bump, 10), "--mark-compacted"}
	if !hashed {
		var err error
		if st, err = ReadDBStatus(ctx, etcdBin, file); err != nil {
			return DBStatus{}, err
		}
		args = append(args, "--skip-hash-check")
	}
	cmd := exec.CommandContext(ctx, etcdBin, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return DBStatus{}, fmt.Errorf("etcdutl snapshot restore refused the snapshot: %w: %s", err, lastLine(out))
	}
	return st, os.Rename(filepath.Join(work, "data"), dataDir)
}

// DBStatus is what `etcdutl snapshot status` reads of a snapshot, or of a
// member's bbolt file.
type DBStatus struct {
	// Hash is a CRC of every bucket's keys and values, not of the file.
	// Revision is the highest revision among the stored keys (a
	// compaction may have dropped the tombstone of a later delete), and
	// TotalKey the number of live keys. TotalSize is the bbolt file's size
	// in bytes.
	Hash      uint32 `json:"hash"`
	Revision  int64  `json:"revision"`
	TotalKey  int64  `json:"totalKey"`
	TotalSize int64  `json:"totalSize"`
}

// ReadDBStatus reads the status of file, a snapshot or a bbolt file, with
// etcdBin's etcdutl, which opens it read-only and checks bbolt's pages
// first: a file that fails the check is an error, as is one without a
// single key, which has no revision.
func ReadDBStatus(ctx context.Context, etcdBin, file string) (DBStatus, error) {
	out, err := exec.CommandContext(ctx, etcdBin, "etcdutl", "snapshot", "status", file, "-w", "json").Output()
	if err != nil {
		return DBStatus{}, fmt.Errorf("etcdutl snapshot status refused %s: %w: %s", file, err, lastLine(stderrOf(err)))
	}
	var st DBStatus
	if err := json.Unmarshal(out, &st); err != nil || st.Revision <= 0 {
		return DBStatus{}, fmt.Errorf("etcdutl snapshot status gave no revision for %s (%v): %s", file, err, lastLine(out))
	}
	return st, nil
}
