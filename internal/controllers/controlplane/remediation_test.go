package controlplane

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// TestRemediationPolicy checks seed 000's rules the control plane applies
// before the planner sees a mark: one remediation at a time, maxRetry
// counted along a chain of replacements, retryPeriod, and minHealthyPeriod
// starting a new chain.
func TestRemediationPolicy(t *testing.T) {
	now := t0.Add(time.Hour)
	replacement := func(retries int, remediatedAgo time.Duration) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m-new", Annotations: map[string]string{
			RemediationForAnnotation: remediationData{Machine: "m-old", Timestamp: metav1.NewTime(now.Add(-remediatedAgo)), RetryCount: retries}.String()}}}
		return m
	}
	for _, tc := range []struct {
		name       string
		spec       controlplanev1.RemediationSpec
		inProgress string
		machine    *clusterv1.Machine
		wantRetry  int
		wantWhy    string // "" means allowed
		wantQueued bool
	}{
		{name: "first remediation", machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m-1"}}},
		{name: "another remediation unfinished", inProgress: "m-2", machine: &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m-1"}},
			wantWhy: "waiting for the remediation of machine m-2 to finish", wantQueued: true},
		{name: "its own remediation continues", inProgress: "m-new", machine: replacement(5, time.Minute), spec: controlplanev1.RemediationSpec{MaxRetry: ptr.To[int32](1)}},
		{name: "a replacement failing: a retry", machine: replacement(0, time.Minute), spec: controlplanev1.RemediationSpec{MaxRetry: ptr.To[int32](1)}, wantRetry: 1},
		{name: "retries used up", machine: replacement(1, time.Minute), spec: controlplanev1.RemediationSpec{MaxRetry: ptr.To[int32](1)},
			wantWhy: "remediation.maxRetry (1) is used up"},
		{name: "no limit", machine: replacement(7, time.Minute), wantRetry: 8},
		{name: "retry period running", machine: replacement(0, time.Minute), spec: controlplanev1.RemediationSpec{RetryPeriodSeconds: ptr.To[int32](300)},
			wantWhy: "waiting 4m0s for remediation.retryPeriodSeconds"},
		{name: "healthy past minHealthyPeriod: a new chain", machine: replacement(1, 2*time.Hour), spec: controlplanev1.RemediationSpec{MaxRetry: ptr.To[int32](1)}},
		{name: "a shorter minHealthyPeriod", machine: replacement(1, 10*time.Minute),
			spec: controlplanev1.RemediationSpec{MaxRetry: ptr.To[int32](1), MinHealthyPeriodSeconds: ptr.To[int32](300)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := &controlplanev1.QuorumControlPlane{Spec: controlplanev1.QuorumControlPlaneSpec{QuorumControlPlaneConfig: controlplanev1.QuorumControlPlaneConfig{Remediation: tc.spec}}}
			if tc.inProgress != "" {
				cp.Annotations = map[string]string{RemediationInProgressAnnotation: remediationData{Machine: tc.inProgress, Timestamp: metav1.NewTime(now), RetryCount: 5}.String()}
			}
			next, why, queued := newRemediationPolicy(cp, now).verdict(tc.machine)
			if (why == "") != (tc.wantWhy == "") || !strings.Contains(why, tc.wantWhy) || queued != tc.wantQueued {
				t.Fatalf("verdict %q (queued %v), want %q (queued %v)", why, queued, tc.wantWhy, tc.wantQueued)
			}
			if why == "" && tc.inProgress == "" && (next.Machine != tc.machine.Name || next.RetryCount != tc.wantRetry) {
				t.Errorf("records %+v, want machine %s with %d retries", next, tc.machine.Name, tc.wantRetry)
			}
		})
	}
}

