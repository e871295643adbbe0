package hostcgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary stand in for a machine's processes: with
// HOSTCGROUP_ALLOCATE set it touches that many MiB of memory, then sleeps.
func TestMain(m *testing.M) {
	if v := os.Getenv("HOSTCGROUP_ALLOCATE"); v != "" {
		var mib int
		fmt.Sscan(v, &mib)
		mem := make([][]byte, 0, mib)
		for range mib {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			mem = append(mem, b)
		}
		fmt.Println("allocated", len(mem), "MiB")
		time.Sleep(time.Minute)
		return
	}
	os.Exit(m.Run())
}

// start runs the test binary in g through its JoinScript, allocating mib
// MiB, as launching a machine's agent does.
func start(t *testing.T, g Group, mib int) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", g.JoinScript(), "sh", self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("HOSTCGROUP_ALLOCATE=%d", mib))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = g.Thaw()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMachineCgroups: a process started through a group's JoinScript is in
// every one of its cgroups from the start; a freeze stops it (it sleeps
// uninterruptibly, D) until the thaw; the memory limit kills a process
// that goes past it; Remove leaves nothing, and Load finds the group that
// Save wrote.
func TestMachineCgroups(t *testing.T) {
	if err := Available(); err != nil {
		if os.Geteuid() == 0 {
			t.Fatalf("running as root, yet machines can have no cgroups here: %v", err)
		}
		t.Skipf("machines can have no cgroups here: %v", err)
	}
	id := fmt.Sprintf("test-%d", os.Getpid())
	g, err := Create(id, 128<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove() })
	if limit, err := g.MemoryLimit(); err != nil || limit != 128<<20 {
		t.Fatalf("memory limit %d (%v), want %d", limit, err, 128<<20)
	}
	file := filepath.Join(t.TempDir(), "cgroups.json")
	if err := g.Save(file); err != nil {
		t.Fatal(err)
	}
	if loaded, ok, err := Load(file); err != nil || !ok || loaded.Dirs["freezer"] != g.Dirs["freezer"] {
		t.Fatalf("Load = %+v, %v, %v; want what Save wrote", loaded, ok, err)
	}
	if _, ok, err := Load(filepath.Join(t.TempDir(), "none.json")); ok || err != nil {
		t.Errorf("Load of no file: %v, %v; want no group and no error", ok, err)
	}
	if err := os.WriteFile(file, []byte(`{"dirs":{"freezer":"/tmp/x","memory":"/tmp/y"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Load(file); err == nil || !strings.Contains(err.Error(), "is not a machine's freezer cgroup") {
		t.Errorf("Load of directories outside the hierarchies: %v; want it refused", err)
	}

	t.Run("a process is in every cgroup from the start, and a freeze stops it until the thaw", func(t *testing.T) {
		cmd := start(t, g, 16)
		pid := cmd.Process.Pid
		waitFor(t, "the process in its cgroups", func() error {
			if held, err := g.Holds(pid); err != nil || !held {
				return fmt.Errorf("in every cgroup: %v (%v)", held, err)
			}
			return nil
		})
		if err := g.Freeze(); err != nil {
			t.Fatal(err)
		}
		if frozen, err := g.Frozen(); err != nil || !frozen {
			t.Fatalf("frozen: %v (%v)", frozen, err)
		}
		if state := procState(t, pid); state != "D" {
			t.Errorf("frozen process state %q, want D", state)
		}
		if procs, err := g.Procs(); err != nil || len(procs) != 1 || procs[0] != pid {
			t.Errorf("the group's processes %v (%v), want [%d]", procs, err, pid)
		}
		if err := g.Thaw(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the thawed process running", func() error {
			if s := procState(t, pid); s != "S" && s != "R" {
				return fmt.Errorf("state %q", s)
			}
			return nil
		})
	})

	t.Run("the memory limit kills a process that goes past it", func(t *testing.T) {
		cmd := start(t, g, 256)
		err := cmd.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("a process allocating 256 MiB in a 128-MiB machine exited with %v; want it killed (SIGKILL)", err)
		}
	})

	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for c, dir := range g.Dirs {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("the %s cgroup remains after Remove: %s", c, dir)
		}
	}
}

// procState is the state letter of pid from /proc/<pid>/stat.
func procState(t *testing.T, pid int) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return f[0]
}
