// Package objectstore runs a real S3-compatible object store on this host:
// versitygw (bin/versitygw-<version>) serving a directory over HTTPS. The
// local environment starts one for its clusters' backups, and the backup
// tests store their snapshots in one. It is not QCP's client of a store:
// that is internal/backup/s3store, which talks to any S3 service.
package objectstore

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/certs"
)

// Options configure a Server.
type Options struct {
	// Dir holds the server's files: its certificate and key, its log, and
	// data/, the buckets. It is created if missing.
	Dir string
	// Address is the host address to serve on (127.0.0.1 if empty).
	Address string
	// Port is the port to serve on; 0 picks a free one.
	Port int
}

// Server is a running versitygw.
type Server struct {
	// Endpoint is the store's https URL.
	Endpoint string
	// CA is the PEM certificate authority that signed the store's serving
	// certificate, which a client must trust.
	CA []byte
	// AccessKeyID and SecretAccessKey are the store's root credentials.
	AccessKeyID, SecretAccessKey string
	// DataDir is the directory behind the store: a bucket is a directory
	// in it, an object a file.
	DataDir string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts versitygw on a directory of its own and waits until it
// answers. Stop stops it; the caller removes Dir if it wants the data gone.
func Start(ctx context.Context, opts Options) (*Server, error) {
	bin, err := binaries.Path("versitygw", binaries.ObjectStoreVersion)
	if err != nil {
		return nil, err
	}
	addr := opts.Address
	if addr == "" {
		addr = "127.0.0.1"
	}
	port := opts.Port
	if port == 0 {
		if port, err = freePort(addr); err != nil {
			return nil, err
		}
	}
	s := &Server{DataDir: filepath.Join(opts.Dir, "data"), done: make(chan struct{})}
	if err := os.MkdirAll(s.DataDir, 0o700); err != nil {
		return nil, err
	}
	certFile, keyFile, err := s.writeServingCert(opts.Dir, addr)
	if err != nil {
		return nil, err
	}
	if s.AccessKeyID, err = randomHex(10); err != nil {
		return nil, err
	}
	if s.SecretAccessKey, err = randomHex(20); err != nil {
		return nil, err
	}
	listen := net.JoinHostPort(addr, strconv.Itoa(port))
	s.Endpoint = "https://" + listen
	logFile, err := os.OpenFile(filepath.Join(opts.Dir, "versitygw.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	// The credentials go through the environment, not the command line,
	// which any user of the host can read.
	s.cmd = exec.Command(bin, "--port", listen, "--cert", certFile, "--key", keyFile, "--quiet", "posix", s.DataDir)
	s.cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKeyID, "ROOT_SECRET_ACCESS_KEY="+s.SecretAccessKey)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting versitygw: %w", err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	if err := s.waitReady(ctx); err != nil {
		_ = s.Stop()
		return nil, fmt.Errorf("versitygw on %s did not answer (its log: %s): %w", listen, logFile.Name(), err)
	}
	return s, nil
}

// writeServingCert makes a CA and a serving certificate for addr, and
// writes the certificate and its key (0600) into dir.
func (s *Server) writeServingCert(dir, addr string) (certFile, keyFile string, err error) {
	now := time.Now()
	ca, err := certs.NewCA("qcp-object-store-ca", now)
	if err != nil {
		return "", "", err
	}
	req := certs.Request{CommonName: "qcp-object-store", DNSNames: []string{"localhost"}, Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if ip := net.ParseIP(addr); ip != nil {
		req.IPs = []net.IP{ip}
	} else {
		req.DNSNames = append(req.DNSNames, addr)
	}
	serving, err := ca.Issue(req, now)
	if err != nil {
		return "", "", err
	}
	s.CA = ca.CertPEM
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, serving.CertPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, os.WriteFile(keyFile, serving.KeyPEM, 0o600)
}

// waitReady polls the endpoint until it answers over TLS, with any status:
// an anonymous request is refused, which is an answer.
func (s *Server) waitReady(ctx context.Context) error {
	pool, err := certs.CertPool(s.CA)
	if err != nil {
		return err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint, nil)
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		last = err
		select {
		case <-s.done:
			return fmt.Errorf("it exited: %v", s.err)
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops the server (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (s *Server) Stop() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
	return nil
}

// Exited is closed when the server's process has exited.
func (s *Server) Exited() <-chan struct{} { return s.done }

// freePort asks the kernel for a free port on addr.
func freePort(addr string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port for the object store on %s: %w", addr, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
