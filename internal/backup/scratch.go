package backup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/qcp-dev/qcp/internal/certs"
)

// ScratchTimeout bounds a scratch restore: the restore, the start of etcd
// on the restored data, and its answer.
const ScratchTimeout = 5 * time.Minute

// Restored is what a scratch restore found.
type Restored struct {
	// Revision is the snapshot's revision, as etcdutl reads it from the
	// file, and the revision the scratch etcd served: ScratchRestore
	// fails if they differ.
	Revision int64
	// Keys is the number of keys in the snapshot.
	Keys int64
}

// ScratchRestore proves that a snapshot restores: it writes snapshot (the
// plaintext) into dir, reads its revision (`etcd etcdutl snapshot
// status`), restores it with `etcd etcdutl snapshot restore`, which checks
// the hash etcd appends to every snapshot, starts a single-member etcd on
// the result (TLS on loopback, with a throwaway CA, on ports of its own),
// and checks that it serves that revision. Everything in dir is removed
// before it returns. etcdBin is the etcd of the version that
// wrote the snapshot, built with its etcdutl (hack/tools/etcd).
//
// The disk it uses is dir's: the snapshot, plus the restored data, about
// twice the snapshot's size.
func ScratchRestore(ctx context.Context, etcdBin, dir string, snapshot io.Reader) (Restored, error) {
	var r Restored
	rev, err := scratchRestore(ctx, etcdBin, dir, snapshot, &r)
	if err != nil {
		return Restored{}, err
	}
	if rev != r.Revision {
		return Restored{}, fmt.Errorf("the snapshot's file says revision %d, and etcd restored from it serves revision %d", r.Revision, rev)
	}
	return r, nil
}

func scratchRestore(ctx context.Context, etcdBin, dir string, snapshot io.Reader, r *Restored) (rev int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, ScratchTimeout)
	defer cancel()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "snapshot.db")
	if err := writeFile(file, snapshot); err != nil {
		return 0, err
	}
	status := exec.CommandContext(ctx, etcdBin, "etcdutl", "snapshot", "status", file, "-w", "json")
	out, err := status.Output()
	if err != nil {
		return 0, fmt.Errorf("etcdutl snapshot status refused the snapshot: %w: %s", err, lastLine(stderrOf(err)))
	}
	var st struct {
		Revision int64 `json:"revision"`
		TotalKey int64 `json:"totalKey"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Revision <= 0 {
		return 0, fmt.Errorf("etcdutl snapshot status gave no revision (%v): %s", err, lastLine(out))
	}
	r.Revision, r.Keys = st.Revision, st.TotalKey
	ports, err := freePorts(2)
	if err != nil {
		return 0, err
	}
	peer := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	client := "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	data := filepath.Join(dir, "data")
	restore := exec.CommandContext(ctx, etcdBin, "etcdutl", "snapshot", "restore", file, "--data-dir", data,
		"--name", "scratch", "--initial-cluster", "scratch="+peer, "--initial-advertise-peer-urls", peer)
	if out, err := restore.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("etcdutl snapshot restore refused the snapshot: %w: %s", err, lastLine(out))
	}
	if err := os.Remove(file); err != nil {
		return 0, err
	}
	tlsFiles, cli, err := scratchPKI(dir)
	if err != nil {
		return 0, err
	}
	log, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return 0, err
	}
	defer log.Close()
	cmd := exec.Command(etcdBin, "--name", "scratch", "--data-dir", data,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "scratch="+peer,
		"--cert-file", tlsFiles.cert, "--key-file", tlsFiles.key, "--trusted-ca-file", tlsFiles.ca, "--client-cert-auth",
		"--peer-cert-file", tlsFiles.cert, "--peer-key-file", tlsFiles.key, "--peer-trusted-ca-file", tlsFiles.ca, "--peer-client-cert-auth")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting a scratch etcd on the restored data: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	cli.Endpoints = []string{client}
	cli.Logger = zap.NewNop()
	c, err := clientv3.New(cli)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	for {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := c.Status(sctx, client)
		scancel()
		if err == nil {
			return st.Header.Revision, nil
		}
		select {
		case werr := <-exited:
			exited <- werr
			out, _ := os.ReadFile(log.Name())
			return 0, fmt.Errorf("the scratch etcd on the restored data exited (%v): %s", werr, lastLine(out))
		case <-ctx.Done():
			return 0, fmt.Errorf("the scratch etcd on the restored data did not answer within %s: %w", ScratchTimeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

type pkiFiles struct{ ca, cert, key string }

// scratchPKI makes a throwaway CA and one certificate for the scratch
// member (server, peer and client), written into dir with 0600.
func scratchPKI(dir string) (pkiFiles, clientv3.Config, error) {
	now := time.Now()
	ca, err := certs.NewCA("qcp-scratch-restore", now)
	if err != nil {
		return pkiFiles{}, clientv3.Config{}, err
	}
	kp, err := ca.Issue(certs.Request{CommonName: "scratch", IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}, now)
	if err != nil {
		return pkiFiles{}, clientv3.Config{}, err
	}
	f := pkiFiles{ca: filepath.Join(dir, "ca.crt"), cert: filepath.Join(dir, "scratch.crt"), key: filepath.Join(dir, "scratch.key")}
	for name, b := range map[string][]byte{f.ca: ca.CertPEM, f.cert: kp.CertPEM, f.key: kp.KeyPEM} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			return pkiFiles{}, clientv3.Config{}, err
		}
	}
	pool, err := certs.CertPool(ca.CertPEM)
	if err != nil {
		return pkiFiles{}, clientv3.Config{}, err
	}
	pair, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		return pkiFiles{}, clientv3.Config{}, err
	}
	tlsCfg := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	return f, clientv3.Config{TLS: tlsCfg, DialTimeout: 2 * time.Second}, nil
}

func writeFile(name string, r io.Reader) error {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("writing the snapshot to %s: %w", name, err)
	}
	return errors.Join(f.Sync(), f.Close())
}

// freePorts asks the kernel for n free loopback ports.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func stderrOf(err error) []byte {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.Stderr
	}
	return nil
}

// lastLine is the last non-empty line of a command's output.
func lastLine(out []byte) string {
	lines := strings.Split(string(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if lines[i] != "" {
			return lines[i]
		}
	}
	return "(no output)"
}
