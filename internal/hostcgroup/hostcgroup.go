// Package hostcgroup gives a process machine cgroups of its own in cgroup
// v1's freezer and memory hierarchies, as a VM has a size and can be
// paused whole: a freeze stops every process of the machine at once, where
// SIGSTOP to its process group reaches one process after another (and
// misses a process that left the group), and a memory limit is the
// machine's size.
//
// A machine's cgroups are named qcp/<id> under the cgroups of the process
// that creates them in each hierarchy, so that a limit on that process (a
// sandbox's memory cgroup, say) still holds its machines.
package hostcgroup

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Controllers are the cgroup v1 hierarchies a machine gets a cgroup in.
// Not cpu: a machine's cgroup there weighs the whole machine as one task
// against every other process of the host, where each of its processes
// weighed as one before, which leaves the machines less than half the CPU
// they had beside the tests' own processes; the one full run with it lost
// two scenarios that a starved host fails (a CA rotation's machine past
// its health check, a thawed member's revision not read within a minute).
var Controllers = []string{"freezer", "memory"}

// mountRoot is where the hierarchies are mounted, one directory each.
const mountRoot = "/sys/fs/cgroup"

// parent is the directory under the creating process's own cgroup that
// holds every machine's.
const parent = "qcp"

// Group is one machine's cgroups: a directory per controller.
type Group struct {
	// Dirs maps each of Controllers to the machine's cgroup directory.
	Dirs map[string]string `json:"dirs"`
}

// Available says why machines cannot have cgroups here, or nil: each of
// Controllers must be a cgroup v1 hierarchy mounted at /sys/fs/cgroup/<name>
// whose cgroup of this process can hold new ones (root).
func Available() error {
	own, err := ownCgroups()
	if err != nil {
		return err
	}
	for _, c := range Controllers {
		path, ok := own[c]
		if !ok {
			return fmt.Errorf("cgroup v1's %s controller is not mounted at %s/%s", c, mountRoot, c)
		}
		if _, err := os.Stat(filepath.Join(mountRoot, c, path, "cgroup.procs")); err != nil {
			return fmt.Errorf("cgroup v1's %s controller is not mounted at %s/%s: %w", c, mountRoot, c, err)
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("creating cgroups needs root")
	}
	return nil
}

// ownCgroups maps each v1 controller of this process to its cgroup path,
// from /proc/self/cgroup.
func ownCgroups() (map[string]string, error) {
	return cgroupsOf("self")
}

func cgroupsOf(pid string) (map[string]string, error) {
	f, err := os.Open(filepath.Join("/proc", pid, "cgroup"))
	if err != nil {
		return nil, fmt.Errorf("reading the cgroups of process %s: %w", pid, err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c != "" {
				out[c] = parts[2]
			}
		}
	}
	return out, sc.Err()
}

// Create makes the cgroups of machine id (a name of its own, such as a hash
// of the machine's key) and, with memoryLimit above 0, limits its memory
// to that many bytes. A group left from an earlier start is reused.
func Create(id string, memoryLimit int64) (Group, error) {
	if id == "" || strings.ContainsAny(id, "/'\\ \n") || strings.HasPrefix(id, ".") {
		return Group{}, fmt.Errorf("cgroup name %q: want a plain name", id)
	}
	own, err := ownCgroups()
	if err != nil {
		return Group{}, err
	}
	g := Group{Dirs: map[string]string{}}
	for _, c := range Controllers {
		dir := filepath.Join(mountRoot, c, own[c], parent, id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return Group{}, fmt.Errorf("creating the machine's %s cgroup: %w", c, err)
		}
		g.Dirs[c] = dir
	}
	limit := "-1"
	if memoryLimit > 0 {
		limit = strconv.FormatInt(memoryLimit, 10)
	}
	if err := g.write("memory", "memory.limit_in_bytes", limit); err != nil {
		return Group{}, fmt.Errorf("limiting the machine's memory to %s bytes: %w", limit, err)
	}
	// A machine thawed by nothing would stay frozen: start it thawed.
	if err := g.write("freezer", "freezer.state", "THAWED"); err != nil {
		return Group{}, err
	}
	return g, nil
}

// JoinScript is a /bin/sh script that moves the shell into g and then runs
// its arguments in its place ("$@"), so that the command and everything it
// starts are in g from their first instruction.
func (g Group) JoinScript() string {
	var b strings.Builder
	for _, c := range Controllers {
		fmt.Fprintf(&b, "echo $$ > '%s' && ", filepath.Join(g.Dirs[c], "cgroup.procs"))
	}
	b.WriteString(`exec "$@"`)
	return b.String()
}

func (g Group) write(controller, file, value string) error {
	dir, ok := g.Dirs[controller]
	if !ok {
		return fmt.Errorf("the machine has no %s cgroup", controller)
	}
	return os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644)
}

