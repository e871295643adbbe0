package machinehost

import (
	"bufio"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestProcessName: FreezeProcess finds a component by the name it goes by,
// whatever pinned binary runs it.
func TestProcessName(t *testing.T) {
	for cmdline, want := range map[string]string{
		"/work/bin/etcd-v3.6.16 --name=m1 --data-dir=/x":         "etcd",
		"/work/bin/kube-v1.36.3 kube-apiserver --etcd-servers=x": "kube-apiserver",
		"/tmp/qcp-e2e-bin-1/qcp-agent --machine-dir=/x":          "qcp-agent",
		"/usr/local/bin/etcd":                                    "etcd",
		"":                                                       "",
	} {
		if got := processName(cmdline); got != want {
			t.Errorf("processName(%q) = %q, want %q", cmdline, got, want)
		}
	}
}

// TestGroupProcessesRefusesNoGroup: a PID read as 0 (a status not written
// yet) must not list group 0, the kernel's threads, as a machine's
// processes.
func TestGroupProcessesRefusesNoGroup(t *testing.T) {
	for _, pgid := range []int{0, -1} {
		if procs, err := GroupProcesses(pgid); err == nil {
			t.Errorf("GroupProcesses(%d) = %d processes, want an error", pgid, len(procs))
		}
	}
}

// TestStopGroupCutsPowerAfterTheGrace: a process that ignores SIGTERM (a
// kube-apiserver waiting for an etcd that is gone) is killed once the
// grace is over, and the group is empty when stopGroup returns.
func TestStopGroupCutsPowerAfterTheGrace(t *testing.T) {
	// The shell says "ready" once it ignores SIGTERM (its sleep inherits
	// that); a signal sent before would kill it at once.
	cmd := exec.Command("sh", "-c", `trap "" TERM; echo ready; sleep 60 & wait; sleep 60`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // as a machine's agent
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("the shell said %q (%v), want ready", line, err)
	}
	go func() { _ = cmd.Wait() }()
	start := time.Now()
	if err := stopGroup(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if alive(cmd.Process.Pid) {
		t.Error("the group still has processes after stopGroup")
	}
	// Well under the 10 s kube-apiserver would wait for a gone etcd.
	if took < stopTimeout || took > 5*time.Second {
		t.Errorf("stopGroup took %s; want the %s grace, then SIGKILL, within 5 s", took, stopTimeout)
	}
}
