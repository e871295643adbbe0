package machinehost

import "testing"

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
