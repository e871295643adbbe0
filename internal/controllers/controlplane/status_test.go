package controlplane

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

var t0 = time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC)

// twoMachineObservation: cp-1 hosts the leader (recorded ID a1); cp-2 hosts
// a learner added just before a crash, known only by its peer URL.
func twoMachineObservation() *observation {
	m1, m2 := observedMachine("cp-1"), observedMachine("cp-2")
	m2.Status.Addresses[1].Address = "127.20.0.8"
	delete(m2.Annotations, engine.MemberIDAnnotation)
	delete(m2.Annotations, quorum.HookAnnotation)
	obs := &observation{
		Observation: engine.Observation{
			Machines: []*clusterv1.Machine{m1, m2},
			Members: []quorum.Member{
				{ID: 0xa1, Name: "cp-1", PeerURL: "https://127.20.0.7:2380", Healthy: true, Leader: true, Revision: 40},
				{ID: 0xb2, PeerURL: "https://127.20.0.8:2380", Learner: true, Revision: 12},
			},
		},
		nodes: map[string]*corev1.Node{
			"cp-1": healthyNode(corev1.NodeCondition{Type: "SchedulerHealthy", Status: corev1.ConditionFalse, Message: "kube-scheduler is not running"}),
		},
		initialized: true,
	}
	return obs
}

func TestMemberStatuses(t *testing.T) {
	got := engine.MemberStatuses(&twoMachineObservation().Observation)
	want := []controlplanev1.EtcdMemberStatus{
		// A voter's revision changes with every write: it is left out.
		{ID: "a1", Name: "cp-1", Machine: "cp-1", Role: controlplanev1.EtcdMemberRoleLeader, Healthy: true},
		{ID: "b2", Machine: "cp-2", Role: controlplanev1.EtcdMemberRoleLearner, Revision: 12},
	}
	if len(got) != len(want) {
		t.Fatalf("members %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("member %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	obs := twoMachineObservation()
	obs.MembersErr = errors.New("no member answered")
	if got := engine.MemberStatuses(&obs.Observation); got != nil {
		t.Errorf("members %+v with an unreadable list; want none rather than a guess", got)
	}
}

// TestKeepRecords: a learner added just before a crash is found by its peer
// URL and recorded on its machine, as is when QCP first saw it; a member
// going down is recorded, and the record goes when it is back.
func TestKeepRecords(t *testing.T) {
	obs := twoMachineObservation()
	m2 := obs.Machines[1].DeepCopy()
	keepRecords(m2, obs, t0)
	if r := engine.ReadRecords(m2); r.MemberID != 0xb2 || !r.LearnerAdded.Equal(t0) {
		t.Errorf("records %+v: want member b2 and learner added at %s", r, t0)
	}
	if _, ok := m2.Annotations[engine.UnhealthySinceAnnotation]; !ok {
		t.Errorf("an unstarted learner is not healthy; want its unhealthy-since recorded")
	}

	obs.Members[1].Healthy, obs.Members[1].Name = true, "cp-2"
	keepRecords(m2, obs, t0.Add(time.Minute))
	if _, ok := m2.Annotations[engine.UnhealthySinceAnnotation]; ok {
		t.Errorf("the learner is healthy again; want its unhealthy-since record gone")
	}
	if r := engine.ReadRecords(m2); !r.LearnerAdded.Equal(t0) {
		t.Errorf("learner added %s, want the first record %s kept", r.LearnerAdded, t0)
	}

	obs.MembersErr = errors.New("no member answered")
	m1 := obs.Machines[0].DeepCopy()
	delete(m1.Annotations, engine.MemberIDAnnotation)
	keepRecords(m1, obs, t0)
	if _, ok := m1.Annotations[engine.MemberIDAnnotation]; ok {
		t.Errorf("a member ID was recorded from an unreadable member list")
	}
}

// TestComponentsHealthyNamesMachineAndComponent: a failing preflight check
// names the machine and the component.
func TestComponentsHealthyNamesMachineAndComponent(t *testing.T) {
	cp := &controlplanev1.QuorumControlPlane{}
	setComponentsHealthy(cp, twoMachineObservation())
	c := conditions.Get(cp, controlplanev1.ControlPlaneComponentsHealthyCondition)
	if c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("condition %+v, want False", c)
	}
	for _, want := range []string{"Machine cp-1: kube-scheduler: kube-scheduler is not running", "Machine cp-1: kube-controller-manager not reported yet", "Machine cp-2: no Node yet"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q does not say %q", c.Message, want)
		}
	}
}

