package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// The components are probed every probeEvery, and every startupProbeEvery
// until the machine is first healthy: a start-up is a few seconds, and
// every step of a create, scale or rollout waits for the machine to be seen
// healthy, where a 2-s round added a second to each on average.
const (
	probeEvery        = 2 * time.Second
	startupProbeEvery = 250 * time.Millisecond
)

// A component that has answered since it last started is reported failing
// only once failureThreshold probes in a row have failed, each given
// probeTimeout, as a kubelet treats a control plane pod's probe (kubeadm's
// static pods: a 15-s timeout, 3 to 8 failures): one slow answer on a busy
// host is not a failed component, and a MachineHealthCheck that counts its
// timeout from the condition's last transition would otherwise replace
// healthy machines of a host short of CPU. A component that has not
// answered since it started, or whose process is not running, is reported
// at once.
const (
	probeTimeout     = 5 * time.Second
	failureThreshold = 3
)

// Probe is the result of one health check.
type Probe struct {
	// OK is false once the component has failed failureThreshold probes
	// in a row, or any probe since it last started.
	OK    bool      `json:"ok"`
	Error string    `json:"error,omitempty"`
	Time  time.Time `json:"time"`
	// Failures counts the failed probes since the last one that passed.
	Failures int `json:"failures,omitempty"`
	// Passed is when a probe last passed.
	Passed time.Time `json:"passed,omitzero"`
}

// next is the probe that follows prev: err is the check's outcome at now,
// and startedAt when the component's process last started.
func (prev Probe) next(err error, now, startedAt time.Time) Probe {
	if err == nil {
		return Probe{OK: true, Time: now, Passed: now}
	}
	pr := Probe{Error: err.Error(), Time: now, Failures: prev.Failures + 1, Passed: prev.Passed}
	pr.OK = pr.Failures < failureThreshold && !pr.Passed.IsZero() && pr.Passed.After(startedAt)
	return pr
}

// Health is the JSON the agent serves at http://<machine IP>:10248/healthz.
type Health struct {
	Machine    string                                 `json:"machine"`
	Healthy    bool                                   `json:"healthy"`
	Components map[bootstrap.Component]ComponentState `json:"components"`
	Probes     map[bootstrap.Component]Probe          `json:"probes"`
	Node       *NodeState                             `json:"node,omitempty"`
	// FirstHealthy is when the machine was first seen healthy: the end of
	// its start-up, to the millisecond (the Node's condition times keep
	// whole seconds).
	FirstHealthy time.Time `json:"firstHealthy,omitzero"`
}

type prober struct {
	a      *machineCtx
	client *http.Client
	// rounds has a value after each round of checks, for the node agent
	// to report a change without waiting for its next status refresh.
	rounds       chan struct{}
	mu           sync.Mutex
	probes       map[bootstrap.Component]Probe
	firstHealthy time.Time
}

func (a *machineCtx) newProber() (*prober, error) {
	// The cluster trust changes during a cluster CA rotation: it is read
	// at each probe's handshake.
	tlsCfg := certs.DynamicRootsConfig(a.pki.ClusterTrust)
	return &prober{
		a:      a,
		client: &http.Client{Timeout: probeTimeout, Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}},
		rounds: make(chan struct{}, 1),
		probes: map[bootstrap.Component]Probe{},
	}, nil
}

func (p *prober) urls() map[bootstrap.Component]string {
	a := p.a
	out := map[bootstrap.Component]string{}
	if a.doc.Runs(bootstrap.Etcd) {
		out[bootstrap.Etcd] = a.url("http", EtcdMetricsPort) + "/health"
	}
	if a.doc.Runs(bootstrap.KubeAPIServer) {
		out[bootstrap.KubeAPIServer] = a.url("https", APIServerPort) + "/readyz"
	}
	if a.doc.Runs(bootstrap.KubeControllerManager) {
		out[bootstrap.KubeControllerManager] = a.url("https", KCMPort) + "/healthz"
	}
	if a.doc.Runs(bootstrap.KubeScheduler) {
		out[bootstrap.KubeScheduler] = a.url("https", SchedulerPort) + "/healthz"
	}
	return out
}

