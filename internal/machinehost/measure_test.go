package machinehost

import (
	"fmt"
	"os"
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

// componentName names a machine's process: its command, or for the one kube
// binary that runs every Kubernetes component, the component it runs.
func componentName(p Proc) string {
	if args := cmdline(p.PID); strings.HasPrefix(p.Comm, "kube-") && len(args) > 1 {
		return args[1]
	}
	return p.Comm
}

func componentBreakdown(tb testing.TB, h *Host, ns, name string) string {
	procs, err := h.Processes(ns, name)
	if err != nil {
		tb.Fatal(err)
	}
	var lines []string
	for _, p := range procs {
		kb, _ := rssKB(p.PID)
		label := componentName(p)
		lines = append(lines, fmt.Sprintf("%-24s %5d MB", label, kb>>10))
	}
	sort.Strings(lines)
	return "per process:\n" + strings.Join(lines, "\n")
}

// BenchmarkMachineCPU measures what one stacked control plane machine costs
// in CPU: from its start until every component is healthy and its Node is
// Ready (start-cpu-s), and then each second over a minute
// (steady-cpu-ms/s), with the per-component breakdown logged:
//
//	go test ./internal/machinehost -run '^$' -bench MachineCPU -benchtime 1x
//
// QCP_BENCH_APISERVER_ARGS (flags separated by spaces, each --name=value)
// adds kube-apiserver flags, and QCP_BENCH_ARGS any component's
// (component:--name=value, say kube-scheduler:--leader-elect=false), so
// that a flag's cost is measured before a test profile adopts it; the
// variables of the Go runtime (GOGC) reach the machine's processes through
// the environment.
func BenchmarkMachineCPU(b *testing.B) {
	testkit.RequireBinaries(b, "etcd", "kube")
	for range b.N {
		h := newHost(b)
		c := newTestCluster(b, h, "ns-cpu", "cc")
		spec := c.spec("m1", "fd-a")
		doc := bootstrap.NewStacked(c.cl, c.cas, c.lbAddr, bootstrap.NewMember())
		doc.ExtraArgs = map[bootstrap.Component][]bootstrap.Arg{}
		args := strings.Fields(os.Getenv("QCP_BENCH_ARGS"))
		for _, f := range strings.Fields(os.Getenv("QCP_BENCH_APISERVER_ARGS")) {
			args = append(args, string(bootstrap.KubeAPIServer)+":"+f)
		}
		for _, f := range args {
			component, flag, _ := strings.Cut(f, ":")
			name, value, _ := strings.Cut(strings.TrimLeft(flag, "-"), "=")
			doc.ExtraArgs[bootstrap.Component(component)] = append(doc.ExtraArgs[bootstrap.Component(component)], bootstrap.Arg{Name: name, Value: value})
		}
		started := time.Now()
		c.startDoc(spec, doc)
		if err := h.SetBackends(c.ns, c.cl, []string{spec.Address + ":6443"}); err != nil {
			b.Fatal(err)
		}
		c.waitNodeReady("m1", corev1.ConditionTrue, 3*time.Minute)
		c.waitHealthy(spec, 3*time.Minute)
		healthy := time.Since(started)
		atStart := machineCPU(b, h, "ns-cpu", "m1")
		window := time.Minute
		time.Sleep(window) // a measurement window, not a wait for a condition
		after := machineCPU(b, h, "ns-cpu", "m1")
		var lines []string
		var start, steady float64
		for name, v := range after {
			start += atStart[name]
			steady += v - atStart[name]
			lines = append(lines, fmt.Sprintf("%-24s start %5.1f s   steady %4.0f ms/s", name, atStart[name], (v-atStart[name])*1000/window.Seconds()))
		}
		sort.Strings(lines)
		b.ReportMetric(healthy.Seconds(), "healthy-s")
		b.ReportMetric(start, "start-cpu-s")
		b.ReportMetric(steady*1000/window.Seconds(), "steady-cpu-ms/s")
		b.Log("per component:\n" + strings.Join(lines, "\n"))
	}
}

// machineCPU is the CPU-seconds (user and system) each process of a machine
// has used, by component.
func machineCPU(tb testing.TB, h *Host, ns, name string) map[string]float64 {
	procs, err := h.Processes(ns, name)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]float64{}
	for _, p := range procs {
		cpu, err := testkit.CPUSeconds(p.PID)
		if err != nil {
			continue // exited meanwhile
		}
		out[componentName(p)] += cpu
	}
	return out
}
