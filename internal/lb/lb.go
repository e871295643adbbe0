// Package lb is the control plane load balancer of a process cluster: a
// TCP forwarder on a stable address that sends connections only to the API
// servers whose /readyz passes, so traffic moves off a killed or frozen
// machine within a few seconds.
package lb

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/qcp-dev/qcp/internal/certs"
)

// Files in a load balancer directory.
const (
	ConfigFile   = "lb.json"
	BackendsFile = "backends.json"
	CAFile       = "ca.crt"
)

// Timings. Probes are frequent so a frozen API server (which accepts
// connections into its backlog but never answers) drops out fast. One slow
// answer is not enough: a busy API server on a loaded host may miss a probe,
// and marking it unready would cut every connection it serves.
const (
	probeEvery   = time.Second
	probeTimeout = 2 * time.Second
	dialTimeout  = 2 * time.Second
	// failuresToUnready consecutive failed probes make a backend unready.
	failuresToUnready = 2
)

// Config is lb.json.
type Config struct {
	// Listen is the stable host:port of the control plane endpoint.
	Listen string `json:"listen"`
}

// ReadConfig reads dir/lb.json.
func ReadConfig(dir string) (Config, error) {
	var c Config
	data, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return c, fmt.Errorf("reading load balancer config: %w", err)
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("decoding %s: %w", ConfigFile, err)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return c, fmt.Errorf("%s: listen %q is not host:port: set it to the control plane endpoint", ConfigFile, c.Listen)
	}
	return c, nil
}

// Balancer forwards connections to ready backends.
type Balancer struct {
	dir    string
	log    *slog.Logger
	client *http.Client

	mu       sync.Mutex
	addr     string          // where Run listens, once it does
	backends []string        // as listed in backends.json
	ready    map[string]bool // by backend
	failures map[string]int  // consecutive failed probes, by backend
	conns    map[string]map[net.Conn]struct{}
	next     int
	modTime  time.Time

	caModTime time.Time // of ca.crt when client was built
}

// New prepares a balancer for dir. The CA in dir verifies backends; it may
// be missing or empty at first (the control plane creates the cluster CA
// after the infrastructure is up), in which case no backend counts as ready
// until it appears.
func New(dir string, log *slog.Logger) (*Balancer, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("load balancer directory: %w", err)
	}
	b := &Balancer{
		dir: dir, log: log,
		ready: map[string]bool{}, failures: map[string]int{},
		conns: map[string]map[net.Conn]struct{}{},
	}
	b.reloadCA()
	return b, nil
}

// reloadCA rebuilds the probe client when ca.crt changed. Until a valid CA
// is present the client is nil and every probe fails closed.
func (b *Balancer) reloadCA() {
	path := filepath.Join(b.dir, CAFile)
	st, err := os.Stat(path)
	if err != nil || st.ModTime().Equal(b.caModTime) {
		return
	}
	b.caModTime = st.ModTime()
	caPEM, err := os.ReadFile(path)
	if err != nil {
		return
	}
	pool, err := certs.CertPool(caPEM)
	if err != nil {
		b.log.Info("no usable cluster CA yet; no backend is ready until one is written", "file", path)
		b.setClient(nil)
		return
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}
	b.setClient(&http.Client{Transport: tr, Timeout: probeTimeout})
	b.log.Info("cluster CA loaded", "file", path)
}

func (b *Balancer) setClient(c *http.Client) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.client = c
}

// Run listens on the configured address until ctx ends.
func (b *Balancer) Run(ctx context.Context) error {
	cfg, err := ReadConfig(b.dir)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("load balancer listening on %s: %w", cfg.Listen, err)
	}
	b.mu.Lock()
	b.addr = ln.Addr().String()
	b.mu.Unlock()
	b.log.Info("load balancer listening", "address", b.Addr())
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go b.probeLoop(ctx)
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			continue
		}
		go b.forward(conn)
	}
}

