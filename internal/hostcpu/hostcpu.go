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
// host's CPUs (0 to 1) over the last window. With yielding set, the CPU of
// work that yields to everything else counts as spare: yielding returns the
// ticks that work has used so far (`make test` builds a binary only some
// tests need at the lowest priority beside them). It may fall back (when
// that work ends); the ticks used since the last sample then go uncounted.
type Load struct {
	mu       sync.Mutex
	window   time.Duration
	yielding func() uint64
	// yielded is what yielding reported at the last sample, and spared all
	// it has added since the first.
	yielded, spared uint64
	samples         []sample
}

type sample struct {
	at         time.Time
	busy, idle uint64
}

// NewLoad starts sampling every interval, for as long as the process runs;
// yielding may be nil.
func NewLoad(interval, window time.Duration, yielding func() uint64) *Load {
	l := &Load{window: window, yielding: yielding}
	l.take(time.Now())
	go func() {
		for now := range time.Tick(interval) {
			l.take(now)
		}
	}()
	return l
}

func (l *Load) take(now time.Time) {
	var yielded uint64
	if l.yielding != nil {
		yielded = l.yielding()
	}
	busy, idle := Ticks()
	l.add(now, busy, idle, yielded)
}

func (l *Load) add(now time.Time, busy, idle, yielded uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if yielded > l.yielded && len(l.samples) > 0 {
		l.spared += yielded - l.yielded
	}
	l.yielded = yielded
	spared := min(l.spared, busy)
	l.samples = append(l.samples, sample{now, busy - spared, idle + spared})
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
