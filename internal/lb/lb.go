// Package lb is a TCP forwarder on a stable address that sends connections
// only to backends whose probe passes, so traffic moves off a killed or
// frozen machine within a few seconds. It is the control plane load
// balancer of a process cluster (API servers, probed at /readyz), and the
// local etcd endpoint qcp-agent gives an API server whose etcd is an
// EtcdCluster (members, probed at /health).
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
	"slices"
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

// Source lists the backends, as host:port. ok false keeps the previous
// list: nothing changed, or the source cannot be read right now.
type Source func(ctx context.Context) (backends []string, ok bool)

// Probe reports whether backend serves. It is called for every backend
// once a second, and must return within probeTimeout.
type Probe func(ctx context.Context, backend string) bool

// Balancer forwards connections to ready backends.
type Balancer struct {
	log    *slog.Logger
	listen func() (string, error)
	source Source
	probe  Probe

	mu       sync.Mutex
	addr     string          // where Run listens, once it does
	backends []string        // as the source last listed them
	ready    map[string]bool // by backend
	failures map[string]int  // consecutive failed probes, by backend
	conns    map[string]map[net.Conn]struct{}
	next     int
}

// NewBalancer returns a balancer that will listen on listen (port 0: one
// the system chooses; Addr names it) and forward to the backends source
// lists that pass probe.
func NewBalancer(listen string, source Source, probe Probe, log *slog.Logger) *Balancer {
	b := newBalancer(source, probe, log)
	b.listen = func() (string, error) { return listen, nil }
	return b
}

func newBalancer(source Source, probe Probe, log *slog.Logger) *Balancer {
	return &Balancer{
		log: log, source: source, probe: probe,
		ready: map[string]bool{}, failures: map[string]int{},
		conns: map[string]map[net.Conn]struct{}{},
	}
}

// New prepares the control plane load balancer of dir: it listens where
// lb.json says, forwards to the API servers backends.json lists, and probes
// their /readyz with the CA in dir. The CA may be missing or empty at first
// (the control plane creates the cluster CA after the infrastructure is
// up), in which case no backend counts as ready until it appears.
func New(dir string, log *slog.Logger) (*Balancer, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("load balancer directory: %w", err)
	}
	d := &dirFiles{dir: dir, log: log}
	d.reloadCA()
	b := newBalancer(d.backends, d.probe, log)
	b.listen = func() (string, error) {
		cfg, err := ReadConfig(dir)
		return cfg.Listen, err
	}
	return b, nil
}

// dirFiles is a load balancer directory: the backends in backends.json, and
// the CA in ca.crt that verifies their /readyz.
type dirFiles struct {
	dir string
	log *slog.Logger

	mu        sync.Mutex
	client    *http.Client
	modTime   time.Time // of backends.json when last read
	caModTime time.Time // of ca.crt when client was built
}

// reloadCA rebuilds the probe client when ca.crt changed. Until a valid CA
// is present the client is nil and every probe fails closed.
func (d *dirFiles) reloadCA() {
	path := filepath.Join(d.dir, CAFile)
	st, err := os.Stat(path)
	if err != nil || st.ModTime().Equal(d.caModTime) {
		return
	}
	d.caModTime = st.ModTime()
	caPEM, err := os.ReadFile(path)
	if err != nil {
		return
	}
	pool, err := certs.CertPool(caPEM)
	if err != nil {
		d.log.Info("no usable cluster CA yet; no backend is ready until one is written", "file", path)
		d.setClient(nil)
		return
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}
	d.setClient(&http.Client{Transport: tr, Timeout: probeTimeout})
	d.log.Info("cluster CA loaded", "file", path)
}

func (d *dirFiles) setClient(c *http.Client) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.client = c
}

// probe asks an API server's /readyz.
func (d *dirFiles) probe(ctx context.Context, backend string) bool {
	d.mu.Lock()
	client := d.client
	d.mu.Unlock()
	return HTTPProbe(ctx, client, "https://"+backend+"/readyz")
}

// HTTPProbe reports whether GET url answers 200 OK through client; a nil
// client fails closed.
func HTTPProbe(ctx context.Context, client *http.Client, url string) bool {
	if client == nil {
		return false
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
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

// backends re-reads backends.json when it changed, and the CA with it. A
// missing or corrupt file keeps the previous list: the writer replaces it
// atomically, so that is a transient state or an operator error worth
// logging.
func (d *dirFiles) backends(context.Context) ([]string, bool) {
	d.reloadCA()
	path := filepath.Join(d.dir, BackendsFile)
	fi, err := os.Stat(path)
	if err != nil || fi.ModTime().Equal(d.modTime) {
		return nil, false
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	var list []string
	if err := json.Unmarshal(data, &list); err != nil {
		d.log.Error("ignoring corrupt backends file", "file", path, "err", err)
		return nil, false
	}
	d.modTime = fi.ModTime()
	return list, true
}

// Run listens and serves until ctx ends.
func (b *Balancer) Run(ctx context.Context) error {
	ln, err := b.listenNow()
	if err != nil {
		return err
	}
	return b.serve(ctx, ln)
}

// Start listens, serves in the background until ctx ends, and returns the
// address it listens on.
func (b *Balancer) Start(ctx context.Context) (string, error) {
	ln, err := b.listenNow()
	if err != nil {
		return "", err
	}
	go func() {
		if err := b.serve(ctx, ln); err != nil {
			b.log.Error("load balancer stopped", "err", err)
		}
	}()
	return b.Addr(), nil
}

func (b *Balancer) listenNow() (net.Listener, error) {
	listen, err := b.listen()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("load balancer listening on %s: %w", listen, err)
	}
	b.mu.Lock()
	b.addr = ln.Addr().String()
	b.mu.Unlock()
	b.log.Info("load balancer listening", "address", b.Addr())
	return ln, nil
}

func (b *Balancer) serve(ctx context.Context, ln net.Listener) error {
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
		if list, ok := b.source(ctx); ok {
			b.setBackends(list)
		}
		b.mu.Lock()
		backends := append([]string(nil), b.backends...)
		b.mu.Unlock()
		var wg sync.WaitGroup
		results := make([]bool, len(backends))
		for i, be := range backends {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pctx, cancel := context.WithTimeout(ctx, probeTimeout)
				defer cancel()
				results[i] = b.probe(pctx, be)
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

// setBackends replaces the backend list, and closes the connections to
// backends no longer on it.
func (b *Balancer) setBackends(list []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if slices.Equal(b.backends, list) {
		return
	}
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
