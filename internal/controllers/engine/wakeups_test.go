package engine

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

var t0 = time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC)

// TestWakeups: a round learns from the later of the end of the previous
// look and the last watch event for its control plane, and only for its own.
func TestWakeups(t *testing.T) {
	now := t0
	w := NewWakeups(func() time.Time { return now })
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	toA := w.Mapped(func(context.Context, client.Object) []ctrl.Request { return []ctrl.Request{{NamespacedName: a}} })

	if got := w.Learned(a); !got.IsZero() {
		t.Errorf("learned at %s before anything happened", got)
	}
	w.Looked(a, t0)
	now = t0.Add(300 * time.Millisecond)
	toA(context.Background(), nil)
	if got := w.Learned(a); !got.Equal(now) {
		t.Errorf("learned at %s after an event; want the event's arrival %s", got, now)
	}
	w.Looked(a, t0.Add(time.Second))
	if got := w.Learned(a); !got.Equal(t0.Add(time.Second)) {
		t.Errorf("learned at %s; want the end of the last look %s", got, t0.Add(time.Second))
	}
	if got := w.Learned(b); !got.IsZero() {
		t.Errorf("another control plane learned from a's event and look, at %s", got)
	}
	w.Forget(a)
	if got := w.Learned(a); !got.IsZero() {
		t.Errorf("a forgotten control plane learned at %s", got)
	}
}

// TestPollAfter: right after a step a round looks again at FastPoll; the
// longer the in-flight change takes, the longer the wait between looks, a
// tenth of the time since the step, up to SlowPoll; a new step starts
// over. A control plane this process never stepped waits SlowPoll.
func TestPollAfter(t *testing.T) {
	now := t0
	w := NewWakeups(func() time.Time { return now })
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	if got := w.PollAfter(a); got != SlowPoll {
		t.Errorf("before any step: %s, want %s", got, SlowPoll)
	}
	w.Acted(a)
	for _, c := range []struct {
		since time.Duration
		want  time.Duration
	}{
		{0, FastPoll},
		{time.Second, FastPoll},
		{5 * time.Second, 500 * time.Millisecond},
		{12 * time.Second, 1200 * time.Millisecond},
		{time.Minute, SlowPoll},
	} {
		now = t0.Add(c.since)
		if got := w.PollAfter(a); got != c.want {
			t.Errorf("%s after a step: %s, want %s", c.since, got, c.want)
		}
	}
	if got := w.PollAfter(b); got != SlowPoll {
		t.Errorf("another control plane: %s, want %s", got, SlowPoll)
	}
	w.Acted(a)
	if got := w.PollAfter(a); got != FastPoll {
		t.Errorf("right after a new step: %s, want %s", got, FastPoll)
	}
	w.Forget(a)
	if got := w.PollAfter(a); got != SlowPoll {
		t.Errorf("forgotten: %s, want %s", got, SlowPoll)
	}
}
