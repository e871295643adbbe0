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