// TestHealthCheckNeverAsksForMoreThanEtcdTolerates: the trigger allows
// (n-1)/2 unhealthy machines, none for a single machine; with external
// etcd, all but one.
func TestHealthCheckNeverAsksForMoreThanEtcdTolerates(t *testing.T) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c"}}
	external := controlplanev1.EtcdSpec{ClusterRef: &controlplanev1.LocalObjectReference{Name: "e"}}
	for _, tc := range []struct {
		replicas int32
		etcd     controlplanev1.EtcdSpec
		want     int
	}{{1, controlplanev1.EtcdSpec{}, 0}, {3, controlplanev1.EtcdSpec{}, 1}, {5, controlplanev1.EtcdSpec{}, 2}, {7, controlplanev1.EtcdSpec{}, 3},
		{1, external, 0}, {2, external, 1}, {4, external, 3}} {
		replicas, want := tc.replicas, tc.want
		cp := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "cp"}, Spec: controlplanev1.QuorumControlPlaneSpec{Replicas: ptr.To(replicas), QuorumControlPlaneConfig: controlplanev1.QuorumControlPlaneConfig{Etcd: tc.etcd}}}
		spec := healthCheckSpec(cluster, cp, time.Minute)
		if got := spec.Remediation.TriggerIf.UnhealthyLessThanOrEqualTo; got == nil || *got != intstr.FromInt(want) {
			t.Errorf("%d replicas, stacked %v: trigger %v, want at most %d unhealthy", replicas, tc.etcd.IsStacked(), got, want)
		}
		if spec.Remediation.TemplateRef.IsDefined() {
			t.Error("a remediation template is set; the control plane remediates itself")
		}
		if spec.Selector.MatchLabels[clusterv1.MachineControlPlaneNameLabel] != "cp" || spec.ClusterName != "c" {
			t.Errorf("selects %v in cluster %s", spec.Selector.MatchLabels, spec.ClusterName)
		}
	}
}

// TestRemediatingSaysWhatItWaitsFor: each marked machine's line on the
// Remediating condition gives the policy's refusal, or the planner's wait
// (seed 000's scenario 3: another member is unhealthy), or the next step.
func TestRemediatingSaysWhatItWaitsFor(t *testing.T) {
	marked := func(name string) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}
		conditions.Set(m, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse,
			Reason: clusterv1.MachineOwnerRemediatedWaitingForRemediationReason})
		conditions.Set(m, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
			Reason: clusterv1.MachineHealthCheckNodeDeletedReason})
		return m
	}
	wait := quorum.Decision{Kind: quorum.Wait, Reason: "waiting for member m-1 to become healthy (unhealthy since 2026-01-01T00:00:00Z; replaced at 2026-01-01T00:05:00Z) before creating a machine"}
	for _, tc := range []struct {
		name       string
		refused    map[string]string
		d          quorum.Decision
		wantReason string
		wantLine   string
	}{
		{"the planner waits for another member", nil, wait, controlplanev1.RemediatingReason,
			"* Machine m-2: waiting for member m-1 to become healthy"},
		{"the next step", nil, quorum.Decision{Kind: quorum.CreateMachine, Reason: "replacing marked machine m-2"}, controlplanev1.RemediatingReason,
			"* Machine m-2: remediating, next step: replacing marked machine m-2"},
		{"refused by the policy", map[string]string{"m-2": "remediation.maxRetry (1) is used up"}, wait, controlplanev1.RemediationBlockedReason,
			"* Machine m-2: remediation.maxRetry (1) is used up"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := &controlplanev1.QuorumControlPlane{}
			obs := &observation{Observation: engine.Observation{Machines: []*clusterv1.Machine{{ObjectMeta: metav1.ObjectMeta{Name: "m-1"}}, marked("m-2")}}, remediationRefused: tc.refused}
			setRemediating(cp, obs, tc.d)
			c := conditions.Get(cp, controlplanev1.RemediatingCondition)
			if c == nil || c.Status != metav1.ConditionTrue || c.Reason != tc.wantReason || !strings.HasPrefix(c.Message, tc.wantLine) {
				t.Fatalf("Remediating %+v, want %s with %q", c, tc.wantReason, tc.wantLine)
			}
			if strings.Contains(c.Message, "m-1:") {
				t.Errorf("the unmarked machine has a line: %q", c.Message)
			}
		})
	}
}

