package engine

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// Stepper takes the planner's steps for the owners of one controller.
type Stepper struct {
	Client     client.Client
	Recorder   record.EventRecorder
	Metrics    *Metrics
	Failpoints Failpoints
	Now        func() time.Time
	// MeasuringWithoutLeaderTransfer: the planner skips leadership
	// transfers on purpose (a measurement), so the I6 violations that
	// causes are not reported.
	MeasuringWithoutLeaderTransfer bool

	checks invariantChecks
}

// Step is one planned decision for an owner, with what taking it needs
// from the owner's controller.
type Step struct {
	Owner client.Object
	// LastOperation is the owner's status.lastOperation.
	LastOperation *controlplanev1.LastOperation
	Decision      quorum.Decision
	// Planned is the observation Decision was planned on, against which,
	// and the owner's next readable observation, the step is judged
	// (CheckTaken).
	Planned quorum.State
	// Learned is when the controller last learned something about the
	// owner before this round; the step's reaction latency counts from it,
	// or from the end of the previous step if that is later.
	Learned time.Time
	// Observe looks at the owner again, for the check against a fresh
	// observation.
	Observe func(context.Context) (*Observation, error)
	// CreateMachine carries out CreateMachine on the fresh observation.
	CreateMachine func(context.Context, *Observation) error
	// Starting, if set, is called once the step has passed its check, just
	// before it is taken. What it records must be written by then, not left
	// to the owner's deferred status patch, which a crash right after the
	// step never runs; an error drops the step.
	Starting func(context.Context, *Observation) error
}

// Take verifies the step against a fresh observation and takes it. It
// reports whether a step was taken, and whether it was dropped because the
// owner changed since the plan (the caller then plans again soon). Wait and
// Degraded are not steps: they are only logged.
func (s *Stepper) Take(ctx context.Context, st Step) (acted, replan bool, err error) {
	d := st.Decision
	logger := log.FromContext(ctx).WithValues("decision", d.Kind, "machine", d.Machine)
	if d.Kind == quorum.Wait || d.Kind == quorum.Degraded {
		logger.V(1).Info(d.Reason)
		return false, false, nil
	}
	fresh, err := st.Observe(ctx)
	if err != nil {
		return false, false, err
	}
	if err := d.Verify(fresh.State); err != nil {
		logger.Info("Not taking the planned step: the etcd cluster or its machines changed since the plan; planning again", "why", err.Error())
		return false, true, nil
	}
	trigger := st.Learned
	if f := st.LastOperation.FinishTime.Time; f.After(trigger) {
		trigger = f
	}
	if st.Starting != nil {
		if err := st.Starting(ctx, fresh); err != nil {
			return false, false, fmt.Errorf("before taking step %s: %w", d, err)
		}
	}
	startedAt := s.Now()
	StartOperation(st.LastOperation, d, startedAt)
	logger.Info("Taking step", "reason", d.Reason, "reactionLatency", startedAt.Sub(trigger).String())
	if d.Kind == quorum.CreateMachine {
		err = st.CreateMachine(ctx, fresh)
	} else {
		err = Executor{Client: s.Client, Etcd: fresh.Etcd, AgentTLS: fresh.AgentTLS, EtcdClientPair: fresh.EtcdClientPair, Authority: fresh.Authority, AuthorityKind: fresh.AuthorityKind, Owner: st.Owner, Now: s.Now, Failpoints: s.Failpoints, Backup: fresh.Backup, Metrics: s.Metrics, State: fresh.State, Restore: fresh.Restore}.Execute(ctx, d, fresh.Machine(d.Machine))
	}
	var learnerAdded time.Time
	if m := fresh.Machine(d.Machine); m != nil {
		learnerAdded = ReadRecords(m).LearnerAdded
	}
	s.Metrics.ObserveDecision(st.Owner, d, err, trigger, startedAt, s.Now(), learnerAdded)
	if err != nil {
		s.Recorder.Eventf(st.Owner, corev1.EventTypeWarning, "StepFailed", "%s: %v", d, err)
		return false, false, fmt.Errorf("taking step %s: %w", d, err)
	}
	st.LastOperation.FinishTime = metav1.NewTime(s.Now())
	s.took(ctx, st.Owner, st.Planned, d)
	s.Recorder.Event(st.Owner, corev1.EventTypeNormal, string(d.Kind), d.String())
	if d.Kind == quorum.Recover { // a recovery from a backup is announced when it finishes
		if rec := ReadRecovery(st.Owner); rec != nil {
			RecordRecoveryEvent(s.Recorder, st.Owner, rec)
		}
	}
	return true, false, nil
}