// Addr returns the address Run listens on, or "" before it listens. With
// port 0 in lb.json it names the port the system chose.
func (b *Balancer) Addr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.addr
}

// Ready returns the backends that passed their last probe.
func (b *Balancer) Ready() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.readyLocked()
}

// readyLocked lists the ready backends in backends.json order; b.mu is held.
func (b *Balancer) readyLocked() []string {
	var out []string
	for _, be := range b.backends {
		if b.ready[be] {
			out = append(out, be)
		}
	}
	return out
}

func (b *Balancer) forward(client net.Conn) {
	defer client.Close()
	for _, be := range b.pick() {
		upstream, err := net.DialTimeout("tcp", be, dialTimeout)
		if err != nil {
			b.log.Warn("backend dial failed", "backend", be, "err", err)
			continue
		}
		b.track(be, client, true)
		defer b.track(be, client, false)
		pipe(client, upstream)
		return
	}
}

// pick returns the ready backends in round-robin order.
func (b *Balancer) pick() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ready := b.readyLocked()
	if len(ready) == 0 {
		return nil
	}
	b.next++
	start := b.next % len(ready)
	return append(ready[start:], ready[:start]...)
}

func (b *Balancer) track(be string, c net.Conn, add bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if add {
		if b.conns[be] == nil {
			b.conns[be] = map[net.Conn]struct{}{}
		}
		b.conns[be][c] = struct{}{}
		return
	}
	delete(b.conns[be], c)
}

func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Closing both ends unblocks the other direction.
		a.Close()
		b.Close()
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

func (b *Balancer) probeLoop(ctx context.Context) {
	for {
		b.reloadBackends()
		b.reloadCA()
		b.mu.Lock()
		backends := append([]string(nil), b.backends...)
		client := b.client
		b.mu.Unlock()
		var wg sync.WaitGroup
		results := make([]bool, len(backends))
		for i, be := range backends {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = probe(ctx, client, be)
			}()
		}
		wg.Wait()
		for i, be := range backends {
			b.setReady(be, results[i])
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(probeEvery):
		}
	}
}

func probe(ctx context.Context, client *http.Client, backend string) bool {
	if client == nil {
		return false
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+backend+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// setReady records a probe result. A backend turns ready on its first
// passed probe and unready after failuresToUnready failed ones in a row.
func (b *Balancer) setReady(be string, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.failures[be] = 0
	} else {
		b.failures[be]++
	}
	if b.ready[be] == ok || (!ok && b.failures[be] < failuresToUnready) {
		return
	}
	b.ready[be] = ok
	b.log.Info("backend readiness changed", "backend", be, "ready", ok)
	if !ok {
		// Close connections to a backend that stopped answering: a frozen
		// API server would otherwise hold its clients' watches forever.
		for c := range b.conns[be] {
			c.Close()
		}
	}
}

// reloadBackends re-reads backends.json when it changed. A missing or
// corrupt file keeps the previous list: the writer replaces it atomically,
// so that is a transient state or an operator error worth logging.
func (b *Balancer) reloadBackends() {
	path := filepath.Join(b.dir, BackendsFile)
	fi, err := os.Stat(path)
	if err != nil {
		return
	}
	b.mu.Lock()
	unchanged := fi.ModTime().Equal(b.modTime)
	b.mu.Unlock()
	if unchanged {
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var list []string
	if err := json.Unmarshal(data, &list); err != nil {
		b.log.Error("ignoring corrupt backends file", "file", path, "err", err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.modTime = fi.ModTime()
	b.backends = list
	keep := map[string]bool{}
	for _, be := range list {
		keep[be] = true
	}
	for be := range b.ready {
		if !keep[be] {
			delete(b.ready, be)
			delete(b.failures, be)
			for c := range b.conns[be] {
				c.Close()
			}
		}
	}
	b.log.Info("backends updated", "backends", list)
}
