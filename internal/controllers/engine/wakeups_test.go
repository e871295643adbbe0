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
