package testkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/etcd"
)

// EtcdCluster launches real etcd members for one test, all trusting one CA,
// with TLS for client and peer traffic. Every process it starts is killed
// when the test ends, pass or fail.
type EtcdCluster struct {
	t      testing.TB
	name   string
	bin    string
	dir    string
	CA     *certs.KeyPair
	Client *certs.KeyPair
	// ExtraArgs are added to the command line of every member created
	// after they are set.
	ExtraArgs []string
	ips       *ipAllocator

	mu      sync.Mutex
	members []*EtcdProcess
}

// NewEtcdCluster prepares a cluster named name; it starts nothing. Tests
// that use it are skipped with -short (`make unit`).
func NewEtcdCluster(t testing.TB, name string) *EtcdCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real etcd; not run with -short")
	}
	bin, err := binaries.Path("etcd", binaries.EtcdVersion)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca, err := certs.NewCA(name+"-etcd-ca", now)
	if err != nil {
		t.Fatal(err)
	}
	client, err := certs.IssueEtcdClient(ca, name+"-test-client", now)
	if err != nil {
		t.Fatal(err)
	}
	c := &EtcdCluster{t: t, name: name, bin: bin, dir: t.TempDir(), CA: ca, Client: client, ips: newIPAllocator(t.Name())}
	t.Cleanup(c.killAll)
	return c
}

// EtcdProcess is one etcd member's process, on its own loopback address.
type EtcdProcess struct {
	Name    string
	IP      net.IP
	DataDir string
	LogPath string

	bin       string
	certDir   string
	token     string
	extraArgs []string
	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
	lastArgs  []string
}

// PeerURL is the member's peer URL.
func (p *EtcdProcess) PeerURL() string { return "https://" + net.JoinHostPort(p.IP.String(), "2380") }

// ClientURL is the member's client URL.
func (p *EtcdProcess) ClientURL() string { return "https://" + net.JoinHostPort(p.IP.String(), "2379") }

// NewMember allocates an address, issues the member's certificates and
// writes them to disk; the process is not started.
func (c *EtcdCluster) NewMember(name string) (*EtcdProcess, error) {
	c.mu.Lock()
	ip, err := c.ips.allocate()
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	base := filepath.Join(c.dir, name)
	p := &EtcdProcess{Name: name, IP: ip, DataDir: filepath.Join(base, "data"), LogPath: filepath.Join(base, "etcd.log"),
		bin: c.bin, certDir: filepath.Join(base, "pki"), token: c.name, extraArgs: slices.Clone(c.ExtraArgs)}
	if err := os.MkdirAll(p.certDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", p.certDir, err)
	}
	mc, err := certs.IssueEtcdMember(c.CA, name, ip, time.Now())
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"ca.crt": c.CA.CertPEM, "server.crt": mc.Server.CertPEM, "server.key": mc.Server.KeyPEM,
		"peer.crt": mc.Peer.CertPEM, "peer.key": mc.Peer.KeyPEM,
	}
	for f, data := range files {
		// 0600 for everything: keys must be, and certificates lose nothing.
		if err := os.WriteFile(filepath.Join(p.certDir, f), data, 0o600); err != nil {
			return nil, fmt.Errorf("writing %s of %s: %w", f, name, err)
		}
	}
	c.mu.Lock()
	c.members = append(c.members, p)
	c.mu.Unlock()
	return p, nil
}

// InitialCluster renders --initial-cluster for the given members.
func InitialCluster(ps ...*EtcdProcess) string {
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		parts = append(parts, p.Name+"="+p.PeerURL())
	}
	return strings.Join(parts, ",")
}

// Start launches the member. state is "new" or "existing"; initialCluster
// must list the member itself. The process runs in its own process group so
// that Kill reaches it even if it forks.
func (p *EtcdProcess) Start(initialCluster, state string) error {
	cert := func(f string) string { return filepath.Join(p.certDir, f) }
	args := []string{
		"--name", p.Name, "--data-dir", p.DataDir,
		"--listen-client-urls", p.ClientURL(), "--advertise-client-urls", p.ClientURL(),
		"--listen-peer-urls", p.PeerURL(), "--initial-advertise-peer-urls", p.PeerURL(),
		"--initial-cluster", initialCluster, "--initial-cluster-state", state, "--initial-cluster-token", p.token,
		"--client-cert-auth", "--trusted-ca-file", cert("ca.crt"), "--cert-file", cert("server.crt"), "--key-file", cert("server.key"),
		"--peer-client-cert-auth", "--peer-trusted-ca-file", cert("ca.crt"), "--peer-cert-file", cert("peer.crt"), "--peer-key-file", cert("peer.key"),
	}
	return p.start(append(args, p.extraArgs...))
}

// Restart starts a stopped or killed member again with its data dir.
func (p *EtcdProcess) Restart() error {
	p.mu.Lock()
	args := p.lastArgs
	p.mu.Unlock()
	if args == nil {
		return fmt.Errorf("etcd member %s was never started", p.Name)
	}
	return p.start(args)
}

func (p *EtcdProcess) start(args []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !closed(p.done) {
		return fmt.Errorf("etcd member %s is already running", p.Name)
	}
	log, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening log of %s: %w", p.Name, err)
	}
	cmd := exec.Command(p.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("starting etcd member %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = log.Close()
		close(done)
	}()
	p.cmd, p.done, p.lastArgs = cmd, done, args
	return nil
}

// Running reports whether the process is alive.
func (p *EtcdProcess) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !closed(p.done)
}

