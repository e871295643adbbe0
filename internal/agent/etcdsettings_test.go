package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// etcdMachineWithQuota writes an etcd-only machine whose document sets
// etcd's quota, and returns its directory, address and etcd CA.
func etcdMachineWithQuota(t *testing.T, quota int64) (dir, addr string, ca *certs.KeyPair) {
	t.Helper()
	testkit.RequireBinaries(t, "etcd")
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	data, err := bootstrap.Marshal(bootstrap.NewEtcdOnly("c1-etcd", cas.Etcd, bootstrap.LocalEtcd{Mode: bootstrap.EtcdModeNew, QuotaBackendBytes: quota}))
	if err != nil {
		t.Fatal(err)
	}
	addr = testkit.ReserveAddress(t)
	return writeMachineDir(t, addr, data), addr, cas.Etcd
}

// startAgent runs the agent on dir until stop, or the end of the test.
func startAgent(t *testing.T, dir string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	opts := Options{Dir: dir, BinDir: binDir(t), Log: slog.New(slog.NewTextHandler(t.Output(), nil))}
	go func() { done <- Run(ctx, opts) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// clientTLS trusts the etcd CA and presents a client certificate of signer.
func clientTLS(t *testing.T, etcdCA, signer *certs.KeyPair) *tls.Config {
	t.Helper()
	pool, err := certs.CertPool(etcdCA.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if signer != nil {
		kp, err := certs.IssueEtcdClient(signer, "qcp-manager", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// runningEtcd waits until etcd runs, answers its health check after its
// start, and satisfies cond.
func runningEtcd(ctx context.Context, t *testing.T, addr, what string, cond func(ComponentState) error) ComponentState {
	t.Helper()
	return waitEtcd(ctx, t, addr, what, func(st ComponentState, p Probe) error {
		if !st.Running || !p.OK || !p.Time.After(st.StartedAt) {
			return fmt.Errorf("etcd %+v, probe %+v", st, p)
		}
		return cond(st)
	})
}

// dbSizeQuota is the quota the running member reports.
func dbSizeQuota(ctx context.Context, t *testing.T, tlsCfg *tls.Config, addr string) int64 {
	t.Helper()
	endpoint := "https://" + net.JoinHostPort(addr, strconv.Itoa(EtcdClientPort))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, TLS: tlsCfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	var quota int64
	if err := testkit.Eventually(ctx, 50*time.Millisecond, "etcd's status", func(ctx context.Context) error {
		resp, err := cli.Status(ctx, endpoint)
		if err != nil {
			return err
		}
		quota = resp.DbSizeQuota
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return quota
}

// rawPut sends body to the settings endpoint and returns the status and
// the answer.
func rawPut(ctx context.Context, t *testing.T, tlsCfg *tls.Config, addr, body string) (int, string) {
	t.Helper()
	u := "https://" + net.JoinHostPort(addr, strconv.Itoa(EtcdAdminPort)) + EtcdSettingsPath
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// TestEtcdSettingsEndpoint runs a real etcd-only machine and changes its
// member's quota through the agent: only a client of the etcd CA may, bad
// input changes nothing, a change restarts etcd with the new flag and
// survives the agent's restart, and setting the same value again does not
// restart etcd.
func TestEtcdSettingsEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd")
	}
	const docQuota, newQuota = 1 << 30, 3 << 30
	dir, addr, etcdCA := etcdMachineWithQuota(t, docQuota)
	settingsFile := filepath.Join(dir, EtcdSettingsFile)
	stop := startAgent(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	manager := clientTLS(t, etcdCA, etcdCA)
	anyState := func(ComponentState) error { return nil }

	first := runningEtcd(ctx, t, addr, "etcd to run", anyState)
	if q := dbSizeQuota(ctx, t, manager, addr); q != docQuota {
		t.Fatalf("etcd's quota is %d, want the document's %d", q, docQuota)
	}
	if s, err := GetEtcdSettings(ctx, manager, addr); err != nil || s.QuotaBackendBytes != docQuota {
		t.Fatalf("GET: %+v, %v; want the document's quota %d", s, err, docQuota)
	}

	// Refused in the handshake: no request reaches the handler.
	otherCAs, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*tls.Config{
		"no client certificate":   clientTLS(t, etcdCA, nil),
		"another CA's client":     clientTLS(t, etcdCA, otherCAs.Etcd),
		"the cluster CA's client": clientTLS(t, etcdCA, otherCAs.Cluster),
	} {
		res, err := PutEtcdSettings(ctx, cfg, addr, EtcdSettings{QuotaBackendBytes: newQuota})
		if err == nil || !strings.Contains(err.Error(), "tls: ") {
			t.Errorf("%s: PUT answered %+v, %v; want a TLS error", name, res, err)
		}
	}

	for name, tc := range map[string]struct{ body, want string }{
		"negative":         {`{"quotaBackendBytes":-1}`, "quotaBackendBytes: -1 is not a positive number"},
		"zero":             {`{"quotaBackendBytes":0}`, "quotaBackendBytes: 0 is not a positive number"},
		"missing":          {`{}`, "quotaBackendBytes: 0 is not a positive number"},
		"empty":            {``, "no settings"},
		"a string":         {`{"quotaBackendBytes":"3Gi"}`, "quotaBackendBytes"},
		"an unknown field": {`{"quotaBackendBytes":3221225472,"restart":true}`, `unknown field "restart"`},
		"two objects":      {`{"quotaBackendBytes":3221225472}{}`, "data after the JSON object"},
		"too long":         {`{"quotaBackendBytes":3221225472` + strings.Repeat(" ", maxSettingsBody) + `}`, "too large"},
	} {
		code, msg := rawPut(ctx, t, manager, addr, tc.body)
		if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: PUT answered %d %q; want 400 naming %q", name, code, msg, tc.want)
		}
	}
	if _, err := PutEtcdSettings(ctx, manager, addr, EtcdSettings{QuotaBackendBytes: -1}); err == nil || !strings.Contains(err.Error(), "400 Bad Request: invalid etcd settings: quotaBackendBytes") {
		t.Errorf("PutEtcdSettings of -1: %v; want the server's 400 and message", err)
	}
	if _, err := os.Stat(settingsFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s exists after refused requests (stat: %v)", EtcdSettingsFile, err)
	}
	if s, err := GetEtcdSettings(ctx, manager, addr); err != nil || s.QuotaBackendBytes != docQuota {
		t.Errorf("GET after refused requests: %+v, %v; want %d", s, err, docQuota)
	}

	res, err := PutEtcdSettings(ctx, manager, addr, EtcdSettings{QuotaBackendBytes: newQuota})
	if err != nil || !res.Restarted || res.Settings.QuotaBackendBytes != newQuota {
		t.Fatalf("PUT %d: %+v, %v; want etcd restarted with it", newQuota, res, err)
	}
	changed := runningEtcd(ctx, t, addr, "etcd to run again after the change", func(st ComponentState) error {
		if st.PID == first.PID {
			return errors.New("the first etcd still runs")
		}
		return nil
	})
	if q := dbSizeQuota(ctx, t, manager, addr); q != newQuota {
		t.Errorf("etcd's quota after the change is %d, want %d", q, newQuota)
	}
	if want := "restarted by qcp-agent: quota-backend-bytes changed from 1073741824 to 3221225472 by qcp-manager"; changed.Restarts != first.Restarts+1 || changed.LastError != want {
		t.Errorf("after the change: restarts %d, last error %q; want %d and %q", changed.Restarts, changed.LastError, first.Restarts+1, want)
	}
	if fi, err := os.Stat(settingsFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v, %v; want mode 0600", EtcdSettingsFile, fi, err)
	}
	var saved EtcdSettings
	if err := json.Unmarshal(mustRead(t, settingsFile), &saved); err != nil || saved.QuotaBackendBytes != newQuota {
		t.Errorf("%s holds %+v (%v), want quota %d", EtcdSettingsFile, saved, err, newQuota)
	}

	// The same value again: no restart. A restart would have stopped the
	// member at once; a probe a second after the answer finds it unchanged.
	res, err = PutEtcdSettings(ctx, manager, addr, EtcdSettings{QuotaBackendBytes: newQuota})
	answered := time.Now()
	if err != nil || res.Restarted || res.Settings.QuotaBackendBytes != newQuota {
		t.Fatalf("PUT %d again: %+v, %v; want no restart", newQuota, res, err)
	}
	same := waitEtcd(ctx, t, addr, "a probe a second after the answer", func(_ ComponentState, p Probe) error {
		if !p.Time.After(answered.Add(time.Second)) {
			return errors.New("no probe yet")
		}
		return nil
	})
	if !same.Running || same.PID != changed.PID || same.Restarts != changed.Restarts {
		t.Errorf("after the same value: etcd %+v; want pid %d still running, %d restarts", same, changed.PID, changed.Restarts)
	}

	// The value outlives the agent.
	stop()
	startAgent(t, dir)
	runningEtcd(ctx, t, addr, "etcd under a new agent", anyState)
	if q := dbSizeQuota(ctx, t, manager, addr); q != newQuota {
		t.Errorf("etcd's quota under a new agent is %d, want %d", q, newQuota)
	}
	if s, err := GetEtcdSettings(ctx, manager, addr); err != nil || s.QuotaBackendBytes != newQuota {
		t.Errorf("GET under a new agent: %+v, %v; want %d", s, err, newQuota)
	}
}

// TestCorruptEtcdSettingsFailsStart: a settings file the agent cannot read
// stops the machine before anything starts, naming the file.
func TestCorruptEtcdSettingsFailsStart(t *testing.T) {
	for name, content := range map[string]string{
		"not JSON":      "{quotaBackendBytes",
		"negative":      `{"quotaBackendBytes":-5}`,
		"unknown field": `{"quotaBackendBytes":5,"colour":1}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir, addr := etcdOnlyMachine(t)
			path := filepath.Join(dir, EtcdSettingsFile)
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := Run(ctx, Options{Dir: dir, BinDir: binDir(t)})
			if err == nil || !strings.Contains(err.Error(), "etcd settings file "+path) {
				t.Fatalf("Run: %v; want an error naming %s", err, path)
			}
			st, err := ReadStatus(dir)
			if err != nil {
				t.Fatal(err)
			}
			if st.Phase != PhaseFailed || !strings.Contains(st.Message, path) || !strings.Contains(st.Message, "delete it") {
				t.Errorf("status = %+v; want Failed naming %s and the fix", st, path)
			}
			if _, err := os.Stat(filepath.Join(dir, "etcd")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("etcd's data directory exists: etcd was started (stat: %v)", err)
			}
			for _, port := range []int{HealthPort, EtcdAdminPort} {
				if conn, err := net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), time.Second); err == nil {
					conn.Close()
					t.Errorf("something listens on port %d", port)
				}
			}
		})
	}
}

// TestPutEtcdSettingsRefusedWhenExtraArgsSetQuota: the document's flag
// would win over the setting, so a change is refused, not saved.
func TestPutEtcdSettingsRefusedWhenExtraArgsSetQuota(t *testing.T) {
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	doc := bootstrap.NewEtcdOnly("c1", cas.Etcd, bootstrap.NewMember())
	doc.ExtraArgs = map[bootstrap.Component][]bootstrap.Arg{bootstrap.Etcd: {{Name: "quota-backend-bytes", Value: "8589934592"}}}
	a := testMachineCtx(doc)
	a.dir = t.TempDir()
	a.log = slog.New(slog.NewTextHandler(t.Output(), nil))
	a.sup = newSupervisor(t.TempDir(), a.log, 0)
	w := httptest.NewRecorder()
	a.putEtcdSettings(w, httptest.NewRequest(http.MethodPut, EtcdSettingsPath, bytes.NewReader([]byte(`{"quotaBackendBytes":4294967296}`))))
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "extraArgs") {
		t.Errorf("PUT answered %d %q; want 409 naming extraArgs", w.Code, w.Body)
	}
	if _, err := os.Stat(filepath.Join(a.dir, EtcdSettingsFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s was written (stat: %v)", EtcdSettingsFile, err)
	}
}
