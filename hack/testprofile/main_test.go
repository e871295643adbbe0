package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestComponentAndOwner(t *testing.T) {
	for _, c := range []struct {
		comm string
		args []string
		want string
	}{
		{"kube-v1.36.3", []string{"/bin/kube-v1.36.3", "kube-apiserver", "--x"}, "kube-apiserver"},
		{"kube-v1.36.3", []string{"/bin/kube-v1.36.3", "kube-scheduler"}, "kube-scheduler"},
		{"etcd-v3.6.16", []string{"/bin/etcd-v3.6.16"}, "etcd"},
		{"controlplane.te", []string{"/tmp/go-build1/b001/controlplane.test", "-test.v"}, "test binary"},
		{"compile", []string{"/go/pkg/tool/compile"}, "go toolchain"},
		{"qcp-agent", []string{"/bin/qcp-agent", "run"}, "qcp-agent"},
	} {
		if got := component(c.comm, c.args); got != c.want {
			t.Errorf("component(%q, %q) = %q, want %q", c.comm, c.args, got, c.want)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bash", "hack/build-pinned.sh", "kube", "v1.35.4", "/b/kube-v1.35.4"}, "build kube v1.35.4"},
		{[]string{"/usr/local/go/bin/go", "test", "-json"}, "go test"},
		{[]string{"/usr/bin/make", "test"}, ""},
	} {
		if got := ownerOf(1, c.args); got != c.want {
			t.Errorf("ownerOf(%q) = %q, want %q", c.args, got, c.want)
		}
	}
	for _, args := range [][]string{
		{"qcp-agent", "run", "--dir", "/m/default/scale-x7k2p", "--bin-dir", "/b"},
		{"qcp-agent", "run", "--dir=/m/default/scale-x7k2p/var/lib/qcp", "--bootstrap-file=/m/default/scale-x7k2p/etc/qcp/bootstrap.yaml"},
		{"qcp-agent", "lb", "--dir", "/m/_lb/default/scale"},
	} {
		if got := machineCluster(args); got != "scale" {
			t.Errorf("machineCluster(%q) = %q, want scale", args, got)
		}
	}
	if got := machineCluster([]string{"qcp-agent", "lb", "--dir", "/m/_lb/default/moved-etcd"}); got != "moved-etcd" {
		t.Errorf("a load balancer's cluster = %q, want moved-etcd", got)
	}
}

// TestRecordSeesAChildsCPU records a shell that counts for a while in a
// grandchild shell (reaped by a child that exits at once), and checks that the profile attributes to the command about
// the CPU its processes used (their rusage), and never more: a process that
// exits is counted through its parent's reaped-children time, once.
func TestRecordSeesAChildsCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("spins a core for about a second")
	}
	out := filepath.Join(t.TempDir(), "p.jsonl")
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &before)
	if code := record(out, 200*time.Millisecond, []string{"sh", "-c", `sh -c "sh -c 'i=0; while [ \$i -lt 2000000 ]; do i=\$((i+1)); done'; true"; sleep 0.5`}); code != 0 {
		t.Fatalf("record exited %d", code)
	}
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &after)
	used := seconds(after.Utime) + seconds(after.Stime) - seconds(before.Utime) - seconds(before.Stime)
	r, err := load(out, os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	var got float64
	for _, s := range r.samples {
		if s.MemUsed <= 0 {
			t.Errorf("a sample shows no memory in use: %+v", s)
		}
		for g, v := range s.CPU {
			if strings.HasPrefix(g, "make|") {
				got += v
			}
		}
	}
	if used < 0.3 {
		t.Fatalf("the command used only %.2f CPU-seconds; count longer", used)
	}
	// The recorder loses at most the last interval of each process; it
	// never counts a process twice.
	if got < used-0.45 || got > used+0.02 {
		t.Errorf("the profile attributes %.2f CPU-seconds to the command, which used %.2f", got, used)
	}
}