// Exited returns a channel closed when the current process exits (a removed
// member stops itself), or nil if it was never started.
func (p *EtcdProcess) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Kill sends SIGKILL to the member's process group and waits for it to exit.
func (p *EtcdProcess) Kill() error { return p.signal(syscall.SIGKILL, 10*time.Second) }

// Stop asks the member to shut down (SIGTERM) and kills it if it has not
// exited within 10 s.
func (p *EtcdProcess) Stop() error {
	if err := p.signal(syscall.SIGTERM, 10*time.Second); err != nil {
		return p.Kill()
	}
	return nil
}

// Freeze stops the member (SIGSTOP), as a hung host: its connections stay
// open and nothing answers. It returns once every thread of the member has
// stopped: the signal is only queued when kill returns, and a busy machine
// may run a thread on for a while (CI saw a request sent right after kill
// answered). Thaw lets it run again.
func (p *EtcdProcess) Freeze() error {
	if err := p.signalOnly(syscall.SIGSTOP); err != nil {
		return err
	}
	p.mu.Lock()
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return Eventually(ctx, 10*time.Millisecond, "etcd member "+p.Name+" stopped", func(context.Context) error { return stopped(pid) })
}

// ProcStat reads a /proc stat file (of a process or a thread) and returns
// its fields after the command name, which may hold spaces and is in
// parentheses: field N of proc(5) is at index N-3, the state at 0.
func ProcStat(path string) ([]string, error) {
	stat, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])), nil
}

// CPUSeconds is the CPU time (user and system) process pid has used, from
// /proc/<pid>/stat.
func CPUSeconds(pid int) (float64, error) {
	f, err := ProcStat(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100, nil // USER_HZ
}

// stopped returns nil once every thread of process pid is stopped.
func stopped(pid int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, task := range tasks {
		fields, err := ProcStat(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue // the thread has exited
		}
		if len(fields) == 0 || (fields[0] != "T" && fields[0] != "t") {
			return fmt.Errorf("thread %s is not stopped yet", task.Name())
		}
	}
	return nil
}

// Thaw continues a frozen member (SIGCONT).
func (p *EtcdProcess) Thaw() error { return p.signalOnly(syscall.SIGCONT) }

func (p *EtcdProcess) signalOnly(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("etcd member %s was never started", p.Name)
	}
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("signalling etcd member %s: %w", p.Name, err)
	}
	return nil
}

func (p *EtcdProcess) signal(sig syscall.Signal, wait time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || closed(done) {
		return nil
	}
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signalling etcd member %s: %w", p.Name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("etcd member %s did not exit within %s of %v", p.Name, wait, sig)
	}
}

func (c *EtcdCluster) killAll() {
	c.mu.Lock()
	ms := append([]*EtcdProcess(nil), c.members...)
	c.mu.Unlock()
	for _, p := range ms {
		if err := p.Kill(); err != nil {
			c.t.Errorf("cleanup: %v", err)
		}
	}
}

// Config returns a client configuration for the given endpoints.
func (c *EtcdCluster) Config(endpoints ...string) etcd.Config {
	return etcd.Config{Endpoints: endpoints, CAPEM: c.CA.CertPEM, CertPEM: c.Client.CertPEM, KeyPEM: c.Client.KeyPEM}
}

// NewClient returns a client for the given members, closed when the test ends.
func (c *EtcdCluster) NewClient(ps ...*EtcdProcess) *etcd.Client {
	c.t.Helper()
	eps := make([]string, 0, len(ps))
	for _, p := range ps {
		eps = append(eps, p.ClientURL())
	}
	cli, err := etcd.New(c.Config(eps...))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Bootstrap creates, starts and waits for an n-member cluster.
func (c *EtcdCluster) Bootstrap(ctx context.Context, n int) ([]*EtcdProcess, error) {
	ps := make([]*EtcdProcess, 0, n)
	for i := range n {
		p, err := c.NewMember(fmt.Sprintf("%s-%d", c.name, i))
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	ic := InitialCluster(ps...)
	for _, p := range ps {
		if err := p.Start(ic, "new"); err != nil {
			return nil, err
		}
	}
	cli, err := etcd.New(c.Config(ps[0].ClientURL()))
	if err != nil {
		return nil, err
	}
	defer func() { _ = cli.Close() }()
	for _, p := range ps {
		if err := WaitHealthy(ctx, cli, p); err != nil {
			return nil, err
		}
	}
	return ps, nil
}

// StartEtcdCluster is NewEtcdCluster, Bootstrap and NewClient in one, for
// tests that want n running members and a client of them; it fails t if
// the members do not start.
func StartEtcdCluster(ctx context.Context, t testing.TB, name string, n int) (*EtcdCluster, []*EtcdProcess, *etcd.Client) {
	t.Helper()
	cl := NewEtcdCluster(t, name)
	ps, err := cl.Bootstrap(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	return cl, ps, cl.NewClient(ps...)
}

// WaitHealthy waits until member p serves linearizable reads.
func WaitHealthy(ctx context.Context, cli *etcd.Client, p *EtcdProcess) error {
	return Eventually(ctx, 100*time.Millisecond, "etcd member "+p.Name+" healthy (log: "+p.LogPath+")", func(ctx context.Context) error {
		if !p.Running() {
			return fmt.Errorf("process %s exited", p.Name)
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return cli.Health(cctx, p.ClientURL())
	})
}

func closed(ch chan struct{}) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
