package localenv

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Process is a child process of the local environment, such as the CAPI core
// manager or qcp-manager. It dies with its parent.
type Process struct {
	Name string
	// MetricsAddr is where a qcp-manager serves its metrics.
	MetricsAddr string
	cmd         *exec.Cmd
	done        chan struct{}
	err         error
	// stopped is set when Stop signals the process: its end is then ours.
	stopped atomic.Bool
}

// StartProcess starts path with args, logging to <logDir>/<name>.log.
func StartProcess(name, path string, args, env []string, logDir string) (*Process, error) {
	logFile, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the log of %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), env...)
	// The child must not outlive a test binary that is killed, nor hold the
	// terminal's signals: its own process group, and SIGKILL on our death.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, path, err)
	}
	p := &Process{Name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns how the process ended (nil while it runs, or after a clean
// exit).
func (p *Process) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Killed reports whether the process has ended by a SIGKILL that Stop did
// not send, as a qcp-manager that reaches an armed failpoint does.
func (p *Process) Killed() bool {
	if !p.Exited() || p.stopped.Load() {
		return false
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// Stop asks the process to stop, then kills it after a grace period.
func (p *Process) Stop() error {
	if p.Exited() {
		return nil
	}
	p.stopped.Store(true)
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.Name, p.PID())
	}
}

// WaitHTTP waits until url answers 200, or the process exits, or ctx ends.
func (p *Process) WaitHTTP(ctx context.Context, url string) error {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a local readiness probe of our own child
	}}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if resp, err := c.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before %s answered: %v (see its log)", p.Name, url, p.err)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to answer %s: %w", p.Name, url, ctx.Err())
		case <-tick.C:
		}
	}
}

// FreeAddr returns a loopback address with a port no one listens on.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startOnFreePorts starts a child that listens on n ports found free, and
// waits until it answers readyURL(addrs). Another process (tests run
// packages in parallel) may take a port between the check and the child's
// bind; a child that then exits saying so is started again on new ports.
// On failure it also returns the child it started last, if any, ended.
func (e *Env) startOnFreePorts(ctx context.Context, name string, n int, start func(addrs []string) (*Process, error), readyURL func(addrs []string) string) (*Process, []string, error) {
	for attempt := 1; ; attempt++ {
		addrs, err := freeAddrs(n)
		if err != nil {
			return nil, nil, err
		}
		p, err := start(addrs)
		if err != nil {
			return nil, nil, err
		}
		err = p.WaitHTTP(ctx, readyURL(addrs))
		if err == nil {
			return p, addrs, nil
		}
		if attempt == 3 || !p.Exited() || !e.logSays(name, "address already in use") {
			_ = p.Stop()
			return p, nil, err
		}
	}
}

// logSays reports whether the log of child name contains s.
func (e *Env) logSays(name, s string) bool {
	data, err := os.ReadFile(filepath.Join(e.Dir, name+".log"))
	return err == nil && strings.Contains(string(data), s)
}

// freeAddrs returns n distinct free loopback addresses.
func freeAddrs(n int) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for len(out) < n {
		a, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out, nil
}
