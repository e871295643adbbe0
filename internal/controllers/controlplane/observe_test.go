package controlplane

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

func observedMachine(name string) *clusterv1.Machine {
	return &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "7", CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)),
			Annotations: map[string]string{quorum.HookAnnotation: "", engine.MemberIDAnnotation: "a1"}},
		Spec: clusterv1.MachineSpec{FailureDomain: "fd-b"},
		Status: clusterv1.MachineStatus{Addresses: clusterv1.MachineAddresses{
			{Type: clusterv1.MachineHostName, Address: name}, {Type: clusterv1.MachineInternalIP, Address: "127.20.0.7"}}},
	}
}

func healthyNode(conds ...corev1.NodeCondition) *corev1.Node {
	all := []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
		{Type: "EtcdHealthy", Status: corev1.ConditionTrue}, {Type: "APIServerHealthy", Status: corev1.ConditionTrue}}
	return &corev1.Node{Status: corev1.NodeStatus{Conditions: append(all, conds...)}}
}

// healthyNodeAt is healthyNode with every condition's heartbeat at at.
func healthyNodeAt(at time.Time) *corev1.Node {
	n := healthyNode()
	for i := range n.Status.Conditions {
		n.Status.Conditions[i].LastHeartbeatTime = metav1.NewTime(at)
	}
	return n
}

