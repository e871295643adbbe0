// Package hostcpu reads how busy the host's CPUs are, from /proc/stat: the
// test profile records it, and test/e2e's scenario queue starts a scenario
// only while the host has CPU to spare.
package hostcpu

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Ticks returns the busy and idle ticks (USER_HZ) of all CPUs since boot,
// from /proc/stat's cpu line; idle counts iowait too. Both are 0 where
// /proc/stat cannot be read.
func Ticks() (busy, idle uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for k := 1; k < len(f) && k <= 8; k++ {
		v, _ := strconv.ParseUint(f[k], 10, 64)
		if k == 4 || k == 5 { // idle, iowait
			idle += v
		} else {
			busy += v
		}
	}
	return busy, idle
}

// Load samples Ticks every interval and reports the busy fraction of the
// host's CPUs (0 to 1) over the last window.
type Load struct {
	mu      sync.Mutex
	window  time.Duration
	samples []sample
}

type sample struct {
	at         time.Time
	busy, idle uint64
}

// NewLoad starts sampling every interval, for as long as the process runs.
func NewLoad(interval, window time.Duration) *Load {
	l := &Load{window: window}
	l.take(time.Now())
	go func() {
		for now := range time.Tick(interval) {
			l.take(now)
		}
	}()
	return l
}

func (l *Load) take(now time.Time) {
	busy, idle := Ticks()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.samples = append(l.samples, sample{now, busy, idle})
	// Keep one sample at or before the window's start.
	for len(l.samples) > 2 && now.Sub(l.samples[1].at) >= l.window {
		l.samples = l.samples[1:]
	}
}

// Busy is the busy fraction over the window so far, and false until two
// samples are in.
func (l *Load) Busy() (float64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.samples) < 2 {
		return 0, false
	}
	first, last := l.samples[0], l.samples[len(l.samples)-1]
	busy, idle := float64(last.busy-first.busy), float64(last.idle-first.idle)
	if busy+idle == 0 {
		return 0, false
	}
	return busy / (busy + idle), true
}
