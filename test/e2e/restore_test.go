package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/objectstore"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// writerPrefix is where the scenarios' writer keeps its keys.
const writerPrefix = "/qcp-writer/"

// lostCluster is what a test keeps of a cluster before deleting it, to
// check its restore against.
type lostCluster struct {
	snapshot   backup.Manifest
	keys       map[string]string // the writer's keys at the snapshot's revision
	kubeconfig []byte
	// addresses are the machines' and the load balancer's.
	addresses []string
	nodes     []string
}

// loseCluster takes a last snapshot of s (its traffic stopped, so that
// every acknowledged write precedes it), reads what it holds, and deletes
// the cluster, machines and all.
func (s *scenario) loseCluster(ctx context.Context, store *s3store.Store) lostCluster {
	s.t.Helper()
	var lost lostCluster
	asked := time.Now()
	s.setBackup(ctx, func(b *controlplanev1.BackupSpec) { b.Schedule.IntervalSeconds = ptr.To[int32](10) })
	lost.snapshot = s.snapshotAfter(store, backup.ClusterRef{Namespace: ns, Kind: "QuorumControlPlane", Name: s.name}, asked)
	s.setBackup(ctx, func(b *controlplanev1.BackupSpec) { b.Schedule.IntervalSeconds = ptr.To[int32](86400) })
	cli, _, err := s.etcdClient(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := cli.Raw().Get(ctx, writerPrefix, clientv3.WithPrefix(), clientv3.WithRev(lost.snapshot.Revision))
	cli.Close()
	if err != nil {
		s.t.Fatal(err)
	}
	lost.keys = map[string]string{}
	for _, kv := range resp.Kvs {
		lost.keys[string(kv.Key)] = string(kv.Value)
	}
	if len(lost.keys) == 0 {
		s.t.Fatalf("the writer left no key at revision %d", lost.snapshot.Revision)
	}
	var kc corev1.Secret
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.Kubeconfig)}, &kc); err != nil {
		s.t.Fatal(err)
	}
	lost.kubeconfig = kc.Data[secret.KubeconfigDataName]
	var c clusterv1.Cluster
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, &c); err != nil {
		s.t.Fatal(err)
	}
	lost.addresses = append(lost.addresses, c.Spec.ControlPlaneEndpoint.Host)
	ms, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range ms {
		lost.addresses = append(lost.addresses, internalIP(&m))
	}
	wl, err := s.workload(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	nodes, err := wl.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, n := range nodes.Items {
		lost.nodes = append(lost.nodes, n.Name)
	}
	s.deleteCluster()
	return lost
}

// snapshotAfter waits for a verified snapshot of owner begun after asked,
// and returns its manifest.
func (s *scenario) snapshotAfter(store *s3store.Store, owner backup.ClusterRef, asked time.Time) backup.Manifest {
	s.t.Helper()
	var m backup.Manifest
	s.eventually(2*time.Minute, "a snapshot begun after "+asked.Format(time.TimeOnly), func(ctx context.Context) error {
		manifests, _, err := engine.StoredBackups(ctx, store, owner)
		if err != nil {
			return err
		}
		for _, mf := range manifests {
			if mf.Verified != nil && mf.Started.After(asked) {
				m = mf
				return nil
			}
		}
		return fmt.Errorf("none of %d", len(manifests))
	})
	return m
}