// TestEtcdAnswersOnMachine: a machine's word that its etcd answers there
// counts while its Node is Ready and the agent's EtcdHealthy condition is
// True and fresh (issue 37).
func TestEtcdAnswersOnMachine(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	notReady := healthyNodeAt(now)
	notReady.Status.Conditions[0].Status = corev1.ConditionUnknown
	etcdDown := healthyNodeAt(now)
	etcdDown.Status.Conditions[1].Status = corev1.ConditionFalse
	kubeadm := healthyNodeAt(now)
	kubeadm.Status.Conditions = kubeadm.Status.Conditions[:1]
	for _, tc := range []struct {
		name string
		node *corev1.Node
		want bool
	}{
		{"fresh", healthyNodeAt(now.Add(-machineReportFresh)), true},
		{"stale: the agent stopped reporting", healthyNodeAt(now.Add(-machineReportFresh - time.Second)), false},
		{"Node not Ready", notReady, false},
		{"etcd fails its probe there", etcdDown, false},
		{"no agent condition (a kubeadm machine)", kubeadm, false},
		{"no Node", nil, false},
	} {
		if got := etcdAnswersOnMachine(tc.node, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPlannerMachine(t *testing.T) {
	m := plannerMachine(observedMachine("cp-1"), healthyNode(), true)
	want := quorum.Machine{Name: "cp-1", FailureDomain: "fd-b", PeerURL: "https://127.20.0.7:2380", UpToDate: true,
		CreatedAt: time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC), ResourceVersion: "7", HasHook: true, NodeReady: true,
		ComponentsHealthy: true, MemberID: 0xa1}
	if m != want {
		t.Fatalf("plannerMachine = %+v\nwant %+v", m, want)
	}

	t.Run("no address yet is provisioning", func(t *testing.T) {
		mc := observedMachine("cp-1")
		mc.Status.Addresses = mc.Status.Addresses[:1]
		if m := plannerMachine(mc, nil, true); m.PeerURL != "" || m.NodeReady || m.ComponentsHealthy {
			t.Errorf("%+v: want no peer URL and nothing healthy", m)
		}
	})
	t.Run("a failing component", func(t *testing.T) {
		node := healthyNode(corev1.NodeCondition{Type: "SchedulerHealthy", Status: corev1.ConditionFalse})
		if m := plannerMachine(observedMachine("cp-1"), node, true); !m.NodeReady || m.ComponentsHealthy {
			t.Errorf("%+v: want the node Ready and its components unhealthy", m)
		}
	})
	t.Run("a node the agent has not reported on", func(t *testing.T) {
		node := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
		if m := plannerMachine(observedMachine("cp-1"), node, true); m.ComponentsHealthy {
			t.Error("components counted healthy with no component condition")
		}
	})
	t.Run("deleting, delete-annotated and marked by a health check", func(t *testing.T) {
		mc := observedMachine("cp-1")
		now := metav1.Now()
		mc.DeletionTimestamp = &now
		mc.Annotations[quorum.DeleteAnnotation] = ""
		mc.Status.Conditions = []metav1.Condition{{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse},
			{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionFalse}}
		if m := plannerMachine(mc, healthyNode(), false); !m.Deleting || !m.DeleteAnnotated || !m.Remediate || m.UpToDate {
			t.Errorf("%+v", m)
		}
	})
	// The health check never takes its mark back: a machine that passes it
	// again, or that no health check judges any more, is not remediated.
	for name, health := range map[string][]metav1.Condition{
		"a stale mark: the health check passes again": {{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionTrue}},
		"a stale mark: no health check result":        nil,
	} {
		t.Run(name, func(t *testing.T) {
			mc := observedMachine("cp-1")
			mc.Status.Conditions = append([]metav1.Condition{{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse}}, health...)
			if m := plannerMachine(mc, healthyNode(), true); m.Remediate {
				t.Errorf("a recovered machine counts as marked: %+v", m)
			}
			if !clearStaleMark(mc) || conditions.Has(mc, clusterv1.MachineOwnerRemediatedCondition) {
				t.Errorf("the stale mark was kept: %+v", mc.Status.Conditions)
			}
		})
	}
}

func TestPlannerMembersCarryRecords(t *testing.T) {
	added := time.Date(2026, 11, 23, 0, 1, 0, 0, time.UTC)
	down := added.Add(time.Minute)
	byID := observedMachine("cp-1")
	engine.SetRecord(byID, engine.LearnerAddedAnnotation, engine.FormatTime(added))
	byName := observedMachine("cp-2")
	delete(byName.Annotations, engine.MemberIDAnnotation)
	engine.SetRecord(byName, engine.UnhealthySinceAnnotation, engine.FormatTime(down))
	got := engine.PlannerMembers([]quorum.Member{
		{ID: 0xa1, Name: "cp-1", Learner: true, Healthy: true},
		{ID: 0xb2, Name: "cp-2"},
		{ID: 0xc3, Name: "elsewhere"},
	}, []*clusterv1.Machine{byID, byName})
	if !got[0].AddedAt.Equal(added) || !got[0].UnhealthySince.IsZero() {
		t.Errorf("learner found by member ID: %+v", got[0])
	}
	if !got[1].UnhealthySince.Equal(down) {
		t.Errorf("unhealthy member found by name: %+v", got[1])
	}
	if !got[2].AddedAt.IsZero() || !got[2].UnhealthySince.IsZero() {
		t.Errorf("member on no machine got records: %+v", got[2])
	}
}

// The role label follows the member: set, changed with the leadership,
// kept while the membership cannot be read, and removed with the member.
func TestEtcdRoleLabel(t *testing.T) {
	now := time.Date(2026, 11, 23, 1, 2, 3, 0, time.UTC)
	m := observedMachine("cp-1")
	obs := &observation{Observation: engine.Observation{Members: []quorum.Member{{ID: 0xa1, Name: "cp-1", Learner: true}}}}
	for _, step := range []struct {
		member quorum.Member
		err    error
		want   string
	}{
		{quorum.Member{ID: 0xa1, Name: "cp-1", Learner: true}, nil, "learner"},
		{quorum.Member{ID: 0xa1, Name: "cp-1", Leader: true, Healthy: true}, nil, "leader"},
		{quorum.Member{ID: 0xa1, Name: "cp-1", Healthy: true}, nil, "voter"},
		{quorum.Member{ID: 0xb2, Name: "cp-2"}, errors.New("no quorum"), "voter"},
		{quorum.Member{ID: 0xb2, Name: "cp-2"}, nil, ""},
	} {
		obs.Members, obs.MembersErr = []quorum.Member{step.member}, step.err
		keepRecords(m, obs, now)
		if got := m.Labels[engine.EtcdRoleLabel]; got != step.want {
			t.Errorf("member %+v (read error %v): role label %q, want %q", step.member, step.err, got, step.want)
		}
	}
}

// The planner sees the alarms of members since removed, and the quota etcd
// runs with: the spec's, or etcd's own default when the spec sets none.
func TestBuildCarriesDepartedAlarmsAndQuota(t *testing.T) {
	departed := []quorum.Alarm{{MemberID: 0xc3, Type: "NOSPACE"}}
	cp := &controlplanev1.QuorumControlPlane{}
	obs := &observation{Observation: engine.Observation{Members: []quorum.Member{{ID: 0xa1, Name: "cp-1", Healthy: true}}, DepartedAlarms: departed}}
	obs.build(cp, &clusterv1.Cluster{}, t0, quorum.Tunables{})
	if !slices.Equal(obs.State.DepartedAlarms, departed) || obs.State.QuotaBackendBytes != engine.DefaultQuotaBackendBytes {
		t.Errorf("State: departed alarms %v, quota %d; want %v and etcd's default %d",
			obs.State.DepartedAlarms, obs.State.QuotaBackendBytes, departed, engine.DefaultQuotaBackendBytes)
	}
	quota := int64(4294967296)
	cp.Spec.Etcd.Stacked.QuotaBackendBytes = &quota
	obs.build(cp, &clusterv1.Cluster{}, t0, quorum.Tunables{})
	if obs.State.QuotaBackendBytes != 4294967296 {
		t.Errorf("quota %d, want the spec's 4294967296", obs.State.QuotaBackendBytes)
	}
}

// A restore the planner sees only until etcd has a member: the snapshot
// found, or, once the first machine exists and the snapshot can no longer
// be read, the problem, so that a replacement first machine waits for it.
func TestBuildCarriesTheRestore(t *testing.T) {
	cp := &controlplanev1.QuorumControlPlane{}
	obs := &observation{restoreErr: errors.New("bucket \"b\" does not exist")}
	obs.build(cp, &clusterv1.Cluster{}, t0, quorum.Tunables{})
	if r := obs.State.Restore; !r.Requested || r.Problem != "bucket \"b\" does not exist" {
		t.Errorf("State.Restore %+v; want it requested, with the problem", r)
	}
	if d := quorum.Plan(obs.State); d.Kind != quorum.Wait || !strings.Contains(d.Reason, "does not exist") {
		t.Errorf("the plan is %s; want a wait naming the problem", d)
	}
	obs.Members = []quorum.Member{{ID: 0xa1, Name: "cp-1", Healthy: true}}
	obs.build(cp, &clusterv1.Cluster{}, t0, quorum.Tunables{})
	if r := obs.State.Restore; r.Requested {
		t.Errorf("State.Restore %+v once etcd has a member; want none", r)
	}
}
