package machinehost

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/qcp-dev/qcp/internal/hostcgroup"
)

// Stop stops the machine: SIGTERM to its process group, then SIGKILL if it
// has not exited in time; it verifies no process of the group remains and
// removes the machine directory, and its namespaces with a Network.
func (h *Host) Stop(namespace, name string) error {
	return h.stop(h.Dir(namespace, name), machineKey(namespace, name), "run", "machine "+namespace+"/"+name)
}

// stop stops the agent `sub` of dir, machine or load balancer key, removes
// dir, and then key's namespace.
func (h *Host) stop(dir, key, sub, obj string) error {
	pid, err := readPID(dir)
	if err != nil {
		return fmt.Errorf("stopping %s: %w", obj, err)
	}
	// A live leader that is not our agent means the PID was reused by an
	// unrelated session after the machine died: leave that one alone.
	if p, err := readProc(pid); pid > 0 && err == nil && p.State != "Z" && !isAgent(pid, sub, dir) {
		pid = 0
	}
	g, grouped, err := hostcgroup.Load(filepath.Join(dir, cgroupFile))
	if err != nil {
		return fmt.Errorf("stopping %s: %w", obj, err)
	}
	if grouped {
		// A frozen machine must run to handle SIGTERM, or even SIGKILL.
		if err := g.Thaw(); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stopping %s: %w", obj, err)
		}
	}
	if pid > 0 {
		if err := stopGroup(pid); err != nil {
			return fmt.Errorf("stopping %s: %w", obj, err)
		}
	}
	if grouped {
		if err := g.Remove(); err != nil {
			return fmt.Errorf("stopping %s: %w", obj, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing the directory of %s: %w", obj, err)
	}
	return h.unplace(key)
}

// stopGroup terminates process group pgid gracefully, then forcibly.
func stopGroup(pgid int) error {
	if alive(pgid) {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		// A frozen machine must run to handle SIGTERM.
		_ = syscall.Kill(-pgid, syscall.SIGCONT)
		if waitEmpty(pgid, stopTimeout) {
			return nil
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	if !waitEmpty(pgid, killTimeout) {
		procs, _ := GroupProcesses(pgid)
		return fmt.Errorf("process group %d still has %d processes after SIGKILL: %v", pgid, len(procs), procs)
	}
	return nil
}

func alive(pgid int) bool {
	procs, err := GroupProcesses(pgid)
	return err == nil && len(procs) > 0
}

func waitEmpty(pgid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !alive(pgid) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return !alive(pgid)
}

// Kill sends SIGKILL to the machine's process group, as a power cut would,
// and thaws a frozen machine's cgroups, where the processes would wait for
// a thaw to die. The directory stays, so the machine can be inspected or
// started again.
func (h *Host) Kill(namespace, name string) error {
	if err := h.signal(namespace, name, syscall.SIGKILL); err != nil {
		return err
	}
	if g, ok, err := h.MachineCgroups(namespace, name); err != nil || !ok {
		return err
	} else if err := g.Thaw(); err != nil {
		return fmt.Errorf("thawing machine %s/%s to let it die: %w", namespace, name, err)
	}
	return nil
}

// Freeze stops every process of the machine, as a hung VM: all at once
// through its freezer cgroup if it has cgroups, else by SIGSTOP to its
// process group.
func (h *Host) Freeze(namespace, name string) error {
	st, err := h.Status(namespace, name)
	if err != nil {
		return err
	}
	if !st.Running {
		return fmt.Errorf("machine %s/%s is not running: start it before freezing it", namespace, name)
	}
	g, ok, err := h.MachineCgroups(namespace, name)
	if err != nil {
		return err
	}
	if !ok {
		return h.signal(namespace, name, syscall.SIGSTOP)
	}
	if err := g.Freeze(); err != nil {
		return fmt.Errorf("freezing machine %s/%s: %w", namespace, name, err)
	}
	return nil
}

// Thaw resumes a frozen machine: its freezer cgroup, if it has cgroups,
// and SIGCONT to its process group.
func (h *Host) Thaw(namespace, name string) error {
	g, ok, err := h.MachineCgroups(namespace, name)
	if err != nil {
		return err
	}
	if ok {
		if err := g.Thaw(); err != nil {
			return fmt.Errorf("thawing machine %s/%s: %w", namespace, name, err)
		}
	}
	return h.signal(namespace, name, syscall.SIGCONT)
}

// MachineCgroups are machine namespace/name's cgroups; ok is false for a
// machine started without (by a Host without Cgroups).
func (h *Host) MachineCgroups(namespace, name string) (g hostcgroup.Group, ok bool, err error) {
	return hostcgroup.Load(filepath.Join(h.Dir(namespace, name), cgroupFile))
}

// AgentProcess names the machine's agent to FreezeProcess and
// ThawProcess; any other name is a component the agent runs.
const AgentProcess = "qcp-agent"

// FreezeProcess stops one process of the machine (SIGSTOP): AgentProcess,
// or a component by its binary's name ("etcd", "kube-apiserver", ...). The
// rest of the machine runs on, as when one process hangs on a live host.
func (h *Host) FreezeProcess(namespace, name, process string) error {
	return h.signalProcess(namespace, name, process, syscall.SIGSTOP)
}

// ThawProcess resumes a process FreezeProcess stopped (SIGCONT).
func (h *Host) ThawProcess(namespace, name, process string) error {
	return h.signalProcess(namespace, name, process, syscall.SIGCONT)
}

func (h *Host) signalProcess(namespace, name, process string, sig syscall.Signal) error {
	st, err := h.Status(namespace, name)
	if err != nil {
		return err
	}
	if !st.Running {
		return fmt.Errorf("machine %s/%s is not running: start it before sending %v to its %s", namespace, name, sig, process)
	}
	pid := st.PID
	if process != AgentProcess {
		procs, err := GroupProcesses(st.PID)
		if err != nil {
			return err
		}
		pid = 0
		var running []string
		for _, p := range procs {
			name := processName(p.Cmdline)
			running = append(running, name)
			if name == process && p.PID != st.PID {
				pid = p.PID
			}
		}
		if pid == 0 {
			return fmt.Errorf("machine %s/%s runs no %s process (it runs %s)", namespace, name, process, strings.Join(running, ", "))
		}
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("sending %v to the %s of machine %s/%s: %w", sig, process, namespace, name, err)
	}
	return nil
}

// processName is the name a machine's process goes by: its binary's name
// without the pinned version suffix (etcd-v3.6.16 runs etcd), or, for the
// multi-call kube binary, the component it was asked to run.
func processName(cmdline string) string {
	f := strings.Fields(cmdline)
	if len(f) == 0 {
		return ""
	}
	name := filepath.Base(f[0])
	if i := strings.Index(name, "-v"); i > 0 {
		name = name[:i]
	}
	if name == "kube" && len(f) > 1 {
		return f[1]
	}
	return name
}

func (h *Host) signal(namespace, name string, sig syscall.Signal) error {
	st, err := h.Status(namespace, name)
	if err != nil {
		return err
	}
	if !st.Running {
		return fmt.Errorf("machine %s/%s is not running: start it before sending %v", namespace, name, sig)
	}
	if err := syscall.Kill(-st.PID, sig); err != nil {
		return fmt.Errorf("sending %v to machine %s/%s: %w", sig, namespace, name, err)
	}
	return nil
}

// Processes lists the live processes of the machine's process group.
func (h *Host) Processes(namespace, name string) ([]Proc, error) {
	pid, err := readPID(h.Dir(namespace, name))
	if err != nil || pid == 0 {
		return nil, err
	}
	return GroupProcesses(pid)
}

// RSS returns the resident memory, in bytes, of every process of the
// machine (the agent and all its components).
func (h *Host) RSS(namespace, name string) (int64, error) {
	procs, err := h.Processes(namespace, name)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, p := range procs {
		kb, err := rssKB(p.PID)
		if err != nil {
			continue // exited meanwhile
		}
		total += kb * 1024
	}
	return total, nil
}