// TestUnhealthyTimeoutObeysRemediationPolicy: a voter unhealthy past
// UnhealthyTimeout is removed and its machine replaced with no health
// check's mark, so the policy judges it as a mark: it waits its turn, it
// counts against maxRetry, and when allowed its first step records the
// remediation in progress.
func TestUnhealthyTimeoutObeysRemediationPolicy(t *testing.T) {
	now := t0.Add(time.Hour)
	for _, tc := range []struct {
		name        string
		downFor     time.Duration
		inProgress  string
		retriesUsed bool
		// reportAge, when set, is the age of m-1's Node's report that its
		// etcd answers there.
		reportAge    time.Duration
		wantJudged   bool
		wantHeld     bool
		wantQueued   bool
		wantRemovals bool
	}{
		{name: "due and allowed", downFor: 10 * time.Minute, wantJudged: true, wantRemovals: true},
		{name: "not due yet", downFor: time.Minute},
		{name: "another remediation unfinished", downFor: 10 * time.Minute, inProgress: "m-9", wantJudged: true, wantHeld: true, wantQueued: true},
		{name: "maxRetry used up", downFor: 10 * time.Minute, retriesUsed: true, wantJudged: true, wantHeld: true},
		// Issue 37: QCP cannot reach m-1, but m-1 says its etcd answers
		// there: not remediated for being unhealthy.
		{name: "due, but its machine says it answers", downFor: 10 * time.Minute, reportAge: 5 * time.Second},
		{name: "due, its machine's word stale", downFor: 10 * time.Minute, reportAge: 2 * time.Minute, wantJudged: true, wantRemovals: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := &controlplanev1.QuorumControlPlane{Spec: controlplanev1.QuorumControlPlaneSpec{Replicas: ptr.To[int32](3),
				QuorumControlPlaneConfig: controlplanev1.QuorumControlPlaneConfig{Remediation: controlplanev1.RemediationSpec{MaxRetry: ptr.To[int32](1)}}}}
			if tc.inProgress != "" {
				cp.Annotations = map[string]string{RemediationInProgressAnnotation: remediationData{Machine: tc.inProgress, Timestamp: metav1.NewTime(now)}.String()}
			}
			down := memberMachine("m-1", 1)
			if tc.retriesUsed {
				down.Annotations[RemediationForAnnotation] = remediationData{Machine: "m-0", Timestamp: metav1.NewTime(now.Add(-time.Minute)), RetryCount: 1}.String()
			}
			obs := &observation{
				Observation: engine.Observation{Machines: []*clusterv1.Machine{down, memberMachine("m-2", 2), memberMachine("m-3", 3)}, Members: []quorum.Member{
					{ID: 1, Name: "m-1", PeerURL: "https://127.20.0.7:2380", UnhealthySince: now.Add(-tc.downFor)},
					{ID: 2, Name: "m-2", PeerURL: "https://127.20.0.8:2380", Healthy: true, Leader: true},
					{ID: 3, Name: "m-3", PeerURL: "https://127.20.0.9:2380", Healthy: true},
				}},
				remediation: newRemediationPolicy(cp, now),
			}
			if tc.reportAge != 0 {
				obs.nodes = map[string]*corev1.Node{"m-1": healthyNodeAt(now.Add(-tc.reportAge))}
			}
			obs.build(cp, &clusterv1.Cluster{}, now, quorum.Tunables{})
			pm := obs.State.Machines[0]
			if pm.EtcdAnswersOnMachine != (tc.reportAge > 0 && tc.reportAge <= machineReportFresh) {
				t.Errorf("m-1's machine says its etcd answers: %v, with a report %s old", pm.EtcdAnswersOnMachine, tc.reportAge)
			}
			if pm.Remediate || pm.HoldRemediation != tc.wantHeld || pm.RemediationQueued != tc.wantQueued {
				t.Errorf("m-1 remediate %v, held %v, queued %v; want held %v, queued %v", pm.Remediate, pm.HoldRemediation, pm.RemediationQueued, tc.wantHeld, tc.wantQueued)
			}
			if _, next := obs.remediationNext["m-1"]; next != (tc.wantJudged && !tc.wantHeld) || obs.remediating(down) != tc.wantJudged {
				t.Errorf("m-1 allowed %v, judged %v; want judged %v, held %v", next, obs.remediating(down), tc.wantJudged, tc.wantHeld)
			}
			d := quorum.Plan(obs.State)
			if removes := d.Kind == quorum.RemoveMember && d.MemberID == 1; removes != tc.wantRemovals {
				t.Errorf("plan %s, want removing m-1's member: %v", d, tc.wantRemovals)
			}
		})
	}
}

