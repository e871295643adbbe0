package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// ComponentState is what the health endpoint reports about one component.
type ComponentState struct {
	Running   bool      `json:"running"`
	PID       int       `json:"pid,omitempty"`
	Restarts  int       `json:"restarts"`
	LastError string    `json:"lastError,omitempty"`
	StartedAt time.Time `json:"startedAt,omitzero"`
	Waiting   string    `json:"waiting,omitempty"`
}

// supervisor runs components as child processes in the agent's own process
// group (so a signal to the group reaches the whole machine) and restarts
// them with backoff when they exit.
type supervisor struct {
	logDir    string
	log       *slog.Logger
	stableRun time.Duration

	mu     sync.Mutex
	states map[bootstrap.Component]*ComponentState
	// restarts carries a request to a running component's supervisor to
	// stop it and start it again at once.
	restarts map[bootstrap.Component]chan restartRequest
	wg       sync.WaitGroup
}

const (
	minBackoff = time.Second
	// maxBackoff is short because a component often exits while waiting
	// for another (an API server for its etcd member) and should be back
	// soon after that one is up.
	maxBackoff = 10 * time.Second
	// defaultStableRun resets the backoff: a component that ran this long
	// was not crash-looping.
	defaultStableRun = time.Minute
	stopGrace        = 10 * time.Second
)

// newSupervisor returns a supervisor that logs components to logDir and
// resets a component's backoff once it has run for stableRun (zero means
// defaultStableRun).
func newSupervisor(logDir string, log *slog.Logger, stableRun time.Duration) *supervisor {
	if stableRun <= 0 {
		stableRun = defaultStableRun
	}
	return &supervisor{logDir: logDir, log: log, stableRun: stableRun,
		states: map[bootstrap.Component]*ComponentState{}, restarts: map[bootstrap.Component]chan restartRequest{}}
}

// setWaiting records what a component waits for before it can start.
func (s *supervisor) setWaiting(c bootstrap.Component, what string) {
	s.update(c, func(st *ComponentState) { st.Waiting = what })
}

func (s *supervisor) update(c bootstrap.Component, f func(*ComponentState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.states[c]
	if st == nil {
		st = &ComponentState{}
		s.states[c] = st
	}
	f(st)
}

// Snapshot copies the states for reporting.
func (s *supervisor) Snapshot() map[bootstrap.Component]ComponentState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[bootstrap.Component]ComponentState, len(s.states))
	for k, v := range s.states {
		out[k] = *v
	}
	return out
}

// Start supervises p until ctx ends, then stops it.
func (s *supervisor) Start(ctx context.Context, p Process) {
	s.mu.Lock()
	s.restarts[p.Name] = make(chan restartRequest, 1)
	s.mu.Unlock()
	s.update(p.Name, func(st *ComponentState) { st.Waiting = "" })
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.loop(ctx, p)
	}()
}

// Restart stops component c and starts it again at once, without backoff.
// It returns false if c is not supervised or a restart is already pending.
func (s *supervisor) Restart(c bootstrap.Component, why string) bool {
	_, ok := s.RestartWith(c, why, nil)
	return ok
}

// RestartWith is Restart with prepare run while c is stopped, for work on
// files that c holds open. The channel receives prepare's error once it
// returns, and c starts again whatever it returned: prepare must leave
// what c starts from usable when it fails. A component that is not running
// (waiting out its backoff) is stopped as soon as it starts. The channel
// receives nothing if the supervisor stops first: select on its context
// too. prepare runs on c's supervising thread, at c's niceness, as do the
// processes it starts. It returns false if c is not supervised or a
// restart is already pending.
func (s *supervisor) RestartWith(c bootstrap.Component, why string, prepare func(context.Context) error) (<-chan error, bool) {
	s.mu.Lock()
	ch := s.restarts[c]
	s.mu.Unlock()
	if ch == nil {
		return nil, false
	}
	req := restartRequest{why: why, prepare: prepare, done: make(chan error, 1)}
	select {
	case ch <- req:
		return req.done, true
	default:
		return nil, false
	}
}