func seconds(tv syscall.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }

func TestReport(t *testing.T) {
	got := reportOf(t, true)
	for _, want := range []string{
		"| builds, generate, vet (before go test) | 60 | 90 | 30 | 1.50 | 2.0 |",
		"| test (go test: compiling, then running) | 120 | 180 | 60 | 1.50 | 7.5 |",
		"| build kube v1.36.3 | 90 |",
		"| test/e2e | 11 | 109 | 165 | pass |",
		"| test/e2e TestCreateAndScale | 12 | 8 | 98 | 98 | pass |",
		// Two packages' clusters of one name are two rows; a cluster lives
		// from the sample before its first to its last.
		"| test/e2e | scale | 110 | 110 | 1000 |",
		"| internal/machinehost | scale | 20 | 10 | 500 |",
		"| total | 2 clusters | 130 | 120 | 923 |",
		"The test phase's CPU besides the process machines': 60 CPU-seconds.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q:\n%s", want, got)
		}
	}
}

// TestReportWithoutMemory: a profile recorded before samples carried the
// host's memory says so, rather than a peak of 0.
func TestReportWithoutMemory(t *testing.T) {
	got := reportOf(t, false)
	if want := "| test (go test: compiling, then running) | 120 | 180 | 60 | 1.50 | not recorded |"; !strings.Contains(got, want) {
		t.Errorf("the report lacks %q:\n%s", want, got)
	}
}

// reportOf is the report of a made-up run of 180 s: 60 s of builds, then
// go test; withMemory gives each sample the host's memory in use.
func reportOf(t *testing.T, withMemory bool) string {
	t.Helper()
	dir := t.TempDir()
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	var prof, tests strings.Builder
	enc := json.NewEncoder(&prof)
	for i := 1; i <= 180; i++ {
		s := sample{T: t0.Add(time.Duration(i) * time.Second).UnixMilli(), Busy: 1.5, Idle: 0.5, CPU: map[string]float64{}}
		if withMemory {
			s.MemUsed = 2
			if i == 100 {
				s.MemUsed = 7.5 // the test phase's peak
			}
		}
		switch {
		case i <= 60:
			s.CPU["build kube v1.36.3|go toolchain|"] = 1.5
		case i <= 70:
			s.CPU["go test|go toolchain|"] = 1.5
		default:
			s.CPU["test /src/qcp/test/e2e|etcd|scale"] = 1
			s.CPU["test /src/qcp/test/e2e|test binary|"] = 0.5
			if i >= 100 && i < 120 {
				s.CPU["test /src/qcp/internal/machinehost|etcd|scale"] = 0.5
			}
		}
		_ = enc.Encode(s)
	}
	ev := json.NewEncoder(&tests)
	pkg := "github.com/qcp-dev/qcp/test/e2e"
	_ = ev.Encode(testEvent{Time: t0.Add(71 * time.Second), Action: "start", Package: pkg})
	_ = ev.Encode(testEvent{Time: t0.Add(72 * time.Second), Action: "run", Package: pkg, Test: "TestCreateAndScale"})
	_ = ev.Encode(testEvent{Time: t0.Add(80 * time.Second), Action: "output", Package: pkg, Test: "TestCreateAndScale", Output: "    queue_test.go:60: " + QueuedPrefix + "8.2s for a slot\n"})
	_ = ev.Encode(testEvent{Time: t0.Add(170 * time.Second), Action: "pass", Package: pkg, Test: "TestCreateAndScale", Elapsed: 98})
	_ = ev.Encode(testEvent{Time: t0.Add(180 * time.Second), Action: "pass", Package: pkg, Elapsed: 109})
	p, tj := filepath.Join(dir, "p.jsonl"), filepath.Join(dir, "t.json")
	if err := os.WriteFile(p, []byte(prof.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tj, []byte(tests.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := report(&b, p, tj, time.Time{}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
