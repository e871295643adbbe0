package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/objectstore"
)

// The local environment's object store, which the sample backs up to.
const (
	storeFile = "objectstore.json"
	// storeBucket holds the sample's snapshots.
	storeBucket = "qcp-backups"
	// sampleBackupSecret holds the store's credentials and CA for the
	// sample control plane.
	sampleBackupSecret = "qcp-backup-store"
	// firstBackupTimeout bounds up's wait for the sample's first backup.
	firstBackupTimeout = 3 * time.Minute
)

// storeInfo is what qcpctl serve writes of its store for up (storeFile,
// 0600: it holds the store's root credentials).
type storeInfo struct {
	Endpoint        string `json:"endpoint"`
	AccessKeyID     string `json:"accessKeyID"`
	SecretAccessKey string `json:"secretAccessKey"`
	CA              []byte `json:"ca"`
}

// startStore starts the management cluster's object store (versitygw over
// TLS, its data in dir/objectstore), creates storeBucket, and writes
// storeFile for up. The caller stops it.
func startStore(ctx context.Context, dir string) (*objectstore.Server, error) {
	srv, err := objectstore.Start(ctx, objectstore.Options{Dir: filepath.Join(dir, "objectstore")})
	if err != nil {
		return nil, fmt.Errorf("starting the object store for backups: %w", err)
	}
	info := storeInfo{Endpoint: srv.Endpoint, AccessKeyID: srv.AccessKeyID, SecretAccessKey: srv.SecretAccessKey, CA: srv.CA}
	store, err := s3store.Open(s3store.Target{Endpoint: info.Endpoint, Bucket: storeBucket, AccessKeyID: info.AccessKeyID, SecretAccessKey: info.SecretAccessKey, CA: info.CA})
	if err == nil {
		err = store.MakeBucket(ctx)
	}
	if err == nil {
		var b []byte
		if b, err = json.Marshal(info); err == nil {
			err = os.WriteFile(filepath.Join(dir, storeFile), b, 0o600)
		}
	}
	if err != nil {
		_ = srv.Stop()
		return nil, fmt.Errorf("preparing the object store for backups: %w", err)
	}
	return srv, nil
}

// enableSampleBackups gives the sample control plane backups to the
// management cluster's store: a Secret with the store's credentials and
// CA, and spec.backup (hourly, 24 kept; not encrypted: the store is a
// 0700 directory of this host's).
func enableSampleBackups(ctx context.Context, c client.Client, dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, storeFile))
	if err != nil {
		return err
	}
	var info storeInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return fmt.Errorf("%s: %w", storeFile, err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: sampleNamespace, Name: sampleBackupSecret}, Data: map[string][]byte{
		engine.BackupAccessKeyIDKey: []byte(info.AccessKeyID), engine.BackupSecretAccessKeyKey: []byte(info.SecretAccessKey), engine.BackupCAKey: info.CA}}
	if err := c.Create(ctx, secret); err != nil {
		return fmt.Errorf("creating Secret %s: %w", sampleBackupSecret, err)
	}
	cp := &controlplanev1.QuorumControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: sampleNamespace, Name: sampleControlPlane}, cp); err != nil {
		return err
	}
	before := cp.DeepCopy()
	cp.Spec.Backup = &controlplanev1.BackupSpec{
		Target:    controlplanev1.BackupTarget{Endpoint: info.Endpoint, Bucket: storeBucket, CredentialsSecret: sampleBackupSecret},
		Schedule:  controlplanev1.BackupSchedule{IntervalSeconds: ptr.To[int32](3600)},
		Retention: controlplanev1.BackupRetention{KeepLast: ptr.To[int32](24)},
	}
	return c.Patch(ctx, cp, client.MergeFrom(before))
}

// waitForFirstBackup waits until the sample's first snapshot is verified,
// and says where it is.
func waitForFirstBackup(ctx context.Context, out io.Writer, c client.Client) error {
	ctx, cancel := context.WithTimeout(ctx, firstBackupTimeout)
	defer cancel()
	for {
		cp := &controlplanev1.QuorumControlPlane{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: sampleNamespace, Name: sampleControlPlane}, cp); err != nil {
			return err
		}
		if st := cp.Status.Backup; st != nil && st.LastSuccessful != nil && conditions.IsTrue(cp, controlplanev1.BackupsHealthyCondition) {
			fmt.Fprintf(out, "  The first backup is verified: revision %d, %d bytes, in bucket %s (%s).\n",
				st.LastSuccessful.Revision, st.LastSuccessful.SizeBytes, storeBucket, st.LastSuccessful.Object)
			return nil
		}
		select {
		case <-ctx.Done():
			c := conditions.Get(cp, controlplanev1.BackupsHealthyCondition)
			return fmt.Errorf("no verified backup after %s (BackupsHealthy: %+v)", firstBackupTimeout, c)
		case <-time.After(time.Second):
		}
	}
}