func (p *prober) Run(ctx context.Context) {
	for {
		p.round(ctx)
		every := p.noteHealth()
		p.roundDone()
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// round probes every component at once, so that one slow to answer does
// not hold the others' probes back.
func (p *prober) round(ctx context.Context) {
	states := p.a.sup.Snapshot()
	var wg sync.WaitGroup
	for c, u := range p.urls() {
		wg.Go(func() {
			err := p.get(ctx, u)
			p.mu.Lock()
			defer p.mu.Unlock()
			p.probes[c] = p.probes[c].next(err, time.Now(), states[c].StartedAt)
		})
	}
	wg.Wait()
}

// noteHealth records when the machine is first healthy, after a round of
// probes, and returns how long to wait for the next round.
func (p *prober) noteHealth() time.Duration {
	healthy := p.a.health().Healthy
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.firstHealthy.IsZero() && healthy {
		p.firstHealthy = time.Now()
	}
	if p.firstHealthy.IsZero() {
		return startupProbeEvery
	}
	return probeEvery
}

func (p *prober) set(c bootstrap.Component, pr Probe) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probes[c] = pr
}

// roundDone tells whoever reads rounds that the probes are fresh; a round
// nobody has read yet stands for this one too.
func (p *prober) roundDone() {
	select {
	case p.rounds <- struct{}{}:
	default:
	}
}

func (p *prober) get(ctx context.Context, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s returned %d: %s", u, resp.StatusCode, body)
	}
	return nil
}

func (p *prober) snapshot() map[bootstrap.Component]Probe {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[bootstrap.Component]Probe, len(p.probes))
	for k, v := range p.probes {
		out[k] = v
	}
	return out
}

func (a *machineCtx) health() Health {
	h := Health{Machine: a.machine.Name, Components: a.sup.Snapshot(), Probes: a.prober.snapshot(), Healthy: true}
	for _, c := range a.doc.Components {
		if !h.Components[c].Running || !h.Probes[c].OK {
			h.Healthy = false
		}
	}
	if n := a.node.Load(); n != nil {
		st := n.State()
		h.Node = &st
	}
	a.prober.mu.Lock()
	h.FirstHealthy = a.prober.firstHealthy
	a.prober.mu.Unlock()
	return h
}

// ReadHealth reads the health endpoint of the machine at address. An
// unhealthy machine answers 503 with the same document, so only a failed
// request or an unreadable answer is an error.
func ReadHealth(ctx context.Context, address string) (Health, error) {
	var h Health
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(address, strconv.Itoa(HealthPort))+"/healthz", nil)
	if err != nil {
		return h, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return h, fmt.Errorf("health of %s (%s): %w", address, resp.Status, err)
	}
	return h, nil
}

// serveHealth serves the health endpoint until ctx ends. Its errors are
// PreflightErrors: nothing has started yet.
func (a *machineCtx) serveHealth(ctx context.Context) error {
	ln, err := a.listen(HealthPort, "health endpoint")
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		h := a.health()
		w.Header().Set("Content-Type", "application/json")
		if !h.Healthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	a.serve(ctx, srv, "health endpoint", func() error { return srv.Serve(ln) })
	return nil
}

// listen binds port on the machine's address for the agent's endpoint
// what. Its errors are PreflightErrors: nothing has started yet.
func (a *machineCtx) listen(port int, what string) (net.Listener, error) {
	addr := net.JoinHostPort(a.machine.Address, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, &PreflightError{Reason: ReasonPortInUse, Err: fmt.Errorf(
			"machine %s: port %d on %s, qcp-agent's %s, is already in use (%w): stop the process listening there (`ss -ltnp src %s` names it), or give the machine an address no other machine or process uses",
			a.machine, port, a.machine.Address, what, err, addr)}
	}
	if err != nil {
		return nil, &PreflightError{Reason: ReasonStartFailed, Err: fmt.Errorf("machine %s: %s on %s: %w", a.machine, what, addr, err)}
	}
	return ln, nil
}

// serve runs srv through run until ctx ends. Run waits for the server to
// close, so that an agent started again at once finds its ports free.
func (a *machineCtx) serve(ctx context.Context, srv *http.Server, what string, run func() error) {
	a.servers.Add(2)
	go func() {
		defer a.servers.Done()
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		defer a.servers.Done()
		if err := run(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error(what+" stopped", "err", err)
		}
	}()
}