// TestNoSpaceHoldsMarks: under NOSPACE nothing can be written to the
// workload cluster, Node health included, so a health check's mark on a
// machine whose member is healthy is held, and the Remediating condition says why;
// a member down itself past the timeout is still judged by the policy, and
// removed. The compaction record and the maintenance policy reach the
// planner.
func TestNoSpaceHoldsMarks(t *testing.T) {
	now := t0.Add(time.Hour)
	marked := memberMachine("m-2", 2)
	conditions.Set(marked, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse,
		Reason: clusterv1.MachineOwnerRemediatedWaitingForRemediationReason})
	conditions.Set(marked, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionFalse,
		Reason: clusterv1.MachineHealthCheckNodeDeletedReason})
	for _, tc := range []struct {
		name        string
		downFor     time.Duration
		wantRemoval bool
	}{
		{name: "every member healthy: the mark is held"},
		{name: "a member down past the timeout is removed", downFor: 10 * time.Minute, wantRemoval: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := &controlplanev1.QuorumControlPlane{Spec: controlplanev1.QuorumControlPlaneSpec{Replicas: ptr.To[int32](3)}}
			cp.Spec.Etcd.Stacked.Maintenance.CompactionRetentionRevisions = ptr.To[int64](20)
			cp.Annotations = map[string]string{engine.CompactedAnnotation: engine.FormatCompaction(3000, now.Add(-time.Minute))}
			members := []quorum.Member{
				{ID: 1, Name: "m-1", Healthy: true, Leader: true},
				{ID: 2, Name: "m-2", Healthy: true},
				{ID: 3, Name: "m-3", Healthy: true},
			}
			if tc.downFor > 0 {
				members[2].Healthy, members[2].UnhealthySince = false, now.Add(-tc.downFor)
			}
			for i := range members {
				members[i].Alarms, members[i].Revision = []string{"NOSPACE"}, 3100
			}
			obs := &observation{
				Observation: engine.Observation{Machines: []*clusterv1.Machine{memberMachine("m-1", 1), marked, memberMachine("m-3", 3)}, Members: members},
				remediation: newRemediationPolicy(cp, now),
			}
			obs.build(cp, &clusterv1.Cluster{}, now, quorum.Tunables{})
			if s := obs.State; s.CompactedRevision != 3000 || !s.CompactedAt.Equal(now.Add(-time.Minute)) || s.Tunables.CompactionRetention != 20 {
				t.Errorf("the planner sees compaction %d at %s, retention %d; want 3000, a minute ago, 20", s.CompactedRevision, s.CompactedAt, s.Tunables.CompactionRetention)
			}
			if pm := obs.State.Machines[1]; pm.Remediate || !pm.HoldRemediation {
				t.Errorf("marked m-2: remediate %v, held %v; want held", pm.Remediate, pm.HoldRemediation)
			}
			d := quorum.Plan(obs.State)
			if removes := d.Kind == quorum.RemoveMember; removes != tc.wantRemoval || (removes && d.MemberID != 3) {
				t.Errorf("plan %s; want a removal of m-3's member: %v", d, tc.wantRemoval)
			}
			setRemediating(cp, obs, d)
			if msg := conditions.GetMessage(cp, controlplanev1.RemediatingCondition); !strings.Contains(msg, "* Machine m-2: held while etcd's NOSPACE alarm is raised") {
				t.Errorf("Remediating says %q", msg)
			}
		})
	}
}

// memberMachine is an observed machine whose member has ID id.
func memberMachine(name string, id uint64) *clusterv1.Machine {
	m := observedMachine(name)
	m.Annotations[engine.MemberIDAnnotation] = engine.FormatMemberID(id)
	return m
}
