package engine

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
)

// Wakeups remembers, per control plane, when the controller last learned
// something: a watch event arriving for it, or a round's look at it ending.
// The reaction latency of a step counts from the later of the two (or from
// the previous step's end): a change seen in the API is observable when its
// event arrives, and a change only etcd shows (a learner catching up) came
// after the previous look ended without it, so the figure is an upper
// bound for those.
//
// It also paces the looks no watch can replace: while a change only etcd
// shows is in flight, PollAfter says when to look again.
type Wakeups struct {
	mu     sync.Mutex
	events map[types.NamespacedName]time.Time
	rounds map[types.NamespacedName]time.Time
	acts   map[types.NamespacedName]time.Time
	now    func() time.Time
}

// NewWakeups returns Wakeups on the clock now.
func NewWakeups(now func() time.Time) *Wakeups {
	return &Wakeups{events: map[types.NamespacedName]time.Time{}, rounds: map[types.NamespacedName]time.Time{},
		acts: map[types.NamespacedName]time.Time{}, now: now}
}

// Polling bounds for PollAfter.
const (
	// FastPoll is how soon a round looks again right after a step: what
	// the step set going (a learner catching up, a leader moving) usually
	// ends within a second or two.
	FastPoll = 200 * time.Millisecond
	// SlowPoll bounds the wait between looks at a change that has been in
	// flight for long: a member that stays down, a machine still booting.
	SlowPoll = 2 * time.Second
	// MaintenancePoll bounds the wait between looks at a steady cluster
	// with etcd QCP runs: a NOSPACE alarm, or a database filling up or
	// fragmenting, shows in no watch, only in etcd itself.
	MaintenancePoll = 15 * time.Second
)

// Acted records that a round took a step on key, or must plan again at once.
func (w *Wakeups) Acted(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.acts[key] = w.now()
}

// PollAfter is how soon to look at key again while something no watch
// reports is in flight: FastPoll after a step, and then a tenth of the
// time since the last step, up to SlowPoll. So the reaction to a change
// only etcd shows comes within a tenth of the time already waited for it
// (and within SlowPoll), while a wait of minutes (a member down, a frozen
// machine) costs an observation every two seconds rather than five a
// second: each look reads every Machine from the API server and asks every
// member for its status.
func (w *Wakeups) PollAfter(key types.NamespacedName) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	last, ok := w.acts[key]
	if !ok {
		return SlowPoll // nothing this process did is in flight
	}
	return min(max(w.now().Sub(last)/10, FastPoll), SlowPoll)
}

// Mapped wraps a map function so that every request it returns is noted
// as woken now.
func (w *Wakeups) Mapped(fn handler.MapFunc) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []ctrl.Request {
		reqs := fn(ctx, o)
		at := w.now()
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, r := range reqs {
			w.events[r.NamespacedName] = at
		}
		return reqs
	}
}

// Learned returns the moment the controller last learned something about
// key: its last event, or the end of its last look.
func (w *Wakeups) Learned(key types.NamespacedName) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	last := w.rounds[key]
	if e := w.events[key]; e.After(last) {
		last = e
	}
	return last
}

// Looked records that a look at key ended at.
func (w *Wakeups) Looked(key types.NamespacedName, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rounds[key] = at
}

// Forget drops key, once its control plane is gone.
func (w *Wakeups) Forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.events, key)
	delete(w.rounds, key)
	delete(w.acts, key)
}
