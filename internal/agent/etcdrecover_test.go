package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

func TestDecodeEtcdRecover(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       string // in the error; empty: accepted
	}{
		{"valid", `{"token": "c1-recovered-1", "bumpRevision": 1000000000}`, ""},
		{"empty body", ``, "no request"},
		{"no token", `{"bumpRevision": 1000}`, "token"},
		{"token with a space", `{"token": "c1 recovered", "bumpRevision": 1000}`, "token"},
		{"token with a newline", `{"token": "c1\nrecovered", "bumpRevision": 1000}`, "token"},
		{"token with a control character", `{"token": "c1\u0007", "bumpRevision": 1000}`, "token"},
		{"token too long", `{"token": "` + strings.Repeat("t", maxTokenLength+1) + `", "bumpRevision": 1000}`, "token"},
		{"no bump", `{"token": "c1-recovered-1"}`, "bumpRevision"},
		{"negative bump", `{"token": "c1-recovered-1", "bumpRevision": -1}`, "bumpRevision"},
		{"unknown field", `{"token": "c1-recovered-1", "bumpRevision": 1000, "force": true}`, "unknown field"},
		{"trailing data", `{"token": "c1-recovered-1", "bumpRevision": 1000} {}`, "data after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := decodeEtcdRecover(strings.NewReader(tc.body))
			if tc.want == "" {
				if err != nil || req.Token != "c1-recovered-1" || req.BumpRevision != backup.BumpRevision {
					t.Errorf("decoded %+v, %v; want it accepted", req, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestEtcdRecoveryOfAStoppedMember recovers the data directory of the last
// stopped member of a real 3-member etcd: a recovery that fails leaves it
// untouched, one that succeeds puts in its place the data of a new
// cluster, on which the member starts alone with its old command line,
// serving every key at the kept revision plus the bump, and refusing older
// revisions as compacted. The replaced data is kept aside, and a second
// recovery with the same token changes nothing and answers the first's
// result.
func TestEtcdRecoveryOfAStoppedMember(t *testing.T) {
	testkit.RequireBinaries(t, "etcd")
	etcdBin, err := binaries.Path("etcd", binaries.EtcdVersion)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "rec", 3)
	survivor := ps[0]
	var last int64
	for i := range 100 {
		resp, err := cli.Raw().Put(ctx, fmt.Sprintf("/recover/%03d", i), "v")
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	if err := testkit.Eventually(ctx, 50*time.Millisecond, "the survivor to apply the last write", func(ctx context.Context) error {
		st, err := cli.Status(ctx, survivor.ClientURL())
		if err == nil && st.Revision != last {
			err = fmt.Errorf("revision %d, last write %d", st.Revision, last)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*testkit.EtcdProcess{ps[1], ps[2], survivor} {
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
	}

	dir := filepath.Dir(survivor.DataDir)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const bump = 1000
	rc := etcdRecovery{etcdBin: etcdBin, dir: dir, dataDir: survivor.DataDir, bump: bump,
		member: backup.Member{Name: survivor.Name, InitialCluster: survivor.Name + "=" + survivor.PeerURL(), Token: "rec-recovered", PeerURL: survivor.PeerURL()},
		now:    func() time.Time { return at }, log: slog.New(slog.NewTextHandler(t.Output(), nil))}
	original := stat(t, survivor.DataDir)

	failing := rc
	failing.etcdBin = "/bin/false"
	if _, err := failing.run(ctx); err == nil {
		t.Fatal("a recovery whose etcdutl fails reported success")
	}
	if !os.SameFile(original, stat(t, survivor.DataDir)) {
		t.Error("a failed recovery replaced the data directory")
	}
	for _, name := range []string{recoveryWorkDir, beforeRecoveryDir, EtcdRecoveryFile} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("after a failed recovery %s is there (%v)", name, err)
		}
	}

	res, err := rc.run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (EtcdRecoverResult{Token: "rec-recovered", Revision: last, Recovered: true, At: at}); res != want {
		t.Errorf("recovery answered %+v, want %+v", res, want)
	}
	if !os.SameFile(original, stat(t, filepath.Join(dir, beforeRecoveryDir))) {
		t.Errorf("the replaced data directory is not kept as %s", beforeRecoveryDir)
	}
	if _, err := os.Stat(filepath.Join(dir, recoveryWorkDir)); !os.IsNotExist(err) {
		t.Errorf("the work directory is left (%v)", err)
	}
	if fi := stat(t, filepath.Join(dir, EtcdRecoveryFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("the record has mode %v, want 0600", fi.Mode().Perm())
	}
	recovered := stat(t, survivor.DataDir)
	again, err := rc.run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Recovered = false; again != res {
		t.Errorf("the repeat answered %+v, want the recorded %+v", again, res)
	}
	if !os.SameFile(recovered, stat(t, survivor.DataDir)) || !os.SameFile(original, stat(t, filepath.Join(dir, beforeRecoveryDir))) {
		t.Error("the repeat of a recorded recovery moved the data directories")
	}

	if err := survivor.Restart(); err != nil {
		t.Fatal(err)
	}
	alone := cl.NewClient(survivor)
	checkAlone(ctx, t, alone, survivor, last+bump, 100)
	if _, err := alone.Raw().Get(ctx, "/recover/000", clientv3.WithRev(last)); !etcd.IsCompacted(err) {
		t.Errorf("a read at the kept revision %d: %v, want it refused as compacted", last, err)
	}
}

// checkAlone asserts that p serves a cluster of its own at revision rev
// with n keys under /recover/.
func checkAlone(ctx context.Context, t *testing.T, cli *etcd.Client, p *testkit.EtcdProcess, rev int64, n int64) {
	t.Helper()
	if err := testkit.WaitHealthy(ctx, cli, p); err != nil {
		t.Fatal(err)
	}
	members, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 1 || members[0].Name != p.Name {
		t.Errorf("members %v after the recovery, want %s alone", members, p.Name)
	}
	resp, err := cli.Raw().Get(ctx, "/recover/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != n || resp.Header.Revision != rev {
		t.Errorf("%d keys at revision %d after the recovery, want %d at %d", resp.Count, resp.Header.Revision, n, rev)
	}
}

func stat(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi
}

// TestEtcdRecoverEndpoint recovers the member of a real etcd-only machine
// through its agent: etcd is stopped, its data replaced by that of a new
// cluster, and started again, which serves the keys under a new member ID
// at the bumped revision. The same request again answers the first's
// result without restarting etcd; a request with no token is refused.
func TestEtcdRecoverEndpoint(t *testing.T) {
	dir, addr, ca := etcdMachineWithQuota(t, 1<<30)
	startAgent(t, dir)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	first := runningEtcd(ctx, t, addr, "etcd to serve", func(ComponentState) error { return nil })
	tlsCfg := clientTLS(t, ca, ca)
	endpoint := "https://" + net.JoinHostPort(addr, strconv.Itoa(EtcdClientPort))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tlsCfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var last int64
	for i := range 10 {
		resp, err := cli.Put(ctx, fmt.Sprintf("/recover/%03d", i), "v")
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	before, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := RecoverEtcd(ctx, tlsCfg, addr, EtcdRecoverRequest{BumpRevision: 1000}); err == nil || !strings.Contains(err.Error(), "400 Bad Request: invalid etcd recovery: token") {
		t.Errorf("a recovery without a token: %v, want the server's 400 naming the token", err)
	}
	req := EtcdRecoverRequest{Token: "c1-recovered-1", BumpRevision: 1000}
	res, err := RecoverEtcd(ctx, tlsCfg, addr, req)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Recovered || res.Token != req.Token || res.Revision != last || res.At.IsZero() {
		t.Errorf("recovery answered %+v, want it done at revision %d", res, last)
	}
	second := runningEtcd(ctx, t, addr, "etcd to serve after the recovery", func(st ComponentState) error {
		if st.PID == first.PID {
			return errors.New("not restarted yet")
		}
		return nil
	})
	after, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Members) != 1 || after.Members[0].ID == before.Members[0].ID || after.Header.ClusterId == before.Header.ClusterId {
		t.Errorf("members %v of cluster %x after the recovery, before %v of %x: want one, with new IDs", after.Members, after.Header.ClusterId, before.Members, before.Header.ClusterId)
	}
	got, err := cli.Get(ctx, "/recover/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if got.Count != 10 || got.Header.Revision != last+req.BumpRevision {
		t.Errorf("%d keys at revision %d after the recovery, want 10 at %d", got.Count, got.Header.Revision, last+req.BumpRevision)
	}

	again, err := RecoverEtcd(ctx, tlsCfg, addr, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Recovered = false; !again.At.Equal(res.At) || again.Token != res.Token || again.Revision != res.Revision || again.Recovered {
		t.Errorf("the repeat answered %+v, want the first's %+v", again, res)
	}
	if h, err := ReadHealth(ctx, addr); err != nil || h.Components[bootstrap.Etcd].PID != second.PID {
		t.Errorf("after the repeat etcd is %+v (%v), want pid %d still", h.Components[bootstrap.Etcd], err, second.PID)
	}
}
