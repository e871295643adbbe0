package e2e

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/testkit"
)

// scenarios runs the package's scenarios side by side, slots at a time,
// longest first. go test releases its parallel tests together and in no
// set order, so a long scenario released last would end the package alone,
// long after the others; and its -parallel limit would hold slots for
// tests that then wait here. So go test's limit is lifted (scenariosAtOnce)
// and this queue does the limiting.
var scenarios = &scenarioQueue{}

// scenarioQueue hands out slots to registered scenarios, longest expected
// first. With busy set, a scenario also waits for CPU to spare: at most
// maxBusy of the host's CPUs busy over busy's window, and spacing since the
// last start, so that the last one's machines show in that window before
// another starts. With none running, a scenario waits for CPU at most
// aloneAfter: the other packages' tests, which no queue holds back, are
// busiest at the start, beside the management cluster's start, and the
// first scenario is the largest; once they have kept the host busy that
// long, it starts anyway. The same scenarios at a fixed four at a time kept
// a host 1.7 to 2.5 times slower than the one they were sized on fully
// busy, and missed their deadlines (docs/measurements.md); waiting for CPU
// keeps a slow host's scenarios within them, and a fast host still runs
// slots at once.
type scenarioQueue struct {
	mu      sync.Mutex
	cond    *sync.Cond
	slots   int
	running int
	waiting []*queued
	busy    func() (float64, bool)
	maxBusy float64
	spacing time.Duration
	// aloneAfter bounds a scenario's wait for CPU while none runs.
	aloneAfter time.Duration
	lastStart  time.Time
	ticking    bool
}

type queued struct {
	name     string
	expected time.Duration
	// ready, when set, says whether it may start yet: false while a binary
	// it needs is still being built.
	ready func() bool
	// since is when it began to wait.
	since time.Time
}

// parallel marks t as a scenario that runs beside the others, expected to
// take about expected (a scheduling hint, from the profile's elapsed times:
// it orders the queue and bounds nothing), and returns once it has a slot;
// the slot is freed when t ends. It must be called where t.Parallel would
// be: at the start of a top-level test, before anything slow.
//
// A scenario that needs a pinned binary `make test` builds beside the tests
// (kube-previous) names it in needs: it takes no slot until the binary is
// built, and the scenarios behind it go first.
func parallel(t *testing.T, expected time.Duration, needs ...string) {
	var ready func() bool
	if len(needs) > 0 {
		ready = func() bool { return !slices.ContainsFunc(needs, testkit.BinaryBuilding) }
	}
	scenarios.parallel(t, expected, ready)
}

func (q *scenarioQueue) parallel(t *testing.T, expected time.Duration, ready func() bool) {
	q.mu.Lock()
	if q.cond == nil {
		q.cond = sync.NewCond(&q.mu)
	}
	me := &queued{name: t.Name(), expected: expected, ready: ready}
	// Registered before t.Parallel: go test runs every top-level test's
	// sequential part first, so all scenarios are queued before any starts.
	q.waiting = append(q.waiting, me)
	q.mu.Unlock()
	t.Parallel()

	q.mu.Lock()
	defer q.mu.Unlock()
	me.since = time.Now()
	if (q.busy != nil || ready != nil) && !q.ticking {
		// The host's load, and a build, change without anything here
		// broadcasting.
		q.ticking = true
		go func() {
			for range time.Tick(2 * time.Second) {
				q.cond.Broadcast()
			}
		}()
	}
	for !q.mayStart(me, time.Now()) {
		q.cond.Wait()
	}
	// go test counts a scenario's time from its release, so the profile
	// reads this line to tell the wait from the run (testprofile's
	// QueuedPrefix).
	t.Logf("scenario queue: waited %.1fs for a slot (%d running, %s)", time.Since(me.since).Seconds(), q.running, q.load())
	q.waiting = slices.DeleteFunc(q.waiting, func(w *queued) bool { return w == me })
	q.running++
	q.lastStart = time.Now()
	q.cond.Broadcast()
	t.Cleanup(func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.running--
		q.cond.Broadcast()
	})
}

// mayStart says whether me, waiting, starts now: it is next, a slot is
// free, and the host has CPU to spare, or none runs and it has waited
// aloneAfter.
func (q *scenarioQueue) mayStart(me *queued, now time.Time) bool {
	if q.running >= q.slots || q.next() != me {
		return false
	}
	if q.busy == nil || q.running == 0 && now.Sub(me.since) >= q.aloneAfter {
		return true
	}
	if q.running > 0 && now.Sub(q.lastStart) < q.spacing {
		return false
	}
	busy, ok := q.busy()
	return ok && busy < q.maxBusy
}

// load describes the host's CPU for the queue's log line.
func (q *scenarioQueue) load() string {
	if q.busy == nil {
		return "no CPU limit"
	}
	busy, ok := q.busy()
	if !ok {
		return "host CPU not read yet"
	}
	return fmt.Sprintf("host CPUs %.0f%% busy, starts below %.0f%%", busy*100, q.maxBusy*100)
}

