package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/testkit"
)

// idleWindow is how long the idle cost is sampled over; idleSettle how
// long the control planes stay Available before it starts.
const (
	idleWindow = 60 * time.Second
	idleSettle = 30 * time.Second
)

// BenchmarkIdleCost measures qcp-manager's cost while nothing changes: its
// CPU (user + system time from /proc, over idleWindow, in mCPU) and its
// resident memory, with 1 and then with 10 single-machine control planes
// Available on the shared management cluster.
func BenchmarkIdleCost(b *testing.B) {
	if shared == nil {
		b.Skip("needs the shared management cluster (not with -short)")
	}
	for i := range b.N {
		var scenarios []*scenario
		for _, n := range []int{1, 10} {
			for len(scenarios) < n {
				scenarios = append(scenarios, newScenario(b, shared, fmt.Sprintf("idle-%d-%d", i, len(scenarios)), 1))
			}
			for _, s := range scenarios {
				s.waitAvailable(15*time.Minute, 1)
			}
			mcpu, rss := idleCost(b, shared.manager.PID())
			b.Logf("%d control planes: %.1f mCPU, %.0f MB RSS over %s", n, mcpu, rss, idleWindow)
			b.ReportMetric(mcpu, fmt.Sprintf("idle-mcpu-%dcp", n))
			b.ReportMetric(rss, fmt.Sprintf("rss-mb-%dcp", n))
		}
		for _, s := range scenarios {
			s.finish()
		}
		deleteClusters(scenarios)
	}
}

// idleCost lets the manager settle, then returns its CPU use over
// idleWindow in mCPU and its resident memory at the end in MB.
func idleCost(b *testing.B, pid int) (mcpu, rssMB float64) {
	b.Helper()
	time.Sleep(idleSettle) // a measurement window, not a wait for a condition
	before, err := cpuTicks(pid)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	time.Sleep(idleWindow) // likewise
	after, err := cpuTicks(pid)
	if err != nil {
		b.Fatal(err)
	}
	const hz = 100 // USER_HZ on Linux
	used := float64(after-before) / hz
	mcpu = used / time.Since(start).Seconds() * 1000
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatal(err)
			}
			rssMB = kb / 1024
		}
	}
	if rssMB == 0 {
		b.Fatalf("no VmRSS in /proc/%d/status", pid)
	}
	return mcpu, rssMB
}

// cpuTicks is process pid's user + system time, in clock ticks.
func cpuTicks(pid int) (int64, error) {
	fields, err := testkit.ProcStat(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// utime and stime are fields 14 and 15.
	var sum int64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		sum += v
	}
	return sum, nil
}

// deleteClusters deletes the scenarios' Clusters together, then waits
// until each is gone.
func deleteClusters(scenarios []*scenario) {
	for _, s := range scenarios {
		s.release()
	}
	for _, s := range scenarios {
		s.waitClusterGone()
	}
}
