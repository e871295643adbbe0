package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// TestBinaryBuilding: a pinned binary is being built while its marker says
// so and the build's process runs, and not once the marker is gone, says
// the build failed, or names a process that is gone.
func TestBinaryBuilding(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(binaries.DirEnv, dir)
	marker := filepath.Join(dir, ".kube-"+binaries.PreviousKubeVersion+".building")
	for _, c := range []struct {
		marker string // "" for none
		want   bool
	}{
		{"", false},
		{fmt.Sprintf("building %d\n", os.Getpid()), true},
		{"failed: see bin/.kube-v1.35.4.log\n", false},
		{"building 999999999\n", false}, // an interrupted run's
	} {
		os.Remove(marker)
		if c.marker != "" {
			if err := os.WriteFile(marker, []byte(c.marker), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got := BinaryBuilding("kube-previous"); got != c.want {
			t.Errorf("marker %q: BinaryBuilding(kube-previous) = %v, want %v", c.marker, got, c.want)
		}
		if BinaryBuilding("kube") {
			t.Errorf("marker %q: kube (another version) reads as building", c.marker)
		}
	}
}

// TestBuildTicks: the CPU of a build beside the tests is that of its
// processes, with the children they reaped, and none of another process's;
// 0 without a build.
func TestBuildTicks(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(binaries.DirEnv, dir)
	if n := BuildTicks(); n != 0 {
		t.Fatalf("no build: %d ticks", n)
	}
	// A build whose first process waits on a child that spins, then sleeps.
	child := filepath.Join(dir, "child")
	build := exec.Command("sh", "-c", `sh -c 'while :; do :; done' & echo $! > "$0"; wait; sleep 600`, child)
	build.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := build.Start(); err != nil {
		t.Fatal(err)
	}
	defer build.Wait()
	defer syscall.Kill(-build.Process.Pid, syscall.SIGKILL)
	marker := filepath.Join(dir, ".kube-"+binaries.PreviousKubeVersion+".building")
	if err := os.WriteFile(marker, []byte(fmt.Sprintf("building %d\n", build.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for BuildTicks() < 50 {
		if time.Now().After(deadline) {
			t.Fatalf("a build spinning for 30 s: %d ticks, want 50 or more", BuildTicks())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The spinning child ends, and its first process reaps it.
	b, err := os.ReadFile(child)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatal(err)
	}
	spun := BuildTicks()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the spinning child was not reaped in 10 s")
		}
	}
	reaped := BuildTicks()
	if reaped < spun {
		t.Errorf("the build's ticks fell from %d to %d once its child was reaped", spun, reaped)
	}
	// This process spins, and is no part of the build, which sleeps.
	mine := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for before := mine(); mine()-before < time.Second; {
	}
	if grew := BuildTicks() - reaped; grew > 10 {
		t.Errorf("while this process spun for 1 s and the build slept, the build's ticks grew by %d", grew)
	}
	os.Remove(marker) // the build ended
	if n := BuildTicks(); n != 0 {
		t.Errorf("after the build: %d ticks", n)
	}
}
