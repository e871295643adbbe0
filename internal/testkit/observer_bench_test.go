package testkit

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// BenchmarkObserverCPU measures what the tests' observers cost: the etcd CPU
// of a real 3-member cluster (etcd-ms/s) and the CPU of this process, their
// client (client-ms/s), over a window each, at rest, with the invariant
// monitor at its default interval, and with the writer at each pause of
// QCP_BENCH_WRITER_PAUSES (default "50ms 250ms": testkit's default and a
// scenario's):
//
//	GOMAXPROCS=1 go test ./internal/testkit -run '^$' -bench ObserverCPU -benchtime 1x
//
// Every scenario runs a writer and a monitor beside its machines, so on a
// 2-core host what they cost is CPU the machines under test do not get.
func BenchmarkObserverCPU(b *testing.B) {
	pauses := strings.Fields(os.Getenv("QCP_BENCH_WRITER_PAUSES"))
	if len(pauses) == 0 {
		pauses = []string{"50ms", "250ms"}
	}
	for range b.N {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		cl, ps, cli := StartEtcdCluster(ctx, b, "observers", 3)
		measure := func(name string, start func() (stop func())) {
			stop := start()
			// The first seconds of a client are its connections.
			time.Sleep(5 * time.Second) // settling before a measurement window, not a wait for a condition
			etcd, self := etcdCPU(b, ps), selfCPU(b)
			const window = 30 * time.Second
			time.Sleep(window) // a measurement window, not a wait for a condition
			b.ReportMetric((etcdCPU(b, ps)-etcd)*1000/window.Seconds(), name+"-etcd-ms/s")
			b.ReportMetric((selfCPU(b)-self)*1000/window.Seconds(), name+"-client-ms/s")
			stop()
		}
		measure("rest", func() func() { return func() {} })
		measure("monitor", func() func() {
			m := StartMonitor(cli, 3, 0)
			return func() { m.Stop() }
		})
		for _, p := range pauses {
			pause, err := time.ParseDuration(p)
			if err != nil {
				b.Fatalf("QCP_BENCH_WRITER_PAUSES: %v", err)
			}
			measure("writer-"+p, func() func() {
				w, err := StartWriter(cl.Config(ps[0].ClientURL(), ps[1].ClientURL(), ps[2].ClientURL()), WriterOptions{Pause: pause})
				if err != nil {
					b.Fatal(err)
				}
				return func() {
					if err := w.Stop(ctx).Err(); err != nil {
						b.Error(err)
					}
				}
			})
		}
		cancel()
	}
}

// etcdCPU is the CPU-seconds the members have used.
func etcdCPU(tb testing.TB, ps []*EtcdProcess) float64 {
	tb.Helper()
	var sum float64
	for _, p := range ps {
		p.mu.Lock()
		pid := p.cmd.Process.Pid
		p.mu.Unlock()
		sum += cpuSeconds(tb, pid)
	}
	return sum
}

// selfCPU is the CPU-seconds this process has used.
func selfCPU(tb testing.TB) float64 { return cpuSeconds(tb, os.Getpid()) }

func cpuSeconds(tb testing.TB, pid int) float64 {
	tb.Helper()
	cpu, err := CPUSeconds(pid)
	if err != nil {
		tb.Fatal(err)
	}
	return cpu
}