// restoreWithBadInput builds cluster name from lost's snapshot, through a
// missing credentials Secret, a bucket that does not exist, the wrong key
// and a corrupt copy of the snapshot, each named in the Restored condition
// while no machine is created; then it puts the good snapshot in place
// and returns the restoring scenario.
func restoreWithBadInput(ctx context.Context, t *testing.T, mgmt *management, name string, srv *objectstore.Server, from *s3store.Store, lost lostCluster, key []byte) *scenario {
	bucket := "restore-" + name
	holdAddresses(t, mgmt, lost.addresses)
	s := newScenario(t, mgmt, name, 3, withoutAutorepair, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Restore = &controlplanev1.RestoreSpec{From: controlplanev1.RestoreSource{
			Target:     &controlplanev1.BackupTarget{Endpoint: srv.Endpoint, Bucket: bucket, Prefix: "e2e", CredentialsSecret: name + "-s3"},
			Cluster:    lost.snapshot.Cluster.Name,
			Encryption: &controlplanev1.BackupEncryption{KeySecret: name + "-key"},
		}}
	})
	fault := func(what, says string) {
		s.t.Helper()
		s.eventually(time.Minute, "Restored naming "+what, s.restored(metav1.ConditionFalse, controlplanev1.RestoreSourceInvalidReason, says))
		if ms, err := s.machines(ctx); err != nil || len(ms) > 0 {
			s.t.Fatalf("%d machines created while the snapshot could not be used (%v)", len(ms), err)
		}
	}
	fault("the missing credentials Secret", fmt.Sprintf("Secret %s/%s-s3 (spec.restore.from.target.credentialsSecret) does not exist", ns, name))
	storeSecret(t, mgmt, name+"-s3", srv)
	fault("the missing bucket", fmt.Sprintf("bucket %q does not exist", bucket))
	target := testkit.StoreTarget(srv, bucket)
	target.Prefix = "e2e"
	to, err := s3store.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	if err := to.MakeBucket(ctx); err != nil {
		t.Fatal(err)
	}
	good := copyObject(ctx, t, from, to, lost.snapshot.Snapshot)
	copyObject(ctx, t, from, to, backup.ManifestName(lost.snapshot.Snapshot))
	copyObject(ctx, t, from, to, lost.snapshot.Authorities)
	wrong, _ := backup.NewKey()
	keySecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-key", Namespace: ns}, Data: map[string][]byte{engine.BackupEncryptionKeyKey: wrong}}
	s.create(ctx, keySecret)
	t.Cleanup(func() { _ = s.c.Delete(context.Background(), keySecret) })
	fault("the wrong key", "and the key in Secret "+ns+"/"+name+"-key (spec.restore.from.encryption.keySecret) is another one's")
	// A byte flipped in the middle of the stored snapshot.
	corrupt := bytes.Clone(good)
	corrupt[len(corrupt)/2] ^= 0xff
	if _, err := to.Put(ctx, lost.snapshot.Snapshot, bytes.NewReader(corrupt), "application/octet-stream"); err != nil {
		t.Fatal(err)
	}
	keySecret.Data[engine.BackupEncryptionKeyKey] = key
	if err := s.c.Update(ctx, keySecret); err != nil {
		t.Fatal(err)
	}
	fault("the corrupt snapshot", "the stored object is not what was written")
	if _, err := to.Put(ctx, lost.snapshot.Snapshot, bytes.NewReader(good), "application/octet-stream"); err != nil {
		t.Fatal(err)
	}
	return s
}

// checkRestoredData checks the data of a cluster restored from lost, once
// its first member answers: it holds every key the writer had at the
// snapshot's revision, and serves a revision above the snapshot's bumped
// one. It leaves the writer's keys deleted, for a writer of its own. Then
// checkRestoredCluster checks that it runs on new addresses, takes the
// old kubeconfig's credentials at its new endpoint, and lists no Node of
// the old machines.
func (s *scenario) checkRestoredData(ctx context.Context, lost lostCluster) {
	s.t.Helper()
	var cli *clientv3.Client
	s.eventually(convergeTimeout, "the restored etcd answering", func(ctx context.Context) error {
		c, _, err := s.etcdClient(ctx)
		if err != nil {
			return err
		}
		if _, err := c.Members(ctx); err != nil {
			c.Close()
			return err
		}
		cli = c.Raw()
		return nil
	})
	defer cli.Close()
	resp, err := cli.Get(ctx, writerPrefix, clientv3.WithPrefix())
	if err != nil {
		s.t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range resp.Kvs {
		got[string(kv.Key)] = string(kv.Value)
	}
	for k, v := range lost.keys {
		if got[k] != v {
			s.t.Errorf("key %s is %q after the restore; at the snapshot's revision it was %q", k, got[k], v)
		}
	}
	if min := lost.snapshot.Revision + backup.BumpRevision; resp.Header.Revision < min {
		s.t.Errorf("the restored etcd serves revision %d; the snapshot's was %d, bumped it must be at least %d", resp.Header.Revision, lost.snapshot.Revision, min)
	}
	if _, err := cli.Delete(ctx, writerPrefix, clientv3.WithPrefix()); err != nil {
		s.t.Fatal(err)
	}
}

// checkRestoredCluster checks the rest of a cluster restored from lost,
// once it is Available.
func (s *scenario) checkRestoredCluster(ctx context.Context, lost lostCluster) {
	s.t.Helper()
	cp := s.waitAvailable(convergeTimeout, 3)
	ms, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range ms {
		if slices.Contains(lost.addresses, internalIP(&m)) {
			s.t.Errorf("machine %s has address %s, an old machine's", m.Name, internalIP(&m))
		}
	}
	if st := cp.Status.Restore; st == nil || st.Object != lost.snapshot.Snapshot || st.Revision != lost.snapshot.Revision ||
		st.StartRevision != lost.snapshot.Revision+backup.BumpRevision || st.Authorities != controlplanev1.RestoredAuthorities {
		s.t.Errorf("status.restore is %+v; want snapshot %s, revision %d, authorities from the backup", st, lost.snapshot.Snapshot, lost.snapshot.Revision)
	}
	s.eventually(time.Minute, "Restored True", s.restored(metav1.ConditionTrue, controlplanev1.RestoredReason, "existing credentials keep working"))
	// The old kubeconfig, pointed at the new endpoint.
	cfg, err := clientcmd.Load(lost.kubeconfig)
	if err != nil {
		s.t.Fatal(err)
	}
	var c clusterv1.Cluster
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, &c); err != nil {
		s.t.Fatal(err)
	}
	if slices.Contains(lost.addresses, c.Spec.ControlPlaneEndpoint.Host) {
		s.t.Errorf("the restored cluster's endpoint %s is the lost one's", c.Spec.ControlPlaneEndpoint.Host)
	}
	for _, cl := range cfg.Clusters {
		cl.Server = fmt.Sprintf("https://%s:%d", c.Spec.ControlPlaneEndpoint.Host, c.Spec.ControlPlaneEndpoint.Port)
	}
	rest, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig()
	if err != nil {
		s.t.Fatal(err)
	}
	rest.Timeout = 5 * time.Second
	old, err := kubernetes.NewForConfig(rest)
	if err != nil {
		s.t.Fatal(err)
	}
	s.eventually(time.Minute, "the old kubeconfig's credentials accepted, and no Node of the old machines", func(ctx context.Context) error {
		nodes, err := old.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("with the old credentials: %w", err)
		}
		var names []string
		for _, n := range nodes.Items {
			names = append(names, n.Name)
			if slices.Contains(lost.nodes, n.Name) {
				return fmt.Errorf("Node %s of an old machine is still listed", n.Name)
			}
		}
		if len(names) != 3 {
			return fmt.Errorf("Nodes %v, want the 3 new machines'", names)
		}
		return nil
	})
	if cp, err = s.controlPlane(ctx); err != nil {
		s.t.Fatal(err)
	}
	for _, n := range lost.nodes {
		if !slices.Contains(cp.Status.Restore.NodesRemoved, n) {
			s.t.Errorf("status.restore.nodesRemoved %v lacks old Node %s", cp.Status.Restore.NodesRemoved, n)
		}
	}
}

