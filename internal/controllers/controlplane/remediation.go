package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/quorum"
)

const (
	// RemediationForAnnotation is on a machine QCP created to replace one a
	// health check marked: which machine, when its remediation began, and
	// how many retries the chain of replacements has used (as KCP's).
	RemediationForAnnotation = "controlplane.cluster.x-k8s.io/qcp-remediation-for"
	// RemediationInProgressAnnotation is on the control plane from QCP's
	// first step on a marked machine until its replacement is created, so
	// that no other remediation starts meanwhile and the replacement can be
	// told what it replaces.
	RemediationInProgressAnnotation = "controlplane.cluster.x-k8s.io/qcp-remediation-in-progress"
)

// DefaultMinHealthyPeriod is how long a replacement must have run before a
// new failure of it starts a new chain instead of counting as a retry.
const DefaultMinHealthyPeriod = time.Hour

// remediationData is what the two annotations hold.
type remediationData struct {
	Machine    string      `json:"machine"`
	Timestamp  metav1.Time `json:"timestamp"`
	RetryCount int         `json:"retryCount"`
}

func readRemediation(obj metav1.Object, annotation string) (remediationData, bool) {
	raw, ok := obj.GetAnnotations()[annotation]
	if !ok {
		return remediationData{}, false
	}
	var d remediationData
	return d, json.Unmarshal([]byte(raw), &d) == nil
}

func (d remediationData) String() string {
	data, _ := json.Marshal(d) // strings, a time and an int cannot fail
	return string(data)
}

// remediationPolicy decides, for each machine a health check marked,
// whether QCP may remediate it now (seed 000's rules that are not the
// planner's: one remediation at a time, maxRetry, retryPeriod,
// minHealthyPeriod). The planner sees only the allowed marks; quorum,
// provisioning and deleting machines are its own checks.
type remediationPolicy struct {
	inProgress       remediationData
	hasInProgress    bool
	maxRetry         *int32
	retryPeriod      time.Duration
	minHealthyPeriod time.Duration
	now              time.Time
}

func newRemediationPolicy(cp *controlplanev1.QuorumControlPlane, now time.Time) remediationPolicy {
	p := remediationPolicy{
		maxRetry:         cp.Spec.Remediation.MaxRetry,
		retryPeriod:      time.Duration(ptr.Deref(cp.Spec.Remediation.RetryPeriodSeconds, 0)) * time.Second,
		minHealthyPeriod: DefaultMinHealthyPeriod,
		now:              now,
	}
	if s := cp.Spec.Remediation.MinHealthyPeriodSeconds; s != nil {
		p.minHealthyPeriod = time.Duration(*s) * time.Second
	}
	p.inProgress, p.hasInProgress = readRemediation(cp, RemediationInProgressAnnotation)
	return p
}

// verdict returns what remediating m would record, or why it may not be
// remediated now; queued says m only waits for another machine's
// remediation to finish.
func (p remediationPolicy) verdict(m *clusterv1.Machine) (next remediationData, why string, queued bool) {
	next = remediationData{Machine: m.Name, Timestamp: metav1.NewTime(p.now)}
	if p.hasInProgress {
		if p.inProgress.Machine == m.Name {
			return p.inProgress, "", false
		}
		return next, fmt.Sprintf("waiting for the remediation of machine %s to finish: one remediation at a time", p.inProgress.Machine), true
	}
	last, ok := readRemediation(m, RemediationForAnnotation)
	if !ok || p.now.Sub(last.Timestamp.Time) >= p.minHealthyPeriod {
		return next, "", false // not a replacement, or one that ran healthy long enough: a new chain
	}
	if p.maxRetry != nil && int32(last.RetryCount) >= *p.maxRetry {
		return next, fmt.Sprintf("not remediating: machine %s replaced %s, which was remediated at %s, and remediation.maxRetry (%d) is used up; find the cause, then delete the machine by hand",
			m.Name, last.Machine, last.Timestamp.UTC().Format(time.RFC3339), *p.maxRetry), false
	}
	if wait := last.Timestamp.Add(p.retryPeriod).Sub(p.now); wait > 0 {
		return next, fmt.Sprintf("waiting %s for remediation.retryPeriodSeconds to pass since machine %s was remediated", wait.Round(time.Second), last.Machine), false
	}
	next.RetryCount = last.RetryCount + 1
	return next, "", false
}

