package lb

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/certs"
)

// backend is a fake API server: /readyz answers per the ready flag, and
// every other path names the backend.
type backend struct {
	name  string
	ready atomic.Bool
	srv   *httptest.Server
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
		if r.URL.Path == "/readyz" && !b.ready.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		fmt.Fprint(w, name)
	}))
	b.srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	b.srv.StartTLS()
	t.Cleanup(b.srv.Close)
	return b
}

func (b *backend) addr() string { return b.srv.Listener.Addr().String() }

func TestBalancerSendsOnlyToReadyBackends(t *testing.T) {
	ca, err := certs.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a, b := newBackend(t, ca, "a"), newBackend(t, ca, "b")
	a.ready.Store(true)
	dir := t.TempDir()
	listen := "127.0.203.1:16443"
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name+".tmp"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, name+".tmp"), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write(ConfigFile, `{"listen":"`+listen+`"}`)
	write(CAFile, string(ca.CertPEM))
	write(BackendsFile, `["`+a.addr()+`","`+b.addr()+`"]`)
	bal, err := New(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bal.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	pool, _ := certs.CertPool(ca.CertPEM)
	// Fresh connections per request: a kept-alive connection would pin a
	// backend and hide the balancer's choice.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	get := func() string {
		resp, err := client.Get("https://" + listen + "/who")
		if err != nil {
			return "error: " + err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	// only returns once `want` answered every one of 6 consecutive requests.
	only := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		streak := 0
		last := ""
		for streak < 6 {
			if time.Now().After(deadline) {
				t.Fatalf("balancer never settled on %q; last answer %q", want, last)
			}
			if last = get(); last == want {
				streak++
			} else {
				streak = 0
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	only("a")
	// a stops being ready and b becomes ready: traffic moves within probes.
	a.ready.Store(false)
	b.ready.Store(true)
	only("b")
	// Both ready: round robin reaches both.
	a.ready.Store(true)
	seen := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for len(seen) < 2 && time.Now().Before(deadline) {
		seen[get()] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("round robin answers: %v", seen)
	}
	// Removing b from the backends file moves all traffic to a.
	write(BackendsFile, `["`+a.addr()+`"]`)
	only("a")
}

// TestBalancerWaitsForTheClusterCA starts a balancer before the cluster CA
// exists, as happens when the infrastructure is provisioned before the
// control plane writes its CA: it must run, treat no backend as ready, and
// start forwarding once the CA is written.
func TestBalancerWaitsForTheClusterCA(t *testing.T) {
	ca, err := certs.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a := newBackend(t, ca, "a")
	a.ready.Store(true)
	dir := t.TempDir()
	listen := "127.0.203.2:16443"
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{"listen":"`+listen+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, BackendsFile), []byte(`["`+a.addr()+`"]`), 0o600); err != nil {
		t.Fatal(err)
	}
	bal, err := New(dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("a balancer without a CA must still start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = bal.Run(ctx) }()

	// Several probe rounds pass without a CA; none may mark the backend ready.
	deadline := time.Now().Add(3 * probeEvery)
	for time.Now().Before(deadline) {
		if r := bal.Ready(); len(r) != 0 {
			t.Fatalf("backends %v ready without a CA to verify them", r)
		}
		time.Sleep(probeEvery / 4)
	}
	if err := os.WriteFile(filepath.Join(dir, CAFile), ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, 10*time.Second)
	defer waitCancel()
	for len(bal.Ready()) != 1 {
		select {
		case <-waitCtx.Done():
			t.Fatal("backend not ready after the CA was written")
		case <-time.After(50 * time.Millisecond):
		}
	}
}