// holdAddresses keeps the process provider from giving addrs to new
// machines or load balancers until t ends, as another infrastructure would
// hand out other addresses: it reserves them in the provider's address
// directory, as an allocation does. The shared management cluster's
// allocator hands out the lowest free address, so another scenario's new
// machine may have taken one of addrs between the lost cluster's release
// and this call (a CI run failed on it); such an address is no less
// unavailable to the new machines while that machine has it, and is held
// here as soon as it is released.
func holdAddresses(t testing.TB, mgmt *management, addrs []string) {
	dir := filepath.Join(mgmt.machines(), ".addresses")
	ctx, cancel := context.WithCancel(context.Background())
	var waiting sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		waiting.Wait()
	})
	for _, a := range addrs {
		path := filepath.Join(dir, a)
		held, err := holdAddress(path)
		if err != nil {
			t.Fatalf("holding address %s: %v", a, err)
		}
		if held {
			t.Cleanup(func() { _ = os.Remove(path) })
			continue
		}
		t.Logf("address %s of the lost cluster was taken by another machine since; holding it once that releases it", a)
		waiting.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if held, err := holdAddress(path); held {
					<-ctx.Done()
					_ = os.Remove(path)
					return
				} else if err != nil {
					return
				}
			}
		})
	}
}

// holdAddress reserves the address whose file is path, as an allocation
// does; false if another owner has it.
func holdAddress(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	_, werr := f.WriteString("e2e: an address of a lost cluster")
	return true, errors.Join(werr, f.Close())
}

// restored is a condition for eventually: Restored has status want,
// reason reason and a message containing says.
func (s *scenario) restored(want metav1.ConditionStatus, reason, says string) func(context.Context) error {
	return func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		c := conditions.Get(cp, controlplanev1.RestoredCondition)
		if c == nil || c.Status != want || c.Reason != reason || !strings.Contains(c.Message, says) {
			return fmt.Errorf("Restored is %+v", c)
		}
		return nil
	}
}

// copyObject copies object name between stores, and returns its content.
func copyObject(ctx context.Context, t *testing.T, from, to *s3store.Store, name string) []byte {
	r, err := from.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := to.Put(ctx, name, bytes.NewReader(b), "application/octet-stream"); err != nil {
		t.Fatal(err)
	}
	return b
}