// TestScalingNamesTheWait: while scaling waits, the condition says for what.
func TestScalingNamesTheWait(t *testing.T) {
	cp := &controlplanev1.QuorumControlPlane{Spec: controlplanev1.QuorumControlPlaneSpec{Replicas: ptr.To[int32](3)}}
	d := quorum.Decision{Kind: quorum.Wait, Reason: "waiting for learner cp-2 to start"}
	engine.SetScaling(cp, &twoMachineObservation().Observation, int(ptr.Deref(cp.Spec.Replicas, 1)), d)
	up := conditions.Get(cp, controlplanev1.ScalingUpCondition)
	if up.Status != metav1.ConditionTrue || !strings.Contains(up.Message, "from 2 to 3") || !strings.Contains(up.Message, d.Reason) {
		t.Errorf("ScalingUp %+v; want True, from 2 to 3, naming the wait", up)
	}
	if down := conditions.Get(cp, controlplanev1.ScalingDownCondition); down.Status != metav1.ConditionFalse {
		t.Errorf("ScalingDown %+v; want False", down)
	}
}

// TestRecordDecisionKeepsWaitStart: a repeated wait keeps its start time, so
// lastOperation says since when; a new decision starts again.
func TestRecordDecisionKeepsWaitStart(t *testing.T) {
	cp := &controlplanev1.QuorumControlPlane{}
	wait := quorum.Decision{Kind: quorum.Wait, Reason: "waiting for machine cp-2 to be provisioned"}
	engine.RecordDecision(&cp.Status.LastOperation, wait, t0)
	engine.RecordDecision(&cp.Status.LastOperation, wait, t0.Add(time.Minute))
	if got := cp.Status.LastOperation; !got.StartTime.Time.Equal(t0) || got.Kind != controlplanev1.OperationWait {
		t.Errorf("lastOperation %+v, want the wait since %s", got, t0)
	}
	degraded := quorum.Decision{Kind: quorum.Degraded, Reason: "2 of 3 voters down"}
	engine.RecordDecision(&cp.Status.LastOperation, degraded, t0.Add(2*time.Minute))
	if got := cp.Status.LastOperation; !got.StartTime.Time.Equal(t0.Add(2*time.Minute)) || got.Reason != degraded.Reason {
		t.Errorf("lastOperation %+v, want the new decision", got)
	}
}

// TestAvailableFromTheMemberList: etcd that served the linearizable member
// list has quorum, even when every status request timed out; etcd whose
// list could not be read does not count as available.
func TestAvailableFromTheMemberList(t *testing.T) {
	cp := &controlplanev1.QuorumControlPlane{}
	obs := &observation{initialized: true, Observation: engine.Observation{
		Members: []quorum.Member{{ID: 1, Name: "a"}, {ID: 2, Name: "b"}, {ID: 3, Name: "c"}}}}
	setAvailable(cp, obs)
	if c := conditions.Get(cp, controlplanev1.AvailableCondition); c == nil || c.Status != metav1.ConditionTrue ||
		!strings.Contains(c.Message, "only 0 of 3 voters answered") {
		t.Errorf("Available with the list served and no status answered: %+v, want True naming the 0 of 3", c)
	}
	obs.Members, obs.MembersErr = nil, errors.New("listing etcd members: context deadline exceeded")
	setAvailable(cp, obs)
	if c := conditions.Get(cp, controlplanev1.AvailableCondition); c == nil || c.Status != metav1.ConditionFalse ||
		!strings.Contains(c.Message, "etcd membership cannot be read") {
		t.Errorf("Available with the list unreadable: %+v, want False", c)
	}
}

// TestStatusVersions: machines counted per version, oldest first by
// semantic version (v1.9 before v1.10), as CAPI's topology controller reads
// them.
func TestStatusVersions(t *testing.T) {
	machine := func(v string) *clusterv1.Machine { return &clusterv1.Machine{Spec: clusterv1.MachineSpec{Version: v}} }
	got := statusVersions([]*clusterv1.Machine{machine("v1.36.3"), machine("v1.9.0"), machine("v1.36.3"), machine("v1.10.2"), machine("")})
	want := []clusterv1.StatusVersion{{Version: "v1.9.0", Replicas: 1}, {Version: "v1.10.2", Replicas: 1}, {Version: "v1.36.3", Replicas: 2}}
	if !slices.Equal(got, want) {
		t.Errorf("statusVersions = %v; want %v", got, want)
	}
	if got := statusVersions(nil); got != nil {
		t.Errorf("statusVersions(nil) = %v; want none, so that CAPI reads the control plane as provisioning", got)
	}
}
