package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"github.com/qcp-dev/qcp/internal/hostcpu"
)

// sample is one line of the profile: what the CPUs did since the sample
// before.
type sample struct {
	// T is the sample's time, in Unix milliseconds.
	T int64 `json:"t"`
	// Busy and Idle are CPU-seconds of the whole host (/proc/stat) since
	// the sample before; Busy counts user, nice, system, irq and softirq
	// time, Idle counts idle and iowait.
	Busy float64 `json:"busy"`
	Idle float64 `json:"idle"`
	// CPU is CPU-seconds by group (owner|component|cluster) since the
	// sample before. Busy minus their sum is what no group was found for.
	CPU map[string]float64 `json:"cpu,omitempty"`
	// MemUsed is the host's memory in use at the sample, in GiB: MemTotal
	// less MemAvailable (/proc/meminfo), what more scenarios at once must
	// fit beside. Zero in profiles recorded before it was added.
	MemUsed float64 `json:"memUsedGiB,omitempty"`
}

// proc is what the recorder remembers of one process.
type proc struct {
	ppid  int
	comm  string
	start uint64 // start time in ticks, to tell a reused PID apart
	cpu   uint64 // utime+stime, ticks
	child uint64 // cutime+cstime, ticks
	// credited is what the recorder has accounted for of this process and
	// of the children it reaped, in ticks.
	credited uint64
	group    string
}

const ticks = 100.0 // USER_HZ on Linux

