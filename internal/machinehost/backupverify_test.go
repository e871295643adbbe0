package machinehost

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestBackupVerifyOnTheMachine: a snapshot of an etcd-only machine's
// member, streamed into a real S3 store (plain and encrypted), is restored
// by the machine's agent (POST /backup/verify, with a presigned URL and no
// store credentials) into a scratch etcd that serves the manifest's
// revision; the scratch directory is gone after. A manifest whose SHA-256
// or revision differs from the object, a wrong key, and a request without
// its fields are refused, naming the fault.
func TestBackupVerifyOnTheMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real etcd")
	}
	testkit.RequireBinaries(t, "etcd", "versitygw")
	h := newHost(t)
	c := newTestCluster(t, h, "ns-bk", "cbk")
	m := c.spec("e1", "fd-a")
	c.startDoc(m, bootstrap.NewEtcdOnly("cbk-etcd", c.cas.Etcd, bootstrap.NewMember()))
	c.waitHealthy(m, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli := c.etcdClient(clientURL(m))
	for i := range 50 {
		if _, err := cli.Raw().Put(ctx, "/k", strings.Repeat("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	srv, store := testkit.StartObjectStore(t, "backups")
	members, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader, err := cli.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := backup.NewKey()
	enc, _ := backup.ParseKey(key)
	via := etcdClientTLS(t, c.cas.Etcd.CertPEM, c.cas.Etcd)
	owner := backup.ClusterRef{Namespace: "ns-bk", Kind: "EtcdCluster", Name: "cbk"}
	for _, e := range []*backup.Encryption{nil, enc} {
		r, err := cli.Snapshot(ctx, members[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		name := backup.Name(owner, time.Now(), e != nil)
		size, sum, err := backup.Upload(ctx, store, name, r, e)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		man := backup.Manifest{Format: backup.FormatVersion, Snapshot: name, Cluster: owner, Revision: leader.Revision, Size: size, SHA256: sum, Encrypted: e != nil}
		u, err := store.PresignGet(ctx, name, 5*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		req := agent.BackupVerifyRequest{URL: u, CA: srv.CA, Manifest: man}
		if e != nil {
			req.Key = key
		}
		// Without a revision the agent reports the one it finds; with
		// one, it checks it.
		unknown := req
		unknown.Manifest.Revision = 0
		res, err := agent.VerifyBackup(ctx, via, m.Address, unknown)
		if err != nil || res.Revision != leader.Revision {
			t.Fatalf("encrypted=%v, no revision given: %+v, %v; want revision %d", e != nil, res, err, leader.Revision)
		}
		res, err = agent.VerifyBackup(ctx, via, m.Address, req)
		if err != nil {
			t.Fatalf("encrypted=%v: %v", e != nil, err)
		}
		if res.Revision != leader.Revision || res.Machine != "e1" {
			t.Errorf("encrypted=%v: verified %+v, want revision %d on e1", e != nil, res, leader.Revision)
		}
		refused := func(what string, change func(*agent.BackupVerifyRequest), want string) {
			t.Helper()
			bad := req
			change(&bad)
			if _, err := agent.VerifyBackup(ctx, via, m.Address, bad); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("encrypted=%v, %s: %v; want an error naming %q", e != nil, what, err, want)
			}
		}
		refused("another SHA-256", func(r *agent.BackupVerifyRequest) { r.Manifest.SHA256 = strings.Repeat("0", 64) }, "its manifest says")
		refused("another revision", func(r *agent.BackupVerifyRequest) { r.Manifest.Revision++ }, "its manifest says")
		refused("no URL", func(r *agent.BackupVerifyRequest) { r.URL = "" }, "url:")
		if e != nil {
			other, _ := backup.NewKey()
			refused("a wrong key", func(r *agent.BackupVerifyRequest) { r.Key = other }, "decrypting")
			refused("no key", func(r *agent.BackupVerifyRequest) { r.Key = nil }, "no key was given")
		}
	}
	if left, err := filepath.Glob(filepath.Join(h.Dir(c.ns, m.Name), "backup-scratch*")); err != nil || len(left) > 0 {
		t.Errorf("scratch files left on the machine: %v (%v)", left, err)
	}
}