// marked reports whether a health check asks the owner to remediate m now.
// The MachineHealthCheck sets OwnerRemediated=False and never takes it back
// (the owner must, as KCP does); only HealthCheckSucceeded says whether the
// machine is still unhealthy. A mark alone would remediate a machine that
// recovered while it waited its turn, waited out the retry period, or was
// marked during an outage.
func marked(m *clusterv1.Machine) bool {
	return conditions.IsFalse(m, clusterv1.MachineOwnerRemediatedCondition) && conditions.IsFalse(m, clusterv1.MachineHealthCheckSucceededCondition)
}

// clearStaleMark deletes m's OwnerRemediated=False once the health check no
// longer finds m unhealthy (HealthCheckSucceeded True, or gone with the
// health check), and reports whether it did. A deleting machine keeps it:
// it goes anyway.
func clearStaleMark(m *clusterv1.Machine) bool {
	if !conditions.IsFalse(m, clusterv1.MachineOwnerRemediatedCondition) || marked(m) || !m.DeletionTimestamp.IsZero() {
		return false
	}
	conditions.Delete(m, clusterv1.MachineOwnerRemediatedCondition)
	return true
}

// setOwnerRemediated writes on a marked machine why its remediation waits
// or was refused; an allowed one keeps the health check's message.
func setOwnerRemediated(m *clusterv1.Machine, why string) {
	if !marked(m) || why == "" {
		return
	}
	conditions.Set(m, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse,
		Reason: clusterv1.MachineOwnerRemediatedWaitingForRemediationReason, Message: why})
}

// setRemediating reports on the control plane which machines are marked
// (or hold a voter unhealthy past the timeout), and for each whether QCP
// remediates it or why not.
func setRemediating(cp *controlplanev1.QuorumControlPlane, obs *observation, d quorum.Decision) {
	cond := metav1.Condition{Type: controlplanev1.RemediatingCondition, Status: metav1.ConditionFalse, Reason: controlplanev1.NotRemediatingReason}
	var lines []string
	refused := false
	for _, m := range obs.Machines {
		if !obs.remediating(m) {
			continue
		}
		why := obs.remediationRefused[m.Name]
		switch {
		case why != "":
			refused = true
		case d.Kind == quorum.Wait:
			why = d.Reason // what the step waits for, such as another member's health (seed 000's scenario 3)
		default:
			why = "remediating, next step: " + d.Reason
		}
		lines = append(lines, fmt.Sprintf("* Machine %s: %s", m.Name, why))
	}
	if len(lines) > 0 {
		cond.Status, cond.Reason = metav1.ConditionTrue, controlplanev1.RemediatingReason
		if refused {
			cond.Reason = controlplanev1.RemediationBlockedReason
		}
		cond.Message = strings.Join(lines, "\n")
	}
	conditions.Set(cp, cond)
}

// forgetFinishedRemediation drops the control plane's in-progress record
// once its machine is gone and no replacement is due (the replacement came
// first, as for a marked machine whose member was healthy, or the control
// plane was scaled down meanwhile): it would otherwise hold every later
// remediation back.
func forgetFinishedRemediation(cp *controlplanev1.QuorumControlPlane, obs *observation) {
	d, ok := readRemediation(cp, RemediationInProgressAnnotation)
	if !ok || obs.Machine(d.Machine) != nil {
		return
	}
	kept := 0
	for _, m := range obs.Machines {
		if m.DeletionTimestamp.IsZero() {
			kept++
		}
	}
	if kept >= int(ptr.Deref(cp.Spec.Replicas, 1)) {
		delete(cp.Annotations, RemediationInProgressAnnotation)
	}
}

// recordRemediationStart writes on the control plane that next's
// remediation is in progress, before its first step is taken (as a join is
// recorded before MemberAddAsLearner). Left to the deferred status patch, a
// crash right after the step would lose it, and with it one remediation at
// a time and maxRetry.
func (r *Reconciler) recordRemediationStart(ctx context.Context, cp *controlplanev1.QuorumControlPlane, next remediationData) error {
	value := next.String()
	if cp.Annotations[RemediationInProgressAnnotation] == value {
		return nil
	}
	if err := r.annotateNow(ctx, cp, RemediationInProgressAnnotation, value); err != nil {
		return fmt.Errorf("recording on QuorumControlPlane %s that the remediation of machine %s started: %w", klogRef(cp), next.Machine, err)
	}
	return nil
}