// restartRequest is a restart asked for, and where its outcome goes.
type restartRequest struct {
	why     string
	prepare func(context.Context) error
	done    chan error
}

// restarted is runOnce's error when a restart request stopped the process.
type restarted struct{ restartRequest }

func (r restarted) Error() string { return "restarted by qcp-agent: " + r.why }

// prepareRestart runs a restart's prepare while p is stopped, shown as
// what p waits for, and reports its outcome.
func (s *supervisor) prepareRestart(ctx context.Context, c bootstrap.Component, r restartRequest) {
	var err error
	if r.prepare != nil {
		s.setWaiting(c, "qcp-agent, "+r.why)
		if err = r.prepare(ctx); err != nil {
			s.log.Error("the work before a restart failed; the component starts as it was", "component", c, "why", r.why, "err", err)
		}
		s.setWaiting(c, "")
	}
	r.done <- err
}

// Wait returns once every supervised process has stopped.
func (s *supervisor) Wait() { s.wg.Wait() }

func (s *supervisor) loop(ctx context.Context, p Process) {
	if p.Nice != 0 {
		// A child inherits the niceness of the thread that starts it, and
		// Linux keeps niceness per thread. This goroutine keeps a thread of
		// its own, niced, for as long as it supervises p; the thread ends
		// with the goroutine, after p has stopped (Pdeathsig is tied to
		// it). The Go runtime starts its new threads from a template
		// thread, never from a locked one, so no other goroutine runs
		// niced.
		runtime.LockOSThread()
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, 0, p.Nice); err != nil {
			s.log.Warn("cannot lower the component's CPU priority; it runs at the agent's", "component", p.Name, "nice", p.Nice, "err", err)
		}
	}
	backoff := minBackoff
	for ctx.Err() == nil {
		started := time.Now()
		err := s.runOnce(ctx, p)
		var r restarted
		isRestart := errors.As(err, &r)
		if ctx.Err() != nil {
			if isRestart {
				r.done <- ctx.Err()
			}
			return
		}
		if time.Since(started) > s.stableRun {
			backoff = minBackoff
		}
		s.update(p.Name, func(st *ComponentState) {
			st.Running, st.PID, st.LastError = false, 0, fmt.Sprint(err)
			st.Restarts++
		})
		if isRestart {
			s.prepareRestart(ctx, p.Name, r.restartRequest)
			continue
		}
		s.log.Warn("component exited; restarting", "component", p.Name, "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

func (s *supervisor) runOnce(ctx context.Context, p Process) error {
	logFile, err := os.OpenFile(filepath.Join(s.logDir, string(p.Name)+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening log of %s: %w", p.Name, err)
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "---- qcp-agent starting %s at %s\n", p.Name, time.Now().UTC().Format(time.RFC3339))
	cmd := exec.Command(p.Path, p.CommandLine()...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// No Setpgid: children stay in the agent's process group. Pdeathsig
	// makes a component die with the agent even when only the agent is
	// killed, so no orphan outlives its machine.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	s.log.Info("component started", "component", p.Name, "pid", cmd.Process.Pid)
	s.update(p.Name, func(st *ComponentState) {
		st.Running, st.PID, st.StartedAt = true, cmd.Process.Pid, time.Now()
	})
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(stopGrace):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	s.mu.Lock()
	restart := s.restarts[p.Name]
	s.mu.Unlock()
	select {
	case err := <-done:
		if err == nil {
			err = errors.New("exited with status 0")
		}
		return err
	case r := <-restart:
		s.log.Warn("restarting component", "component", p.Name, "why", r.why)
		stop()
		return restarted{r}
	case <-ctx.Done():
		stop()
		s.update(p.Name, func(st *ComponentState) { st.Running, st.PID = false, 0 })
		s.log.Info("component stopped", "component", p.Name)
		return ctx.Err()
	}
}
