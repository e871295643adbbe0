package controlplane

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestWakeups: a round learns from the later of the previous round and the
// last watch event for its control plane, and only for its own.
func TestWakeups(t *testing.T) {
	now := t0
	w := newWakeups(func() time.Time { return now })
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	toA := w.mapped(func(context.Context, client.Object) []ctrl.Request { return []ctrl.Request{{NamespacedName: a}} })

	if got := w.round(a, t0); !got.IsZero() {
		t.Errorf("first round learned at %s; want nothing before it", got)
	}
	now = t0.Add(300 * time.Millisecond)
	toA(context.Background(), nil)
	if got := w.round(a, t0.Add(time.Second)); !got.Equal(now) {
		t.Errorf("round after an event learned at %s; want the event's arrival %s", got, now)
	}
	if got := w.round(a, t0.Add(2*time.Second)); !got.Equal(t0.Add(time.Second)) {
		t.Errorf("round without an event learned at %s; want the previous round %s", got, t0.Add(time.Second))
	}
	if got := w.round(b, t0.Add(2*time.Second)); !got.IsZero() {
		t.Errorf("another control plane learned from a's event at %s", got)
	}
	w.forget(a)
	if got := w.round(a, t0.Add(3*time.Second)); !got.IsZero() {
		t.Errorf("a forgotten control plane learned at %s", got)
	}
}
