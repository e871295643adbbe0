package agent

import (
	"errors"
	"testing"
	"time"
)

// TestProbeFailureThreshold: a component that has answered since it
// started is reported failing only after failureThreshold failed probes in
// a row; one that has not answered since its last start is reported at its
// first failure; a passing probe starts the count again.
func TestProbeFailureThreshold(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	slow := errors.New("context deadline exceeded")
	var pr Probe

	// Never answered: failing at once.
	if pr = pr.next(slow, at(1), t0); pr.OK || pr.Failures != 1 {
		t.Fatalf("first probe failed before any passed: %+v; want not OK, 1 failure", pr)
	}
	pr = pr.next(nil, at(2), t0)
	if !pr.OK || pr.Failures != 0 || !pr.Passed.Equal(at(2)) {
		t.Fatalf("a passing probe: %+v; want OK, no failures, passed at %v", pr, at(2))
	}
	// Answered since its start: failures below the threshold keep it OK,
	// with the error and the count shown.
	for i := 1; i < failureThreshold; i++ {
		if pr = pr.next(slow, at(2+i), t0); !pr.OK || pr.Failures != i || pr.Error != slow.Error() {
			t.Fatalf("failure %d of %d after a pass: %+v; want OK with the error and %d failures", i, failureThreshold, pr, i)
		}
	}
	if pr = pr.next(slow, at(10), t0); pr.OK || pr.Failures != failureThreshold {
		t.Fatalf("failure %d in a row: %+v; want not OK", failureThreshold, pr)
	}
	if pr = pr.next(slow, at(11), t0); pr.OK || pr.Failures != failureThreshold+1 {
		t.Fatalf("failure past the threshold: %+v; want not OK", pr)
	}
	// A pass starts the count again.
	if pr = pr.next(nil, at(12), t0); !pr.OK || pr.Failures != 0 {
		t.Fatalf("a pass after failures: %+v; want OK, no failures", pr)
	}
	if pr = pr.next(slow, at(13), t0); !pr.OK {
		t.Fatalf("one failure after a pass: %+v; want OK", pr)
	}
	// Restarted after its last pass: its first failure counts at once, so
	// that a wait for a restarted component to answer is not misled.
	if pr = pr.next(nil, at(14), t0).next(slow, at(16), at(15)); pr.OK {
		t.Fatalf("a failure of a component restarted after its last pass: %+v; want not OK", pr)
	}
}
