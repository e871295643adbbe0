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

	"golang.org/x/sys/unix"
)

// Ticks returns the busy and idle ticks (USER_HZ) of all CPUs since boot,
// from /proc/stat's cpu line; idle counts iowait too, busy counts work at a
// lowered priority (nice) too. Both are 0 where /proc/stat cannot be read.
func Ticks() (busy, idle uint64) {
	t := read()
	return t.busy + t.nice, t.idle
}

// ticks are /proc/stat's cpu line: nice is the work of processes at a
// lowered priority, busy all other work.
type ticks struct{ busy, nice, idle uint64 }

func read() ticks {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return ticks{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parse(line)
}

// parse reads a cpu line of /proc/stat: user, nice, system, idle, iowait,
// irq, softirq, steal.
func parse(line string) ticks {
	var t ticks
	f := strings.Fields(line)
	for k := 1; k < len(f) && k <= 8; k++ {
		v, _ := strconv.ParseUint(f[k], 10, 64)
		switch k {
		case 2:
			t.nice += v
		case 4, 5: // idle, iowait
			t.idle += v
		default:
			t.busy += v
		}
	}
	return t
}

// niceSpare says whether work at a lowered priority is CPU to spare for
// this process: it is when this process runs at the default priority, so
// that the kernel gives such work only what this process's kind leaves.
// A process that runs niced itself cannot tell its own kind's work from
// the other niced work in /proc/stat, so to it that work is busy.
func niceSpare() bool {
	p, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	// The raw system call returns 20 - nice.
	return err == nil && p == 20
}

// Load samples the host's CPUs every interval and reports their busy
// fraction (0 to 1) over the last window. Work at a lowered priority counts
// as spare when this process runs at the default priority (niceSpare): it
// yields its CPU to everything else, as `make test`'s build of a binary
// only some tests need yields to the tests.
type Load struct {
	mu        sync.Mutex
	window    time.Duration
	niceSpare bool
	samples   []sample
}

type sample struct {
	at         time.Time
	busy, idle uint64
}

// NewLoad starts sampling every interval, for as long as the process runs.
func NewLoad(interval, window time.Duration) *Load {
	l := &Load{window: window, niceSpare: niceSpare()}
	l.take(time.Now())
	go func() {
		for now := range time.Tick(interval) {
			l.take(now)
		}
	}()
	return l
}

func (l *Load) take(now time.Time) { l.add(now, read()) }

func (l *Load) add(now time.Time, t ticks) {
	busy, idle := t.busy+t.nice, t.idle
	if l.niceSpare {
		busy, idle = t.busy, t.idle+t.nice
	}
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
