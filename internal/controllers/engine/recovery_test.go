package engine

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/quorum"
)

func TestConfirmedLost(t *testing.T) {
	infra := func(status metav1.ConditionStatus, reason string) *clusterv1.Machine {
		m := &clusterv1.Machine{}
		conditions.Set(m, metav1.Condition{Type: clusterv1.MachineInfrastructureReadyCondition, Status: status, Reason: reason})
		return m
	}
	for _, tc := range []struct {
		name string
		m    *clusterv1.Machine
		want bool
	}{
		{"running", infra(metav1.ConditionTrue, "Running"), false},
		{"not ready for another reason (frozen, starting)", infra(metav1.ConditionFalse, "WaitingForBootstrapData"), false},
		{"no condition yet", &clusterv1.Machine{}, false},
		{"the process provider's agent exited", infra(metav1.ConditionFalse, "AgentExited"), true},
		{"its infrastructure object deleted", infra(metav1.ConditionFalse, clusterv1.MachineInfrastructureDeletedReason), true},
		{"a user's mark", &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{quorum.ConfirmedLostAnnotation: ""}}}, true},
	} {
		if got := ConfirmedLost(tc.m); got != tc.want {
			t.Errorf("%s: ConfirmedLost = %v, want %v", tc.name, got, tc.want)
		}
		if got := PlannerMachine(tc.m, true).ConfirmedLost; got != tc.want {
			t.Errorf("%s: the planner's machine has ConfirmedLost = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPlannerRecovery(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	cp := &controlplanev1.QuorumControlPlane{}
	if got := PlannerRecovery(cp, nil); got.Policy != quorum.RecoverManually || got.Triggered || got.After != 5*time.Minute || !got.LostSince.IsZero() {
		t.Errorf("no policy: %+v, want Manual, after 5m, nothing recorded", got)
	}
	SetRecord(cp, QuorumLostSinceAnnotation, FormatTime(at))
	SetRecord(cp, controlplanev1.RecoverAnnotation, controlplanev1.RecoverFromSurvivorValue)
	got := PlannerRecovery(cp, &controlplanev1.QuorumLossRecovery{Policy: controlplanev1.RecoveryFromSurvivor, AfterSeconds: ptr.To[int32](30)})
	if got.Policy != quorum.RecoverFromSurvivor || !got.Triggered || got.After != 30*time.Second || !got.LostSince.Equal(at) {
		t.Errorf("FromSurvivor, 30 s, triggered, lost at %s: %+v", at, got)
	}
	SetRecord(cp, controlplanev1.RecoverAnnotation, controlplanev1.RecoverFromBackupValue)
	if got := PlannerRecovery(cp, &controlplanev1.QuorumLossRecovery{Policy: controlplanev1.RecoveryFromBackup}); got.Policy != quorum.RecoverFromBackup || !got.Triggered || !got.TriggerBackup || got.Restoring {
		t.Errorf("FromBackup, triggered from a backup: %+v", got)
	}
	SetRecord(cp, controlplanev1.RecoverAnnotation, "elsewhere")
	if PlannerRecovery(cp, nil).Triggered {
		t.Error("a trigger asking for a source there is not counts as a trigger")
	}
	SetRecord(cp, RecoveryAnnotation, `{"snapshot":"ns/x.db","lostMachines":["m-1"],"revision":7}`)
	if got := PlannerRecovery(cp, nil); !got.Restoring || !slices.Equal(got.LostMachines, []string{"m-1"}) {
		t.Errorf("an open recovery from a backup: %+v, want restoring, lost machine m-1", got)
	}
	SetRecord(cp, RecoveryAnnotation, `{"snapshot":"ns/x.db","lostMachines":["m-1"],"finishTime":"2026-12-01T10:00:00Z"}`)
	if got := PlannerRecovery(cp, nil); got.Restoring {
		t.Errorf("a finished recovery from a backup: %+v, want none open", got)
	}
}

// TestRecoveredMachines: after a finished recovery, etcd is not asked
// through a machine created before it began other than its survivor; while
// none finished, through every machine.
func TestRecoveredMachines(t *testing.T) {
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	machine := func(name string, created time.Time) *clusterv1.Machine {
		return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}}
	}
	machines := []*clusterv1.Machine{machine("kept", start.Add(-time.Hour)), machine("lagging", start.Add(-time.Hour)),
		machine("lost", start.Add(-time.Minute)), machine("grown", start.Add(time.Minute))}
	names := func(ms []*clusterv1.Machine) (out []string) {
		for _, m := range ms {
			out = append(out, m.Name)
		}
		return out
	}
	owner := &controlplanev1.QuorumControlPlane{}
	if got := names(RecoveredMachines(owner, machines)); len(got) != 4 {
		t.Errorf("no recovery: %v, want every machine", got)
	}
	SetRecord(owner, RecoveryAnnotation, `{"machine":"kept","startTime":"2026-12-01T10:00:00Z"}`)
	if got := names(RecoveredMachines(owner, machines)); len(got) != 4 {
		t.Errorf("a recovery not finished: %v, want every machine", got)
	}
	SetRecord(owner, RecoveryAnnotation, `{"machine":"kept","startTime":"2026-12-01T10:00:00Z","finishTime":"2026-12-01T10:00:20Z"}`)
	if got := names(RecoveredMachines(owner, machines)); !slices.Equal(got, []string{"kept", "grown"}) {
		t.Errorf("a finished recovery from kept: %v, want kept and the machine created since", got)
	}
	if len(machines) != 4 || machines[1].Name != "lagging" {
		t.Errorf("the caller's machines changed: %v", names(machines))
	}

	// Nor through a machine confirmed lost: its infrastructure reports it
	// gone, or a user says so.
	conditions.Set(machines[3], metav1.Condition{Type: clusterv1.MachineInfrastructureReadyCondition, Status: metav1.ConditionFalse, Reason: "AgentExited"})
	if got := names(AskedMachines(owner, machines)); !slices.Equal(got, []string{"kept"}) {
		t.Errorf("grown confirmed lost: %v, want kept alone", got)
	}
	fresh := &controlplanev1.QuorumControlPlane{}
	metav1.SetMetaDataAnnotation(&machines[0].ObjectMeta, quorum.ConfirmedLostAnnotation, "")
	if got := names(AskedMachines(fresh, machines)); !slices.Equal(got, []string{"lagging", "lost"}) {
		t.Errorf("no recovery, kept and grown confirmed lost: %v, want lagging and lost", got)
	}
	if len(machines) != 4 || machines[0].Name != "kept" || machines[3].Name != "grown" {
		t.Errorf("the caller's machines changed: %v", names(machines))
	}
}
