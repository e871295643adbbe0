package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// etcdOnlyMachine writes an etcd-only machine, the cheapest real one, at an
// address reserved for t, and returns its directory and address.
func etcdOnlyMachine(t *testing.T) (dir, addr string) {
	t.Helper()
	testkit.RequireBinaries(t, "etcd")
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	data, err := bootstrap.Marshal(bootstrap.NewEtcdOnly("c1-etcd", cas.Etcd, bootstrap.NewMember()))
	if err != nil {
		t.Fatal(err)
	}
	addr = testkit.ReserveAddress(t)
	return writeMachineDir(t, addr, data), addr
}

func binDir(t *testing.T) string {
	t.Helper()
	dir, err := binaries.Dir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// runAgent runs the agent in the test process until the test ends; its
// components are children of the test, so the test can crash them.
func runAgent(t *testing.T, opts Options) {
	t.Helper()
	opts.BinDir = binDir(t)
	opts.Log = slog.New(slog.NewTextHandler(t.Output(), nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, opts) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
}

// waitEtcd polls the machine's health endpoint until cond accepts what it
// says of etcd, and returns etcd's state then.
func waitEtcd(ctx context.Context, t *testing.T, addr, what string, cond func(ComponentState, Probe) error) ComponentState {
	t.Helper()
	var st ComponentState
	err := testkit.Eventually(ctx, 50*time.Millisecond, what, func(ctx context.Context) error {
		h, err := ReadHealth(ctx, addr)
		if err != nil {
			return err
		}
		st = h.Components[bootstrap.Etcd]
		return cond(st, h.Probes[bootstrap.Etcd])
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// crash kills the running etcd and waits for the agent to start it again.
// It returns the new state and how long after the kill the new process
// started, an upper bound of the agent's backoff.
func crash(ctx context.Context, t *testing.T, addr string, before ComponentState) (ComponentState, time.Duration) {
	t.Helper()
	killed := time.Now()
	if err := syscall.Kill(before.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("killing etcd (pid %d): %v", before.PID, err)
	}
	after := waitEtcd(ctx, t, addr, "etcd to be restarted", func(st ComponentState, _ Probe) error {
		if !st.Running || st.Restarts != before.Restarts+1 {
			return fmt.Errorf("etcd %+v; before the crash %+v", st, before)
		}
		return nil
	})
	return after, after.StartedAt.Sub(killed)
}

// TestRestartBackoff crash-loops a real etcd under a real agent: each
// restart waits twice as long as the one before, and once etcd has run
// healthy for StableRun the next crash is restarted after the minimum
// delay again, not after the doubled one.
func TestRestartBackoff(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd")
	}
	dir, addr := etcdOnlyMachine(t)
	// Long enough that a loaded machine still kills each restarted etcd
	// well within it.
	const stable = 5 * time.Second
	runAgent(t, Options{Dir: dir, StableRun: stable})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	etcd := waitEtcd(ctx, t, addr, "etcd to run and answer its health check", func(st ComponentState, p Probe) error {
		if !st.Running || !p.OK {
			return fmt.Errorf("etcd %+v, probe %+v", st, p)
		}
		return nil
	})

	// Each kill comes moments after a start, well within stable: a loop.
	for i, want := range []time.Duration{minBackoff, 2 * minBackoff, 4 * minBackoff} {
		var delay time.Duration
		etcd, delay = crash(ctx, t, addr, etcd)
		t.Logf("crash %d: restarted after %v", i+1, delay.Round(time.Millisecond))
		if delay < want {
			t.Errorf("crash %d: etcd restarted %v after it died, want at least %v: the backoff doubles in a crash loop", i+1, delay, want)
		}
	}

	etcd = waitEtcd(ctx, t, addr, fmt.Sprintf("etcd to run healthy for %v", stable), func(st ComponentState, p Probe) error {
		if ran := time.Since(st.StartedAt); ran <= stable || !p.OK || !p.Time.After(st.StartedAt) {
			return fmt.Errorf("etcd ran %v, probe %+v", ran, p)
		}
		return nil
	})
	// Without the reset this restart would wait 8 s.
	_, delay := crash(ctx, t, addr, etcd)
	t.Logf("crash after a stable run: restarted after %v", delay.Round(time.Millisecond))
	if delay < minBackoff || delay >= 2*minBackoff {
		t.Errorf("etcd restarted %v after it died following a %v healthy run, want between %v and %v: the backoff resets", delay, stable, minBackoff, 2*minBackoff)
	}
}

// TestRestartSkipsTheBackoff restarts a running process through the
// supervisor: it is stopped and started again at once, not after the crash
// backoff, and the restart is counted with its reason.
func TestRestartSkipsTheBackoff(t *testing.T) {
	s := newSupervisor(t.TempDir(), slog.New(slog.NewTextHandler(t.Output(), nil)), 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		s.Wait()
	}()
	if s.Restart(bootstrap.Etcd, "not supervised yet") {
		t.Error("Restart of a component that is not supervised reported true")
	}
	s.Start(ctx, Process{Name: bootstrap.Etcd, Path: "/bin/sleep", Args: []string{"600"}})
	running := func(what string, cond func(ComponentState) bool) ComponentState {
		t.Helper()
		var st ComponentState
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		if err := testkit.Eventually(wctx, 10*time.Millisecond, what, func(context.Context) error {
			st = s.Snapshot()[bootstrap.Etcd]
			if !st.Running || !cond(st) {
				return fmt.Errorf("state %+v", st)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	first := running("the process to run", func(ComponentState) bool { return true })
	asked := time.Now()
	if !s.Restart(bootstrap.Etcd, "testing") {
		t.Fatal("Restart of a running component reported false")
	}
	second := running("a new process after the restart", func(st ComponentState) bool { return st.PID != first.PID })
	if took := second.StartedAt.Sub(asked); took >= minBackoff {
		t.Errorf("the restarted process started %v after the request, want less than the %v backoff", took, minBackoff)
	}
	if second.Restarts != 1 || second.LastError != "restarted by qcp-agent: testing" {
		t.Errorf("after the restart: restarts %d, last error %q; want 1 and the reason", second.Restarts, second.LastError)
	}
	if err := syscall.Kill(first.PID, 0); err == nil {
		t.Errorf("the first process (pid %d) still runs", first.PID)
	}
}

// TestProbesFastUntilFirstHealthy: the prober checks every 250 ms until
// the machine is first healthy, records that moment, and then checks every
// 2 s, keeping the first moment through later changes.
func TestProbesFastUntilFirstHealthy(t *testing.T) {
	a := &machineCtx{
		machine: Machine{Name: "m1", Address: "127.0.0.1"},
		doc:     &bootstrap.Document{Components: []bootstrap.Component{bootstrap.Etcd}},
		sup:     newSupervisor("", slog.Default(), 0),
	}
	a.prober = &prober{a: a, rounds: make(chan struct{}, 1), probes: map[bootstrap.Component]Probe{}}
	a.sup.update(bootstrap.Etcd, func(st *ComponentState) { st.Running = true })
	a.prober.set(bootstrap.Etcd, Probe{OK: false, Time: time.Now()})
	if every := a.prober.noteHealth(); every != startupProbeEvery || !a.health().FirstHealthy.IsZero() {
		t.Fatalf("starting: next round in %v, first healthy %v; want %v and none", every, a.health().FirstHealthy, startupProbeEvery)
	}
	before := time.Now()
	a.prober.set(bootstrap.Etcd, Probe{OK: true, Time: time.Now()})
	every := a.prober.noteHealth()
	first := a.health().FirstHealthy
	if every != probeEvery || first.Before(before) || first.After(time.Now()) {
		t.Fatalf("healthy: next round in %v, first healthy %v (round ended after %v); want %v and that round's time", every, first, before, probeEvery)
	}
	a.prober.set(bootstrap.Etcd, Probe{OK: false, Time: time.Now()})
	a.prober.noteHealth()
	a.prober.set(bootstrap.Etcd, Probe{OK: true, Time: time.Now()})
	if every := a.prober.noteHealth(); every != probeEvery || !a.health().FirstHealthy.Equal(first) {
		t.Errorf("healthy again: next round in %v, first healthy %v; want %v and still %v", every, a.health().FirstHealthy, probeEvery, first)
	}
}

// TestDynamicArgsAtEachStart: a process's dynamic arguments are computed
// again when it is restarted, and go where DynamicAt says.
func TestDynamicArgsAtEachStart(t *testing.T) {
	s := newSupervisor(t.TempDir(), slog.New(slog.NewTextHandler(t.Output(), nil)), 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		s.Wait()
	}()
	var mu sync.Mutex
	seconds := "600"
	s.Start(ctx, Process{Name: bootstrap.Etcd, Path: "/bin/sleep", Args: []string{"1"}, DynamicAt: 0,
		DynamicArgs: func() []string {
			mu.Lock()
			defer mu.Unlock()
			return []string{seconds}
		}})
	started := func(what string, pid int) ComponentState { t.Helper(); return waitStarted(ctx, t, s, what, pid) }
	read := func(pid int) string {
		t.Helper()
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Split(strings.TrimRight(string(data), "\x00"), "\x00"), " ")
	}
	first := started("the process to run", 0)
	if got, want := read(first.PID), "/bin/sleep 600 1"; got != want {
		t.Errorf("first command line %q, want %q", got, want)
	}
	mu.Lock()
	seconds = "601"
	mu.Unlock()
	if !s.Restart(bootstrap.Etcd, "testing") {
		t.Fatal("Restart of a running component reported false")
	}
	second := started("a new process after the restart", first.PID)
	if got, want := read(second.PID), "/bin/sleep 601 1"; got != want {
		t.Errorf("command line after the restart %q, want %q", got, want)
	}
}

// TestRestartWithPreparesWhileStopped: RestartWith runs its prepare once
// the process has stopped, while the state says so and names the reason,
// reports prepare's error, and starts the process again whether prepare
// failed or not.
func TestRestartWithPreparesWhileStopped(t *testing.T) {
	s := newSupervisor(t.TempDir(), slog.New(slog.NewTextHandler(t.Output(), nil)), 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() {
		cancel()
		s.Wait()
	}()
	if _, ok := s.RestartWith(bootstrap.Etcd, "not supervised yet", func(context.Context) error { return nil }); ok {
		t.Error("RestartWith of a component that is not supervised reported true")
	}
	s.Start(ctx, Process{Name: bootstrap.Etcd, Path: "/bin/sleep", Args: []string{"600"}})
	started := func(what string, pid int) ComponentState { t.Helper(); return waitStarted(ctx, t, s, what, pid) }
	prev := started("the process to run", 0)
	for i, fail := range []error{nil, errors.New("prepare failed")} {
		var during ComponentState
		var alive error
		done, ok := s.RestartWith(bootstrap.Etcd, "testing", func(context.Context) error {
			during, alive = s.Snapshot()[bootstrap.Etcd], syscall.Kill(prev.PID, 0)
			return fail
		})
		if !ok {
			t.Fatalf("restart %d: RestartWith of a running component reported false", i+1)
		}
		select {
		case err := <-done:
			if err != fail {
				t.Errorf("restart %d: reported %v, want prepare's %v", i+1, err, fail)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("restart %d: no outcome within 30 s", i+1)
		}
		if alive == nil {
			t.Errorf("restart %d: the process (pid %d) still ran during prepare", i+1, prev.PID)
		}
		if during.Running || during.Waiting != "qcp-agent, testing" {
			t.Errorf("restart %d: state during prepare %+v, want not running and waiting for the restart's reason", i+1, during)
		}
		next := started("a new process after the restart", prev.PID)
		if next.Restarts != i+1 || next.Waiting != "" {
			t.Errorf("restart %d: state after %+v, want %d restarts and nothing waited for", i+1, next, i+1)
		}
		prev = next
	}
}

// waitStarted waits until s runs etcd in a process other than pid (0: any),
// and returns its state.
func waitStarted(ctx context.Context, t *testing.T, s *supervisor, what string, pid int) ComponentState {
	t.Helper()
	var st ComponentState
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := testkit.Eventually(wctx, 10*time.Millisecond, what, func(context.Context) error {
		st = s.Snapshot()[bootstrap.Etcd]
		if !st.Running || st.PID == pid {
			return fmt.Errorf("state %+v", st)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return st
}
