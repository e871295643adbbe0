package hostcpu

import (
	"runtime"
	"testing"
	"time"
)

// TestLoad: while this process keeps every CPU busy, the load reads busy,
// and its window drops samples older than itself.
func TestLoad(t *testing.T) {
	if busy, idle := Ticks(); busy == 0 || idle == 0 {
		t.Fatalf("ticks from /proc/stat: busy %d, idle %d", busy, idle)
	}
	l := NewLoad(100*time.Millisecond, 500*time.Millisecond, nil)
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

// TestLoadYielding: the CPU of work that yields counts as spare, and when
// that work ends (its ticks fall back to 0) the load does not jump.
func TestLoadYielding(t *testing.T) {
	start := time.Now()
	l := &Load{window: time.Minute}
	for k, c := range []struct {
		busy, idle, yielded uint64
		want                float64
	}{
		{100, 100, 500, 0},         // before the first sample: not counted
		{180, 120, 560, 0.2},       // 80 busy, 60 of them the yielding work's
		{200, 140, 0, 40.0 / 140},  // it ended: the 20 busy since count
		{240, 160, 30, 50.0 / 200}, // another: 30 of the 40 busy since
	} {
		l.add(start.Add(time.Duration(k)*time.Second), c.busy, c.idle, c.yielded)
		if k == 0 {
			continue
		}
		if busy, ok := l.Busy(); !ok || busy < c.want-1e-9 || busy > c.want+1e-9 {
			t.Errorf("sample %d: the load read %.3f busy (ok %v), want %.3f", k, busy, ok, c.want)
		}
	}
}
