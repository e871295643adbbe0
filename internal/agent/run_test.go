package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// writeMachineDir writes machine m1 at addr with bootstrap data as the
// infrastructure provider would.
func writeMachineDir(t *testing.T, addr string, data []byte) string {
	t.Helper()
	dir := t.TempDir()
	m := Machine{Name: "m1", Namespace: "ns", Cluster: "c1", Address: addr, ProviderID: "process://ns/m1", FailureDomain: "fd-a"}
	id, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, MachineFile), id, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, BootstrapFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRunRejectsBeforeStartingAnything(t *testing.T) {
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	good, err := bootstrap.Marshal(bootstrap.NewStacked("c1", cas, "", bootstrap.NewMember()))
	if err != nil {
		t.Fatal(err)
	}
	binDir := t.TempDir() // empty: every binary is missing
	cases := []struct {
		name, reason string
		data         []byte
		want         []string
	}{
		{"corrupt", ReasonInvalidBootstrapData, []byte("{not yaml: ["), []string{"machine ns/m1", "not valid YAML"}},
		{"unknown version", ReasonInvalidBootstrapData, []byte(strings.Replace(string(good), bootstrap.APIVersion, "bootstrap.qcp.dev/v7", 1)), []string{"apiVersion", "v7", "upgrade qcp-agent"}},
		{"missing binary", ReasonBinaryMissing, good, []string{"etcd v3.6.16", "make binaries"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeMachineDir(t, "127.0.208.1", tc.data) // rejected before it binds anything
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := Run(ctx, Options{Dir: dir, BinDir: binDir})
			var pf *PreflightError
			if !errors.As(err, &pf) || pf.Reason != tc.reason {
				t.Fatalf("err = %v, want a preflight error %s", err, tc.reason)
			}
			st, err := ReadStatus(dir)
			if err != nil {
				t.Fatal(err)
			}
			if st.Phase != PhaseFailed || st.Reason != tc.reason {
				t.Errorf("status = %+v", st)
			}
			for _, w := range tc.want {
				if !strings.Contains(st.Message, w) {
					t.Errorf("status message %q lacks %q", st.Message, w)
				}
			}
			for _, sub := range []string{PKIDir, LogDir, "etcd"} {
				if _, err := os.Stat(filepath.Join(dir, sub)); !os.IsNotExist(err) {
					t.Errorf("%s exists after a rejected start", sub)
				}
			}
		})
	}
}

// TestRunFailsWhenHealthPortIsTaken: another process listens on the
// machine's health port. The agent must give up before starting anything,
// and its status must name the port, the address and the fix.
func TestRunFailsWhenHealthPortIsTaken(t *testing.T) {
	dir, addr := etcdOnlyMachine(t)
	taken, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(HealthPort)))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	// A healthy start runs until ctx ends: the timeout only bounds a broken one.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = Run(ctx, Options{Dir: dir, BinDir: binDir(t)})
	var pf *PreflightError
	if !errors.As(err, &pf) || pf.Reason != ReasonPortInUse {
		t.Fatalf("err = %v, want a preflight error %s", err, ReasonPortInUse)
	}
	st, err := ReadStatus(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != PhaseFailed || st.Reason != ReasonPortInUse {
		t.Errorf("status = %+v, want %s/%s", st, PhaseFailed, ReasonPortInUse)
	}
	for _, w := range []string{"machine ns/m1", "port 10248 on " + addr, "health endpoint", "already in use", "stop the process", "give the machine an address"} {
		if !strings.Contains(st.Message, w) {
			t.Errorf("status message %q lacks %q", st.Message, w)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "etcd")); !os.IsNotExist(err) {
		t.Errorf("etcd's data directory exists: etcd was started (stat: %v)", err)
	}
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(EtcdClientPort)), time.Second); err == nil {
		conn.Close()
		t.Error("something listens on the machine's etcd client port")
	}
}

func TestReadMachineRejectsUnknownFieldsAndBadAddress(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, MachineFile), []byte(`{"name":"m","namespace":"n","cluster":"c","address":"x","providerID":"p","colour":1}`), 0o600)
	if _, err := ReadMachine(dir); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Errorf("unknown field: %v", err)
	}
	os.WriteFile(filepath.Join(dir, MachineFile), []byte(`{"name":"m","namespace":"n","cluster":"c","address":"x","providerID":"p"}`), 0o600)
	if _, err := ReadMachine(dir); err == nil || !strings.Contains(err.Error(), `address "x"`) {
		t.Errorf("bad address: %v", err)
	}
}

func TestIssuePKIWritesKeysPrivately(t *testing.T) {
	cas, _ := certs.NewClusterCAs(time.Now())
	doc := bootstrap.NewStacked("c1", cas, "127.0.208.100:6443", bootstrap.NewMember())
	doc.CertSANs = []string{"api.example.com", "192.0.2.10"}
	m := Machine{Name: "m1", Namespace: "ns", Cluster: "c1", Address: "127.0.208.1", ProviderID: "p"}
	dir := t.TempDir()
	p, err := IssuePKI(dir, m, doc, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p.Dir)
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("pki dir mode %v", fi.Mode().Perm())
	}
	keys, _ := filepath.Glob(filepath.Join(p.Dir, "*.key"))
	more, _ := filepath.Glob(filepath.Join(p.Dir, "etcd", "*.key"))
	confs, _ := filepath.Glob(filepath.Join(p.Dir, "*.conf"))
	all := append(append(keys, more...), confs...)
	if len(all) < 10 {
		t.Fatalf("only %d key files: %v", len(all), all)
	}
	for _, k := range all {
		fi, _ := os.Stat(k)
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", k, fi.Mode().Perm())
		}
	}
	serving, err := certs.ParseCert(mustRead(t, p.File("apiserver.crt")))
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.208.1", "127.0.208.100", "10.96.0.1", "kubernetes.default.svc", "api.example.com", "192.0.2.10"} {
		if err := serving.VerifyHostname(host); err != nil {
			t.Errorf("apiserver cert: %v", err)
		}
	}
}

func mustRead(t *testing.T, p string) []byte {
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
