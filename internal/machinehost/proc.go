package machinehost

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/qcp-dev/qcp/internal/cloudinit"
)

// Proc is one process as /proc describes it.
type Proc struct {
	PID, PPID, PGID, SID int
	State                string // R, S, T (stopped), Z (zombie), ...
	Comm                 string
	Cmdline              string // arguments joined by spaces
}

// readProc parses /proc/<pid>/stat. The command name may hold spaces and
// parentheses, so fields are counted from the last ')'.
func readProc(pid int) (Proc, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Proc{}, err
	}
	open, end := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if open < 0 || end < open {
		return Proc{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(data[end+1:]))
	if len(f) < 4 {
		return Proc{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	p := Proc{PID: pid, Comm: string(data[open+1 : end]), State: f[0]}
	p.PPID, _ = strconv.Atoi(f[1])
	p.PGID, _ = strconv.Atoi(f[2])
	p.SID, _ = strconv.Atoi(f[3])
	return p, nil
}

// GroupProcesses lists the live (non-zombie) processes in process group
// pgid whose session is also pgid: a machine's agent is a session leader,
// so this excludes an unrelated process that merely reuses the number. A
// pgid below 1 is an error: group 0 holds the kernel's threads, and a PID
// read as 0 names no machine.
func GroupProcesses(pgid int) ([]Proc, error) {
	if pgid < 1 {
		return nil, fmt.Errorf("no process group %d: a machine's PID is positive", pgid)
	}
	return liveProcesses(func(p Proc) bool { return p.PGID == pgid && p.SID == pgid })
}

// ProcessesMatching lists the live processes whose command line (arguments
// joined by spaces) contains s, for stray-process checks.
func ProcessesMatching(s string) ([]Proc, error) {
	return liveProcesses(func(p Proc) bool { return strings.Contains(p.Cmdline, s) })
}

// liveProcesses lists the non-zombie processes keep accepts.
func liveProcesses(keep func(Proc) bool) ([]Proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var out []Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, err := readProc(pid)
		if err != nil || p.State == "Z" {
			continue // exited while we looked
		}
		p.Cmdline = strings.Join(cmdline(pid), " ")
		if keep(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// cmdline returns the argv of pid.
func cmdline(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(data) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
}

// isAgent reports whether pid is a live `qcp-agent <sub> --dir <d>`, where
// d is dir or, for a machine booted from cloud-config, the agent's data
// directory in dir. Matching the command line, not just the PID, survives
// PID reuse after a reboot or a long manager outage.
func isAgent(pid int, sub, dir string) bool {
	if p, err := readProc(pid); err != nil || p.State == "Z" {
		return false
	}
	args := cmdline(pid)
	if len(args) < 3 || args[1] != sub {
		return false
	}
	for i := 2; i < len(args); i++ {
		d, ok := strings.CutPrefix(args[i], "--dir=")
		if !ok && args[i] == "--dir" && i+1 < len(args) {
			d, ok = args[i+1], true
		}
		if ok && (filepath.Clean(d) == filepath.Clean(dir) || filepath.Clean(d) == filepath.Join(dir, cloudinit.DataDir)) {
			return true
		}
	}
	return false
}

// rssKB returns VmRSS of pid in kB (0 for kernel threads and zombies).
func rssKB(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				return 0, nil
			}
			return strconv.ParseInt(fields[0], 10, 64)
		}
	}
	return 0, sc.Err()
}

// Descendants lists the live processes below pid: its children, theirs,
// and so on, including those that left its process group.
func Descendants(pid int) ([]Proc, error) {
	live, err := liveProcesses(func(Proc) bool { return true })
	if err != nil {
		return nil, err
	}
	children := map[int][]Proc{}
	for _, p := range live {
		children[p.PPID] = append(children[p.PPID], p)
	}
	var out []Proc
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.PID)
		}
	}
	return out, nil
}

// StillRunning returns those of procs that are still alive. A PID that now
// names a process with another command name was reused and does not count.
func StillRunning(procs []Proc) ([]Proc, error) {
	var out []Proc
	for _, p := range procs {
		now, err := readProc(p.PID)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading process %d: %w", p.PID, err)
		}
		if now.State != "Z" && now.Comm == p.Comm {
			out = append(out, p)
		}
	}
	return out, nil
}

// runningAgent returns the PID of the qcp-agent that runs the machine in
// dir, or 0.
func runningAgent(dir string) int {
	procs, err := liveProcesses(func(p Proc) bool { return p.Comm == "qcp-agent" })
	if err != nil {
		return 0
	}
	for _, p := range procs {
		if isAgent(p.PID, "run", dir) && p.PGID == p.PID {
			return p.PID
		}
	}
	return 0
}
