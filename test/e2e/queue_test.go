package e2e

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// scenarios runs the package's scenarios side by side, slots at a time,
// longest first. go test releases its parallel tests together and in no
// set order, so a long scenario released last would end the package alone,
// long after the others; and its -parallel limit would hold slots for
// tests that then wait here. So go test's limit is lifted (scenariosAtOnce)
// and this queue does the limiting.
var scenarios = &scenarioQueue{}

// scenarioQueue hands out slots to registered scenarios, longest expected
// first.
type scenarioQueue struct {
	mu      sync.Mutex
	cond    *sync.Cond
	slots   int
	running int
	waiting []*queued
}

type queued struct {
	name     string
	expected time.Duration
}

// parallel marks t as a scenario that runs beside the others, expected to
// take about expected (a scheduling hint, from the profile's elapsed times:
// it orders the queue and bounds nothing), and returns once it has a slot;
// the slot is freed when t ends. It must be called where t.Parallel would
// be: at the start of a top-level test, before anything slow.
func parallel(t *testing.T, expected time.Duration) { scenarios.parallel(t, expected) }

func (q *scenarioQueue) parallel(t *testing.T, expected time.Duration) {
	q.mu.Lock()
	if q.cond == nil {
		q.cond = sync.NewCond(&q.mu)
	}
	me := &queued{name: t.Name(), expected: expected}
	// Registered before t.Parallel: go test runs every top-level test's
	// sequential part first, so all scenarios are queued before any starts.
	q.waiting = append(q.waiting, me)
	q.mu.Unlock()
	t.Parallel()

	since := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.running >= q.slots || q.next() != me {
		q.cond.Wait()
	}
	// go test counts a scenario's time from its release, so the profile
	// reads this line to tell the wait from the run (testprofile's
	// QueuedPrefix).
	t.Logf("scenario queue: waited %.1fs for a slot", time.Since(since).Seconds())
	q.waiting = slices.DeleteFunc(q.waiting, func(w *queued) bool { return w == me })
	q.running++
	q.cond.Broadcast()
	t.Cleanup(func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.running--
		q.cond.Broadcast()
	})
}

// next is the waiting scenario expected to take longest (by name on a tie).
func (q *scenarioQueue) next() *queued {
	var best *queued
	for _, w := range q.waiting {
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
				q.parallel(t, c.expected)
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
