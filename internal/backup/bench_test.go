package backup_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// BenchmarkSnapshotAndVerify measures issue 35's figures for 100 MiB of
// live data in a 3-member etcd: streaming a follower's snapshot into a
// real S3 store (plain and age-encrypted), and verifying it as a machine
// does (download, checksum, decryption, etcdutl status and restore, a
// scratch etcd that must serve the revision). Reported per 100 MiB of
// database.
func BenchmarkSnapshotAndVerify(b *testing.B) {
	testkit.RequireBinaries(b, "etcd", "versitygw")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	_, ps, cli := testkit.StartEtcdCluster(ctx, b, "bench", 3)
	_, store := testkit.StartObjectStore(b, "bench")
	value := strings.Repeat("v", 512<<10)
	for i := range 200 { // 100 MiB
		if _, err := cli.Raw().Put(ctx, fmt.Sprintf("/bench/%03d", i), value); err != nil {
			b.Fatal(err)
		}
	}
	members, err := cli.Members(ctx)
	if err != nil {
		b.Fatal(err)
	}
	leader, err := cli.Leader(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var follower uint64
	for _, m := range members {
		if m.ID != leader.ID {
			follower = m.ID
		}
	}
	st, err := cli.Status(ctx, ps[0].ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	per100 := float64(st.DBSize) / float64(100<<20)
	key, _ := backup.NewKey()
	enc, _ := backup.ParseKey(key)
	etcdBin, err := binaries.Path("etcd", binaries.EtcdVersion)
	if err != nil {
		b.Fatal(err)
	}
	owner := backup.ClusterRef{Namespace: "bench", Kind: "EtcdCluster", Name: "bench"}
	for _, tc := range []struct {
		name string
		enc  *backup.Encryption
	}{{"plain", nil}, {"encrypted", enc}} {
		b.Run(tc.name, func(b *testing.B) {
			var snap, verify time.Duration
			n := 0
			for b.Loop() {
				start := time.Now()
				r, err := cli.Snapshot(ctx, follower)
				if err != nil {
					b.Fatal(err)
				}
				name := backup.Name(owner, start, tc.enc != nil)
				size, sum, err := backup.Upload(ctx, store, name, r, tc.enc)
				r.Close()
				if err != nil {
					b.Fatal(err)
				}
				stored := time.Now()
				obj, err := store.Get(ctx, name)
				if err != nil {
					b.Fatal(err)
				}
				m := backup.Manifest{Snapshot: name, Size: size, SHA256: sum, Encrypted: tc.enc != nil}
				counted := backup.NewCounter(obj)
				plain, err := backup.Open(counted, m, tc.enc)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := backup.ScratchRestore(ctx, etcdBin, filepath.Join(b.TempDir(), "scratch"), plain); err != nil {
					b.Fatal(err)
				}
				obj.Close()
				if counted.SHA256() != sum {
					b.Fatalf("read back %s, stored %s", counted.SHA256(), sum)
				}
				snap += stored.Sub(start)
				verify += time.Since(stored)
				n++
			}
			b.ReportMetric(snap.Seconds()/float64(n)/per100, "snapshot-s/100MiB")
			b.ReportMetric(verify.Seconds()/float64(n)/per100, "verify-s/100MiB")
			b.ReportMetric(float64(st.DBSize)/(1<<20), "db-MiB")
		})
	}
}
