package backup_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestRestoreDBOfALostCluster stops every member of a real 3-member etcd,
// the survivor last as after a quorum loss, restores the survivor's bbolt
// file (not a snapshot: it has no hash) with RestoreDB as a new cluster of
// its own, and starts the survivor on the result with its old command
// line. It serves alone, under a new member ID, every key of the kept
// revision at that revision plus the bump, and refuses older revisions as
// compacted. A member killed with SIGKILL leaves a file that restores as
// well, though it may lack the writes of etcd's last backend batch; each
// key is then there exactly when its revision is within the kept one.
// RestoreData, for snapshots, still refuses such a file for its lack of a
// hash.
func TestRestoreDBOfALostCluster(t *testing.T) {
	testkit.RequireBinaries(t, "etcd")
	etcdBin, err := binaries.Path("etcd", binaries.EtcdVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		stop func(*testkit.EtcdProcess) error
	}{
		{"stopped", (*testkit.EtcdProcess).Stop},
		{"killed", (*testkit.EtcdProcess).Kill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "rdb", 3)
			survivor := ps[0]
			written := putKeys(ctx, t, cli, 200)
			last := written[len(written)-1].rev
			// The survivor is the member that applied the most, as the
			// manager would pick it; here it applied everything.
			if err := testkit.Eventually(ctx, 50*time.Millisecond, "the survivor to apply the last write", func(ctx context.Context) error {
				st, err := cli.Status(ctx, survivor.ClientURL())
				if err == nil && st.Revision != last {
					err = fmt.Errorf("revision %d, last write %d", st.Revision, last)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			before, err := cli.Members(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []*testkit.EtcdProcess{ps[1], ps[2], survivor} {
				if err := tc.stop(p); err != nil {
					t.Fatal(err)
				}
			}

			old := survivor.DataDir + "-before"
			if err := os.Rename(survivor.DataDir, old); err != nil {
				t.Fatal(err)
			}
			const bump = 1000
			m := backup.Member{Name: survivor.Name, InitialCluster: survivor.Name + "=" + survivor.PeerURL(), Token: "rdb-recovered", PeerURL: survivor.PeerURL()}
			db := filepath.Join(old, "member", "snap", "db")
			// A snapshot's restore keeps checking the hash, which a
			// member's file lacks.
			f, err := os.Open(db)
			if err != nil {
				t.Fatal(err)
			}
			err = backup.RestoreData(ctx, etcdBin, f, filepath.Join(t.TempDir(), "work"), survivor.DataDir, m, bump)
			f.Close()
			if err == nil || !strings.Contains(err.Error(), "refused") {
				t.Errorf("RestoreData of a member's file, which has no hash: %v, want it refused", err)
			}
			st, err := backup.RestoreDB(ctx, etcdBin, db, filepath.Join(t.TempDir(), "work"), survivor.DataDir, m, bump)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("kept revision %d of %d written, %d keys, %d bytes", st.Revision, last, st.TotalKey, st.TotalSize)
			if tc.name == "stopped" && st.Revision != last {
				t.Errorf("the stopped survivor's file has revision %d, want the last write's %d", st.Revision, last)
			}
			if st.Revision > last {
				t.Fatalf("the survivor's file has revision %d, past the last write's %d", st.Revision, last)
			}
			if err := survivor.Restart(); err != nil {
				t.Fatal(err)
			}
			checkRecovered(ctx, t, cl.NewClient(survivor), survivor, before, st.Revision, bump, written)
		})
	}
}

type write struct {
	key string
	rev int64
}

// putKeys writes n keys one by one and returns each with its revision.
func putKeys(ctx context.Context, t *testing.T, cli *etcd.Client, n int) []write {
	t.Helper()
	var ws []write
	for i := range n {
		k := fmt.Sprintf("/restoredb/%04d", i)
		resp, err := cli.Raw().Put(ctx, k, "v-"+k)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, write{k, resp.Header.Revision})
	}
	return ws
}

// checkRecovered asserts that the running member p serves a cluster of its
// own, new to the members before, at revision kept+bump, with exactly the
// writes up to kept, and that it refuses kept as compacted.
func checkRecovered(ctx context.Context, t *testing.T, cli *etcd.Client, p *testkit.EtcdProcess, before []etcd.Member, kept, bump int64, written []write) {
	t.Helper()
	if err := testkit.WaitHealthy(ctx, cli, p); err != nil {
		t.Fatal(err)
	}
	members, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 1 || members[0].Name != p.Name {
		t.Fatalf("members %v after the restore, want %s alone", members, p.Name)
	}
	for _, m := range before {
		if m.ID == members[0].ID {
			t.Errorf("the restored member kept the ID %x of the lost cluster's member %s: the lost members could talk to it", m.ID, m.Name)
		}
	}
	st, err := cli.Status(ctx, p.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	if st.Revision != kept+bump {
		t.Errorf("the restored member serves revision %d, want %d (kept) + %d (bump)", st.Revision, kept, bump)
	}
	resp, err := cli.Raw().Get(ctx, "/restoredb/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	for _, w := range written {
		v, ok := got[w.key]
		if want := w.rev <= kept; ok != want || (ok && v != "v-"+w.key) {
			t.Errorf("key %s (written at revision %d, kept %d): present %v with %q, want present %v", w.key, w.rev, kept, ok, v, want)
		}
	}
	if _, err := cli.Raw().Get(ctx, written[0].key, clientv3.WithRev(kept)); !etcd.IsCompacted(err) {
		t.Errorf("a read at the kept revision %d: %v, want it refused as compacted", kept, err)
	}
}