// record runs the command and writes a sample every interval until it exits;
// it exits with the command's status.
func record(out string, interval time.Duration, args []string) int {
	f, err := os.Create(out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	defer w.Flush()
	enc := json.NewEncoder(w)

	if len(args) == 2 && args[0] == "-attach" {
		// Record a run that already started, until its process exits.
		pid, err := strconv.Atoi(args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		r := newRecorder(pid)
		for syscall.Kill(pid, 0) == nil {
			time.Sleep(interval)
			_ = enc.Encode(r.sample())
			_ = w.Flush()
		}
		return 0
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// Signals go to the command; the recorder keeps sampling until it exits.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	r := newRecorder(cmd.Process.Pid)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			_ = enc.Encode(r.sample())
			if ee, ok := err.(*exec.ExitError); ok {
				return ee.ExitCode()
			}
			if err != nil {
				return 2
			}
			return 0
		case <-tick.C:
			_ = enc.Encode(r.sample())
			_ = w.Flush() // a run cut short keeps what it recorded
		}
	}
}

type recorder struct {
	fs         procfs.FS
	procs      map[int]*proc
	root       int
	busy, idle uint64
}

// newRecorder returns a recorder of the processes under root, having taken
// the host's and their CPU so far as its baseline: nothing is attributed for
// what ran before.
func newRecorder(root int) *recorder {
	fs, _ := procfs.NewDefaultFS() // a host without /proc shows no memory
	r := &recorder{fs: fs, procs: map[int]*proc{}, root: root}
	r.busy, r.idle = hostcpu.Ticks()
	r.scan()
	return r
}

// sample reads the host and every process, and returns what changed.
func (r *recorder) sample() sample {
	busy, idle := hostcpu.Ticks()
	s := sample{T: time.Now().UnixMilli(), Busy: float64(busy-r.busy) / ticks, Idle: float64(idle-r.idle) / ticks}
	r.busy, r.idle = busy, idle
	s.CPU = r.scan()
	if mi, err := r.fs.Meminfo(); err == nil && mi.MemTotal != nil && mi.MemAvailable != nil {
		s.MemUsed = float64(*mi.MemTotal-*mi.MemAvailable) / (1 << 20)
	}
	return s
}

// scan reads /proc and returns CPU-seconds by group since the last scan.
// A process that exited between two scans is counted through its parent's
// reaped-children time (less what was seen of it while it ran), so that
// short-lived compilers are not lost.
func (r *recorder) scan() map[string]float64 {
	seen := map[int]*proc{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, err := readStat(pid)
		if err != nil {
			continue
		}
		seen[pid] = p
	}
	out := map[string]float64{}
	// A process that exited is counted through its parent's reaped-children
	// time, which grows by all it and its own reaped children used. As far
	// as the scans saw them, they are accounted for already (credited), so
	// only the rest counts: their last moments, and children never seen. A
	// child whose parent exited too ends up in the reaped time of the first
	// ancestor still running.
	gone := map[int]*proc{}
	for pid, old := range r.procs {
		if p, ok := seen[pid]; !ok || p.start != old.start {
			gone[pid] = old
		}
	}
	credit := map[int]uint64{}
	for _, g := range gone {
		// Up to the first ancestor still running: it reaped them all.
		ppid := g.ppid
		for i := 0; i < 64; i++ {
			parent, ok := gone[ppid]
			if !ok {
				break
			}
			ppid = parent.ppid
		}
		credit[ppid] += g.credited
	}
	for pid, p := range seen {
		old, ok := r.procs[pid]
		if ok && old.start == p.start {
			p.group = old.group
		} else {
			old = nil
		}
		if p.group == "" {
			p.group = r.classify(pid, p, seen)
		}
		if old == nil {
			// New since the last scan: all it and its reaped children used
			// is new, unless this is the first scan, which only notes what
			// ran before.
			if len(r.procs) > 0 {
				out[p.group] += float64(p.cpu+p.child) / ticks
			}
			p.credited = p.cpu + p.child
			continue
		}
		own := max(int64(p.cpu)-int64(old.cpu), 0)
		extra := max(int64(p.child)-int64(old.child)-int64(credit[pid]), 0)
		out[p.group] += float64(own+extra) / ticks
		p.credited = old.credited + uint64(own+extra) + credit[pid]
	}
	r.procs = seen
	for k, v := range out {
		if v == 0 || strings.HasPrefix(k, "-") {
			delete(out, k)
		}
	}
	return out
}

// inTree reports whether pid descends from the recorded command, or is a
// machine it left running (an agent reparented to init).
func (r *recorder) inTree(pid int, seen map[int]*proc) bool {
	for i := 0; i < 64 && pid > 1; i++ {
		if pid == r.root {
			return true
		}
		p := seen[pid]
		if p == nil {
			return false
		}
		pid = p.ppid
	}
	return false
}

// classify names a process's group: owner|component|cluster. Groups
// starting with "-" are not the recorded command's.
func (r *recorder) classify(pid int, p *proc, seen map[int]*proc) string {
	owner, cluster := "", ""
	self := cmdline(pid)
	for cur, i := pid, 0; cur > 1 && i < 64; i++ {
		q := seen[cur]
		if q == nil {
			break
		}
		if cur != pid && q.group != "" {
			// An ancestor already classified: inherit its owner and cluster.
			parts := strings.SplitN(q.group, "|", 3)
			if owner == "" {
				owner = parts[0]
			}
			if cluster == "" && len(parts) == 3 {
				cluster = parts[2]
			}
			break
		}
		args := cmdline(cur)
		if cluster == "" && filepath.Base(first(args)) == "qcp-agent" {
			cluster = machineCluster(args)
		}
		if owner == "" {
			owner = ownerOf(cur, args)
		}
		if cur == r.root && owner == "" {
			owner = "make"
		}
		cur = q.ppid
	}
	if owner == "" {
		owner = "host"
	}
	if !r.inTree(pid, seen) {
		owner = "-" + owner // not the recorded command's
	}
	return owner + "|" + component(p.comm, self) + "|" + cluster
}

// ownerOf names who a process works for, if it says so itself: a test
// binary (by its package directory, the binary's working directory), a
// build step, or a go command.
func ownerOf(pid int, args []string) string {
	switch {
	case strings.HasSuffix(first(args), ".test"):
		if dir, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err == nil {
			return "test " + dir
		}
		return "test " + strings.TrimSuffix(filepath.Base(first(args)), ".test")
	case strings.Contains(strings.Join(args, " "), "build-pinned.sh"):
		for i, a := range args {
			if strings.HasSuffix(a, "build-pinned.sh") && i+2 < len(args) {
				return "build " + args[i+1] + " " + args[i+2]
			}
		}
	case filepath.Base(first(args)) == "go" && len(args) > 1:
		return "go " + args[1]
	}
	return ""
}

// machineCluster is the cluster of a process machine's agent, from its
// --dir: <root>/<namespace>/<machine>/var/lib/qcp for a machine's agent,
// <root>/_lb/<namespace>/<cluster> for a load balancer's. A machine's
// cluster is its name less its last part (a Machine is named <cluster or
// template>-<suffix>).
func machineCluster(args []string) string {
	for i, a := range args {
		dir, ok := strings.CutPrefix(a, "--dir=")
		if a == "--dir" && i+1 < len(args) {
			dir, ok = args[i+1], true
		}
		if !ok {
			continue
		}
		dir = strings.TrimSuffix(filepath.Clean(dir), "/var/lib/qcp")
		if strings.Contains(dir, "/_lb/") {
			return filepath.Base(dir)
		}
		name := filepath.Base(dir)
		if j := strings.LastIndex(name, "-"); j > 0 {
			name = name[:j]
		}
		return name
	}
	return "?"
}

// component is what a process is, by the name of its program.
func component(comm string, args []string) string {
	switch {
	case strings.HasSuffix(first(args), ".test"):
		return "test binary"
	case strings.HasPrefix(filepath.Base(first(args)), "kube-v") && len(args) > 1:
		return args[1] // one binary runs every Kubernetes component
	case strings.HasPrefix(comm, "etcd"):
		return "etcd"
	case strings.HasPrefix(comm, "kube-apiserver"), strings.HasPrefix(comm, "kube-controller"), strings.HasPrefix(comm, "kube-scheduler"):
		return comm
	case strings.HasPrefix(comm, "capi-manager"):
		return "capi-manager"
	case strings.HasPrefix(comm, "cabpk-manager"):
		return "cabpk-manager"
	case comm == "compile", comm == "link", comm == "asm", comm == "cgo", comm == "vet", comm == "go", comm == "cc1", comm == "gcc", comm == "ld", comm == "as", comm == "collect2":
		return "go toolchain"
	}
	return comm
}

func first(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// readStat reads /proc/<pid>/stat.
func readStat(pid int) (*proc, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// comm is in parentheses and may hold spaces; the fields follow the last ')'.
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return nil, fmt.Errorf("malformed stat")
	}
	f := strings.Fields(string(b[j+2:]))
	if len(f) < 20 {
		return nil, fmt.Errorf("short stat")
	}
	n := func(k int) uint64 { v, _ := strconv.ParseUint(f[k], 10, 64); return v }
	// Fields from 3 (state) on: ppid is 4, utime 14, stime 15, cutime 16,
	// cstime 17, starttime 22; f[0] is field 3.
	ppid, _ := strconv.Atoi(f[1])
	return &proc{ppid: ppid, comm: string(b[i+1 : j]), cpu: n(11) + n(12), child: n(13) + n(14), start: n(19)}, nil
}
