package machinehost

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// BenchmarkMachineRSS measures the resident memory of one stacked control
// plane machine (qcp-agent, etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler) once its Node is Ready and every component is healthy:
//
//	go test ./internal/machinehost -run '^$' -bench MachineRSS -benchtime 1x
//
// It reports rss-mb (the last sample of a 30-second window) and
// peak-rss-mb, and logs a per-component breakdown.
func BenchmarkMachineRSS(b *testing.B) {
	testkit.RequireBinaries(b, "etcd", "kube")
	h := newHost(b)
	c := newTestCluster(b, h, "ns-measure", "cm")
	spec := c.spec("m1", "fd-a")
	c.start(spec, bootstrap.NewMember(), []string{spec.Address + ":6443"})
	c.waitNodeReady("m1", corev1.ConditionTrue, 3*time.Minute)
	c.waitHealthy(spec, 3*time.Minute)
	b.ResetTimer()
	var last, peak int64
	for range b.N {
		// Sample over a window: the API server's memory grows while its
		// caches fill and controllers start after leader election.
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			rss, err := h.RSS("ns-measure", "m1")
			if err != nil {
				b.Fatal(err)
			}
			last, peak = rss, max(peak, rss)
			time.Sleep(time.Second)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(last)/(1<<20), "rss-mb")
	b.ReportMetric(float64(peak)/(1<<20), "peak-rss-mb")
	b.Log(componentBreakdown(b, h, "ns-measure", "m1"))
}

func componentBreakdown(tb testing.TB, h *Host, ns, name string) string {
	procs, err := h.Processes(ns, name)
	if err != nil {
		tb.Fatal(err)
	}
	var lines []string
	for _, p := range procs {
		kb, _ := rssKB(p.PID)
		label := p.Comm
		if args := cmdline(p.PID); strings.HasPrefix(p.Comm, "kube-") && len(args) > 1 {
			label = args[1]
		}
		lines = append(lines, fmt.Sprintf("%-24s %5d MB", label, kb>>10))
	}
	sort.Strings(lines)
	return "per process:\n" + strings.Join(lines, "\n")
}
