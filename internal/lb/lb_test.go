package lb

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// backend is a fake API server: /readyz answers per the ready flag (or
// never, while frozen), /watch holds the connection open as a watch does,
// and every other path names the backend.
type backend struct {
	name   string
	ready  atomic.Bool
	frozen atomic.Bool
	// hangNext makes the next probe hang, as a busy API server's might.
	hangNext atomic.Bool
	probes   atomic.Int64
	srv      *httptest.Server
}

func newBackend(t *testing.T, ca *certs.KeyPair, name string) *backend {
	kp, err := ca.Issue(certs.Request{CommonName: name, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Usages: certs.ServerUsage}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/readyz":
			b.probes.Add(1)
			if b.frozen.Load() || b.hangNext.CompareAndSwap(true, false) {
				<-r.Context().Done()
				return
			}
			if !b.ready.Load() {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
		case r.URL.Path == "/watch":
			fmt.Fprintln(w, name)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		fmt.Fprint(w, name)
	}))
	b.srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	// Probes and clients the balancer cuts off log handshake errors.
	b.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	b.srv.StartTLS()
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) addr() string { return b.srv.Listener.Addr().String() }

// lbDir writes a load balancer directory listening on a port the system
// picks, with the given backends and, unless ca is nil, the cluster CA.
func lbDir(t *testing.T, ca *certs.KeyPair, backends ...*backend) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, dir, ConfigFile, `{"listen":"127.0.0.1:0"}`)
	if ca != nil {
		writeFile(t, dir, CAFile, string(ca.CertPEM))
	}
	writeBackends(t, dir, backends...)
	return dir
}

func writeBackends(t *testing.T, dir string, backends ...*backend) {
	t.Helper()
	addrs := make([]string, 0, len(backends))
	for _, b := range backends {
		addrs = append(addrs, `"`+b.addr()+`"`)
	}
	writeFile(t, dir, BackendsFile, "["+strings.Join(addrs, ",")+"]")
}

// writeFile replaces dir/name atomically, as machinehost does.
func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name+".tmp"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, name+".tmp"), filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// start runs a balancer on dir and returns it with the address it listens
// on. When the test ends the balancer is stopped, and Run must have
// returned without an error.
func start(t *testing.T, dir string) (*Balancer, string) {
	t.Helper()
	bal, err := New(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bal.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	wait(t, "the balancer to listen", func() error {
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("Run returned early: %w", err)
		default:
		}
		if bal.Addr() == "" {
			return errors.New("not listening yet")
		}
		return nil
	})
	return bal, bal.Addr()
}

func wait(t *testing.T, what string, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := testkit.Eventually(ctx, 50*time.Millisecond, what, func(context.Context) error { return cond() }); err != nil {
		t.Fatal(err)
	}
}

// client makes a fresh connection per request: a kept-alive connection
// would pin a backend and hide the balancer's choice.
func client(t *testing.T, ca *certs.KeyPair) *http.Client {
	pool, err := certs.CertPool(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsConfig(pool)}}
}