func (g Group) read(controller, file string) (string, error) {
	dir, ok := g.Dirs[controller]
	if !ok {
		return "", fmt.Errorf("the machine has no %s cgroup", controller)
	}
	data, err := os.ReadFile(filepath.Join(dir, file))
	return strings.TrimSpace(string(data)), err
}

// freezeTimeout bounds how long a freeze or thaw may take: the kernel
// reports FREEZING until every task has stopped.
const freezeTimeout = 10 * time.Second

// Freeze stops every process of the group at once, as a hung VM, and
// returns once all have stopped.
func (g Group) Freeze() error { return g.setFreezer("FROZEN") }

// Thaw resumes a frozen group.
func (g Group) Thaw() error { return g.setFreezer("THAWED") }

// Frozen reports whether the group is frozen.
func (g Group) Frozen() (bool, error) {
	s, err := g.read("freezer", "freezer.state")
	return s == "FROZEN", err
}

func (g Group) setFreezer(state string) error {
	if err := g.write("freezer", "freezer.state", state); err != nil {
		return fmt.Errorf("setting the machine's freezer to %s: %w", state, err)
	}
	deadline := time.Now().Add(freezeTimeout)
	for {
		s, err := g.read("freezer", "freezer.state")
		if err != nil {
			return err
		}
		if s == state {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the machine's freezer is %s %s after it was set to %s", s, freezeTimeout, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// MemoryLimit is the group's memory limit in bytes; a value near 2^63 means
// none.
func (g Group) MemoryLimit() (int64, error) {
	s, err := g.read("memory", "memory.limit_in_bytes")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 10, 64)
}

// Procs lists the processes in the group's freezer cgroup.
func (g Group) Procs() ([]int, error) {
	s, err := g.read("freezer", "cgroup.procs")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(s) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("cgroup.procs of %s: %w", g.Dirs["freezer"], err)
		}
		out = append(out, pid)
	}
	return out, nil
}

// Holds reports whether process pid is in every cgroup of g.
func (g Group) Holds(pid int) (bool, error) {
	cg, err := cgroupsOf(strconv.Itoa(pid))
	if err != nil {
		return false, err
	}
	for _, c := range Controllers {
		if filepath.Join(mountRoot, c, cg[c]) != g.Dirs[c] {
			return false, nil
		}
	}
	return true, nil
}

// removeTimeout bounds how long Remove waits for the group's last
// processes to be reaped.
const removeTimeout = 10 * time.Second

// Remove deletes the group's cgroups once no process is left in them
// (thawed, so that a process killed while frozen can exit). A group
// already gone is no error.
func (g Group) Remove() error {
	if _, err := os.Stat(g.Dirs["freezer"]); err == nil {
		_ = g.Thaw()
	}
	var errs []error
	for _, c := range Controllers {
		dir := g.Dirs[c]
		deadline := time.Now().Add(removeTimeout)
		for {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("removing the machine's %s cgroup %s: %w", c, dir, err))
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// Save writes g to file, 0600; Load reads it back: a machine's directory
// keeps its group, so that a Host that did not create it (after a manager
// restart, or a tool's) finds it.
func (g Group) Save(file string) error {
	data, err := json.Marshal(g)
	if err != nil {
		return err
	}
	return os.WriteFile(file, data, 0o600)
}

// Load reads a group Save wrote; ok is false if file does not exist.
func Load(file string) (g Group, ok bool, err error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return Group{}, false, nil
	}
	if err != nil {
		return Group{}, false, err
	}
	if err := json.Unmarshal(data, &g); err != nil {
		return Group{}, false, fmt.Errorf("reading %s: %w", file, err)
	}
	for _, c := range Controllers {
		if d := g.Dirs[c]; !strings.HasPrefix(d, mountRoot+"/"+c+"/") || !slices.Contains(strings.Split(d, "/"), parent) {
			return Group{}, false, fmt.Errorf("reading %s: %q is not a machine's %s cgroup", file, d, c)
		}
	}
	return g, true, nil
}
