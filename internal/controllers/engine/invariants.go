package engine

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qcp-dev/qcp/internal/quorum"
)

// takenStep is a step an owner took, with the observation it was planned
// on, until the owner's next readable observation judges it.
type takenStep struct {
	before quorum.State
	d      quorum.Decision
}

// invariantChecks judges, at run time, every step the Stepper takes
// against the safety invariants (quorum.Check), as test/engine's driver
// judges each of its steps: before is the observation the step was
// planned on, after the owner's next one whose member list could be read.
// What the check finds is counted (<prefix>_invariant_violations_total),
// logged and raised as a Warning event (InvariantViolated): a violation is
// a bug in QCP, and the tests fail on any.
type invariantChecks struct {
	mu    sync.Mutex
	taken map[types.NamespacedName]takenStep
}

// took remembers that owner took d, planned on before. A step still
// waiting for its after (the member list was unreadable since, as while
// quorum is lost) is judged on its own observation first.
func (s *Stepper) took(ctx context.Context, owner client.Object, before quorum.State, d quorum.Decision) {
	key := client.ObjectKeyFromObject(owner)
	s.checks.mu.Lock()
	prev, waiting := s.checks.taken[key]
	if s.checks.taken == nil {
		s.checks.taken = map[types.NamespacedName]takenStep{}
	}
	s.checks.taken[key] = takenStep{before: before, d: d}
	s.checks.mu.Unlock()
	if waiting {
		s.judge(ctx, owner, prev, prev.before)
	}
}

// CheckTaken judges owner's last step, if one waits, against after, a new
// observation of owner: at once when after's member list was read (or the
// owner runs no etcd), else on the next such observation. A step whose
// after cannot be told from other changes (the desired size changed since,
// or a recovery replaced the cluster) is judged on its own observation.
func (s *Stepper) CheckTaken(ctx context.Context, owner client.Object, after quorum.State) {
	key := client.ObjectKeyFromObject(owner)
	s.checks.mu.Lock()
	t, ok := s.checks.taken[key]
	if ok && after.MembersUnknown && after.Topology != quorum.APIServersOnly {
		ok = false // not yet
	} else {
		delete(s.checks.taken, key)
	}
	s.checks.mu.Unlock()
	if !ok {
		return
	}
	switch t.d.Kind {
	case quorum.Recover, quorum.RestoreFromBackup:
		after = t.before
	default:
		if after.Desired != t.before.Desired {
			after = t.before
		}
	}
	s.judge(ctx, owner, t, after)
}

// judge checks t against after and reports what it breaks.
func (s *Stepper) judge(ctx context.Context, owner client.Object, t takenStep, after quorum.State) {
	err := quorum.Check(t.before, t.d, after)
	if err == nil || (s.MeasuringWithoutLeaderTransfer && quorum.OnlyI6(err)) {
		return
	}
	log.FromContext(ctx).Error(err, "A step QCP took broke a safety invariant; please report it", "decision", t.d.Kind, "machine", t.d.Machine)
	s.Recorder.Eventf(owner, corev1.EventTypeWarning, "InvariantViolated", "%v", err)
	s.Metrics.invariantViolated(owner)
}