func tlsConfig(pool *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// get returns the name of the backend that answered through the balancer.
func get(c *http.Client, addr string) (string, error) {
	resp, err := c.Get("https://" + addr + "/who")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// only returns once want answered every one of 6 consecutive requests.
func only(t *testing.T, c *http.Client, addr, want string) {
	t.Helper()
	streak := 0
	wait(t, fmt.Sprintf("6 answers in a row from %q", want), func() error {
		got, err := get(c, addr)
		if err != nil || got != want {
			streak = 0
			return fmt.Errorf("answer %q, error %v", got, err)
		}
		if streak++; streak < 6 {
			return errors.New("streak not complete")
		}
		return nil
	})
}

func TestBalancerSendsOnlyToReadyBackends(t *testing.T) {
	ca, err := certs.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a, b := newBackend(t, ca, "a"), newBackend(t, ca, "b")
	a.ready.Store(true)
	dir := lbDir(t, ca, a, b)
	_, addr := start(t, dir)
	c := client(t, ca)
	only(t, c, addr, "a")
	// a stops being ready and b becomes ready: traffic moves within probes.
	a.ready.Store(false)
	b.ready.Store(true)
	only(t, c, addr, "b")
	// Both ready: round robin reaches both.
	a.ready.Store(true)
	seen := map[string]bool{}
	wait(t, "answers from both backends", func() error {
		got, _ := get(c, addr)
		seen[got] = true
		if !seen["a"] || !seen["b"] {
			return fmt.Errorf("answers so far: %v", seen)
		}
		return nil
	})
	// Removing b from the backends file moves all traffic to a.
	writeBackends(t, dir, a)
	only(t, c, addr, "a")
}

// TestBalancerWaitsForTheClusterCA starts a balancer before the cluster CA
// exists, as happens when the infrastructure is provisioned before the
// control plane writes its CA: it must run, forward nothing, and forward
// requests once the CA is written.
func TestBalancerWaitsForTheClusterCA(t *testing.T) {
	ca, err := certs.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a := newBackend(t, ca, "a")
	a.ready.Store(true)
	dir := lbDir(t, nil, a)
	bal, addr := start(t, dir)
	c := client(t, ca)

	// Several probe rounds pass without a CA; none may make the backend
	// ready or carry a request to it.
	for deadline := time.Now().Add(3 * probeEvery); time.Now().Before(deadline); {
		if got, err := get(c, addr); err == nil {
			t.Fatalf("a request was forwarded to %q without a CA to verify the backend", got)
		}
		if r := bal.Ready(); len(r) != 0 {
			t.Fatalf("backends %v ready without a CA to verify them", r)
		}
	}
	writeFile(t, dir, CAFile, string(ca.CertPEM))
	only(t, c, addr, "a")
}

// TestBalancerClosesConnectionsToAnUnreadyBackend holds a watch open
// through the balancer and freezes its backend: the balancer must close
// the client's connection, so the client reconnects to a live API server
// instead of waiting on a frozen one forever.
func TestBalancerClosesConnectionsToAnUnreadyBackend(t *testing.T) {
	ca, a, addr := startWithOneBackend(t)
	conn, body := openWatch(t, ca, addr)
	a.frozen.Store(true)
	// The watch never ends by itself: the read returns only when the
	// balancer closes the connection (or the deadline, a failure).
	if err := conn.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	_, err := io.Copy(io.Discard, body)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the watch on a frozen backend was still open after a minute")
	}
}

// TestBalancerKeepsBackendsWhenTheFileIsCorrupt writes a corrupt
// backends.json over a good one: the balancer must keep serving from the
// previous list, and pick up the next good file.
func TestBalancerKeepsBackendsWhenTheFileIsCorrupt(t *testing.T) {
	ca, err := certs.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a, b := newBackend(t, ca, "a"), newBackend(t, ca, "b")
	a.ready.Store(true)
	b.ready.Store(true)
	dir := lbDir(t, ca, a)
	_, addr := start(t, dir)
	c := client(t, ca)
	only(t, c, addr, "a")

	writeFile(t, dir, BackendsFile, `["`+a.addr()+`", not json`)
	// Each probe round re-reads the file first; two more probes of a mean
	// a round ran after the corrupt write.
	before := a.probes.Load()
	wait(t, "two probe rounds after the corrupt write", func() error {
		if n := a.probes.Load() - before; n < 2 {
			return fmt.Errorf("%d probes so far", n)
		}
		return nil
	})
	for i := range 6 {
		if got, err := get(c, addr); err != nil || got != "a" {
			t.Fatalf("request %d after a corrupt backends file: %q, %v", i, got, err)
		}
	}
	writeBackends(t, dir, b)
	only(t, c, addr, "b")
}

// TestBalancerWithoutAReadyBackendClosesConnections checks that a client
// is turned away at once when no backend is ready, rather than left hanging.
func TestBalancerWithoutAReadyBackendClosesConnections(t *testing.T) {
	ca, a, addr := startWithOneBackend(t)
	c := client(t, ca)
	a.ready.Store(false)
	wait(t, "requests refused with no ready backend", func() error {
		got, err := get(c, addr)
		if err == nil {
			return fmt.Errorf("answered by %q", got)
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the request hung until the client gave up: %v", err)
		}
		return nil
	})
}

// openWatch starts a request through the balancer that the backend holds
// open, as a Kubernetes watch, and returns its connection and body.
func openWatch(t *testing.T, ca *certs.KeyPair, addr string) (net.Conn, io.Reader) {
	t.Helper()
	pool, err := certs.CertPool(ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", addr, tlsConfig(pool))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := fmt.Fprint(conn, "GET /watch HTTP/1.1\r\nHost: a\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := bufio.NewReader(resp.Body)
	if line, err := body.ReadString('\n'); err != nil || line != "a\n" {
		t.Fatalf("watch started with %q, %v", line, err)
	}
	return conn, body
}

// TestBalancerKeepsABackendThatMissesOneProbe lets one probe of a busy
// backend time out: its connections must stay open, since cutting them
// would fail every client of an API server that is merely slow.
func TestBalancerKeepsABackendThatMissesOneProbe(t *testing.T) {
	ca, a, addr := startWithOneBackend(t)
	conn, body := openWatch(t, ca, addr)

	before := a.probes.Load()
	a.hangNext.Store(true)
	// The hung probe and two answered ones after it.
	wait(t, "three probes after the slow one began", func() error {
		if n := a.probes.Load() - before; n < 3 {
			return fmt.Errorf("%d probes so far", n)
		}
		return nil
	})
	if err := conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := body.Read(make([]byte, 1))
	if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("the watch ended (%v) after a single missed probe", err)
	}
}

// startWithOneBackend runs a balancer with one ready backend, a, and
// returns once a answers through it.
func startWithOneBackend(t *testing.T) (*certs.KeyPair, *backend, string) {
	t.Helper()
	ca, err := certs.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a := newBackend(t, ca, "a")
	a.ready.Store(true)
	_, addr := start(t, lbDir(t, ca, a))
	only(t, client(t, ca), addr, "a")
	return ca, a, addr
}
