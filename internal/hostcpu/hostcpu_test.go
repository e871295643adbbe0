package hostcpu

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestLoad: while this process keeps every CPU busy, the load reads busy,
// and its window drops samples older than itself.
func TestLoad(t *testing.T) {
	if busy, idle := Ticks(); busy == 0 || idle == 0 {
		t.Fatalf("ticks from /proc/stat: busy %d, idle %d", busy, idle)
	}
	l := NewLoad(100*time.Millisecond, 500*time.Millisecond)
	if _, ok := l.Busy(); ok {
		t.Fatal("a load with one sample reports a busy fraction")
	}
	// make test runs every process with GOMAXPROCS=1.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(runtime.NumCPU()))
	stop := make(chan struct{})
	defer close(stop)
	for range runtime.NumCPU() {
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		busy, ok := l.Busy()
		if ok && busy > 0.8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("every CPU spinning, the load read %.2f busy (ok %v) after 10 s", busy, ok)
		}
		time.Sleep(100 * time.Millisecond)
	}
	l.mu.Lock()
	n := len(l.samples)
	l.mu.Unlock()
	if n > 8 {
		t.Errorf("%d samples kept for a 500 ms window sampled every 100 ms", n)
	}
}

// TestNiceWork: /proc/stat's niced work is busy to Ticks, and spare to a
// Load whose process runs at the default priority; a niced process counts
// it busy, as it cannot tell its own kind's work from it.
func TestNiceWork(t *testing.T) {
	at := parse("cpu  100 40 20 300 10 1 2 3 0 0")
	if want := (ticks{busy: 126, nice: 40, idle: 310}); at != want {
		t.Fatalf("parsed %+v, want %+v", at, want)
	}
	later := ticks{busy: at.busy + 20, nice: at.nice + 60, idle: at.idle + 20}
	for _, c := range []struct {
		niceSpare bool
		want      float64
	}{{true, 0.2}, {false, 0.8}} {
		l := &Load{window: time.Minute, niceSpare: c.niceSpare}
		l.add(time.Now(), at)
		l.add(time.Now().Add(time.Second), later)
		if busy, ok := l.Busy(); !ok || busy < c.want-1e-9 || busy > c.want+1e-9 {
			t.Errorf("niced work spare %v: the load read %.2f busy (ok %v), want %.2f", c.niceSpare, busy, ok, c.want)
		}
	}

	// This process's own priority decides.
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(stat), ") ")
	own := strings.Fields(after)[16] // field 19, nice
	if got, want := niceSpare(), own == "0"; got != want {
		t.Errorf("running at nice %s, niceSpare() = %v, want %v", own, got, want)
	}
	if os.Getenv("HOSTCPU_NICED_CHILD") == "1" {
		if niceSpare() {
			t.Error("a niced process takes niced work as spare")
		}
		return
	}
	cmd := exec.Command("nice", "-n", "5", os.Args[0], "-test.run=^TestNiceWork$")
	cmd.Env = append(os.Environ(), "HOSTCPU_NICED_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("at nice 5: %v\n%s", err, out)
	}
}