// next is the waiting scenario expected to take longest (by name on a
// tie) of those ready to start.
func (q *scenarioQueue) next() *queued {
	var best *queued
	for _, w := range q.waiting {
		if w.ready != nil && !w.ready() {
			continue
		}
		if best == nil || w.expected > best.expected || w.expected == best.expected && w.name < best.name {
			best = w
		}
	}
	return best
}

// TestScenarioQueue: with one slot, three scenarios registered in the order
// short, long, middle run longest first, one at a time.
func TestScenarioQueue(t *testing.T) {
	q := &scenarioQueue{slots: 1}
	var mu sync.Mutex
	var order []string
	running := 0
	t.Run("group", func(t *testing.T) {
		for _, c := range []struct {
			name     string
			expected time.Duration
		}{{"short", time.Second}, {"long", 3 * time.Second}, {"middle", 2 * time.Second}} {
			t.Run(c.name, func(t *testing.T) {
				q.parallel(t, c.expected, nil)
				mu.Lock()
				order = append(order, c.name)
				running++
				if running > 1 {
					t.Errorf("%d scenarios ran at once with one slot", running)
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond) // let another scenario try to run meanwhile
				mu.Lock()
				running--
				mu.Unlock()
			})
		}
	})
	if want := []string{"long", "middle", "short"}; !slices.Equal(order, want) {
		t.Errorf("ran in the order %v, want %v", order, want)
	}
}

// TestScenarioQueueWaitsForBinary: a scenario whose binary is still being
// built takes no slot, and a shorter one behind it goes first; it starts
// once the binary is built.
func TestScenarioQueueWaitsForBinary(t *testing.T) {
	q := &scenarioQueue{slots: 1}
	var built atomic.Bool
	var mu sync.Mutex
	var order []string
	run := func(name string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, name)
	}
	t.Run("group", func(t *testing.T) {
		t.Run("upgrade", func(t *testing.T) {
			q.parallel(t, 3*time.Second, built.Load)
			run("upgrade")
		})
		t.Run("short", func(t *testing.T) {
			q.parallel(t, time.Second, nil)
			run("short")
			built.Store(true) // the build ends while it runs
		})
	})
	if want := []string{"short", "upgrade"}; !slices.Equal(order, want) {
		t.Errorf("ran in the order %v, want %v", order, want)
	}
}

// TestScenarioQueueWaitsForCPU: with three slots, scenarios on a busy host
// run one at a time; on an idle one, side by side.
func TestScenarioQueueWaitsForCPU(t *testing.T) {
	run := func(t *testing.T, busy float64) (most int) {
		q := &scenarioQueue{slots: 3, maxBusy: 0.75, busy: func() (float64, bool) { return busy, true }}
		var mu sync.Mutex
		running := 0
		t.Run("group", func(t *testing.T) {
			for _, name := range []string{"a", "b", "c"} {
				t.Run(name, func(t *testing.T) {
					q.parallel(t, time.Second, nil)
					mu.Lock()
					running++
					most = max(most, running)
					mu.Unlock()
					// Until another runs beside it, or long enough that one
					// would have if the queue allowed it.
					deadline := time.Now().Add(3 * time.Second)
					for time.Now().Before(deadline) {
						mu.Lock()
						n := running
						mu.Unlock()
						if n > 1 {
							break
						}
						time.Sleep(10 * time.Millisecond)
					}
					mu.Lock()
					running--
					mu.Unlock()
				})
			}
		})
		return most
	}
	if most := run(t, 0.9); most != 1 {
		t.Errorf("host 90%% busy: %d scenarios ran at once, want 1", most)
	}
	if most := run(t, 0.1); most < 2 {
		t.Errorf("host 10%% busy: at most %d scenario ran at once, want 2 or more", most)
	}
}

// TestScenarioQueueFirstWaitsAWhile: with none running, a scenario on a
// busy host starts once it has waited aloneAfter, and at once on an idle
// one.
func TestScenarioQueueFirstWaitsAWhile(t *testing.T) {
	const aloneAfter = 500 * time.Millisecond
	for _, c := range []struct {
		busy     float64
		min, max time.Duration
	}{{0.9, aloneAfter, 10 * aloneAfter}, {0.1, 0, aloneAfter}} {
		q := &scenarioQueue{slots: 2, maxBusy: 0.75, aloneAfter: aloneAfter, busy: func() (float64, bool) { return c.busy, true }}
		var waited time.Duration
		t.Run(fmt.Sprintf("busy %.1f", c.busy), func(t *testing.T) {
			t.Run("one", func(t *testing.T) {
				released := time.Now()
				q.parallel(t, time.Second, nil)
				waited = time.Since(released)
			})
		})
		if waited < c.min || waited > c.max {
			t.Errorf("host %.0f%% busy, none running: the scenario waited %v, want %v to %v", c.busy*100, waited, c.min, c.max)
		}
	}
}
