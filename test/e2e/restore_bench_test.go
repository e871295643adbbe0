package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// BenchmarkRestore measures the recovery time objective of issue 35: a
// 1-machine control plane holding 100 MiB of data (200 values of 512 KiB)
// backs up, encrypted, to a real S3 store and is deleted, machines and
// all; then control planes of 1 and 3 machines are restored from its
// snapshot, one after the other. Reported: from the restoring control
// plane's creation to its first API server answering (rto-first-s-N) and
// to Available with N machines (rto-s-N).
func BenchmarkRestore(b *testing.B) {
	if shared == nil {
		b.Skip("needs the shared management cluster (not with -short)")
	}
	testkit.RequireBinaries(b, "versitygw")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	srv, _ := testkit.StartObjectStore(b, "rto")
	target := testkit.StoreTarget(srv, "rto")
	target.Prefix = "e2e" // as spec.backup says below
	store, err := s3store.Open(target)
	if err != nil {
		b.Fatal(err)
	}
	storeSecret(b, shared, "rto-s3", srv)
	key, _ := backup.NewKey()
	keySecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rto-key", Namespace: ns}, Data: map[string][]byte{engine.BackupEncryptionKeyKey: key}}
	if err := shared.env.Client.Create(ctx, keySecret); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = shared.env.Client.Delete(context.Background(), keySecret) })
	src := newScenario(b, shared, "rto-src", 1, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Backup = &controlplanev1.BackupSpec{
			Target:     controlplanev1.BackupTarget{Endpoint: srv.Endpoint, Bucket: "rto", Prefix: "e2e", CredentialsSecret: "rto-s3"},
			Schedule:   controlplanev1.BackupSchedule{IntervalSeconds: ptr.To[int32](86400)},
			Encryption: &controlplanev1.BackupEncryption{KeySecret: "rto-key"},
		}
	})
	src.waitAvailable(convergeTimeout, 1)
	cli, _, err := src.etcdClient(ctx)
	if err != nil {
		b.Fatal(err)
	}
	value := strings.Repeat("v", 512<<10)
	for i := range 200 {
		if _, err := cli.Raw().Put(ctx, fmt.Sprintf("%sbench-%03d", writerPrefix, i), value); err != nil {
			b.Fatal(err)
		}
	}
	cli.Close()
	lost := src.loseCluster(ctx, store)
	b.ReportMetric(float64(lost.snapshot.Size)/float64(1<<20), "snapshot-mib")
	for i := range b.N {
		for _, replicas := range []int32{1, 3} {
			name := fmt.Sprintf("rto-%d-%d", replicas, i)
			start := time.Now()
			s := newScenario(b, shared, name, replicas, func(cp *controlplanev1.QuorumControlPlane) {
				cp.Spec.Restore = &controlplanev1.RestoreSpec{From: controlplanev1.RestoreSource{
					Target:  &controlplanev1.BackupTarget{Endpoint: srv.Endpoint, Bucket: "rto", Prefix: "e2e", CredentialsSecret: "rto-s3"},
					Cluster: lost.snapshot.Cluster.Name, Encryption: &controlplanev1.BackupEncryption{KeySecret: "rto-key"}}}
			})
			s.eventually(convergeTimeout, "the restored control plane initialized", func(ctx context.Context) error {
				cp, err := s.controlPlane(ctx)
				if err != nil {
					return err
				}
				if !ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false) {
					return fmt.Errorf("not initialized (Restored: %+v)", cp.Status.Restore)
				}
				return nil
			})
			first := time.Since(start)
			s.waitAvailable(convergeTimeout, int(replicas))
			b.ReportMetric(first.Seconds(), fmt.Sprintf("rto-first-s-%d", replicas))
			b.ReportMetric(time.Since(start).Seconds(), fmt.Sprintf("rto-s-%d", replicas))
			s.deleteCluster()
		}
	}
}
