package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestDepartedAlarmIsObservedAndDisarmed is issue 28's controller hole 2
// on a real 3-member etcd cluster. A member raises NOSPACE and CORRUPT and
// is then removed, as QCP removes an alarmed member before replacing it.
// etcd keeps both alarms, still refusing writes, and the observation must
// keep them too: as departed alarms naming the member, shown in
// EtcdClusterHealthy, while the members that remain carry none. The
// executor's DisarmAlarm then clears the NOSPACE in etcd itself, and the
// CORRUPT, which only a person may disarm, stays observed.
func TestDepartedAlarmIsObservedAndDisarmed(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "departed", 3)
	list, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var gone etcd.Member
	var stay []*testkit.EtcdProcess
	for _, p := range ps {
		i := slices.IndexFunc(list, func(m etcd.Member) bool { return m.Name == p.Name })
		if gone.ID == 0 {
			gone = list[i]
			continue
		}
		stay = append(stay, p)
	}
	for _, typ := range []etcdserverpb.AlarmType{etcdserverpb.AlarmType_NOSPACE, etcdserverpb.AlarmType_CORRUPT} {
		if err := testkit.RaiseAlarm(ctx, cli, gone.ID, typ); err != nil {
			t.Fatal(err)
		}
	}
	// etcd refuses a removal for its first seconds ("unhealthy cluster"),
	// until the members have been connected long enough.
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "the alarmed member removed", func(ctx context.Context) error {
		return cli.Remove(ctx, gone.ID)
	}); err != nil {
		t.Fatal(err)
	}

	// What the owner's machines are now: the removed member's machine is
	// gone, as it is once QCP has replaced it.
	var machines []*clusterv1.Machine
	for _, p := range stay {
		machines = append(machines, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: p.Name},
			Status: clusterv1.MachineStatus{Addresses: []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: p.IP.String()}}}})
	}
	pool := etcd.NewPool()
	t.Cleanup(func() { _ = pool.Close() })
	observe := func(ctx context.Context) (*Observation, error) {
		obs := &Observation{Machines: machines}
		obs.Etcd, obs.Members, obs.DepartedAlarms, obs.MembersErr = ObserveEtcd(ctx, pool, "departed", cl.CA, nil, 0, &controlplanev1.QuorumControlPlane{}, machines)
		obs.State.QuotaBackendBytes = DefaultQuotaBackendBytes
		if obs.MembersErr != nil {
			return nil, obs.MembersErr
		}
		if len(obs.Members) != len(stay) {
			return nil, fmt.Errorf("%d members listed, want %d", len(obs.Members), len(stay))
		}
		return obs, nil
	}
	var obs *Observation
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "the removal observed, with every member's status", func(ctx context.Context) (err error) {
		if obs, err = observe(ctx); err != nil {
			return err
		}
		for _, mb := range obs.Members {
			if !mb.Healthy {
				return fmt.Errorf("member %x not healthy", mb.ID)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, mb := range obs.Members {
		if mb.DBSize <= 0 {
			t.Errorf("member %x's DB size %d: the planner needs each member's, from its status", mb.ID, mb.DBSize)
		}
	}
	want := []quorum.Alarm{{MemberID: gone.ID, Type: "NOSPACE"}, {MemberID: gone.ID, Type: "CORRUPT"}}
	if !sameAlarms(obs.DepartedAlarms, want) {
		t.Fatalf("departed alarms %v, want %v: etcd keeps a removed member's alarms", obs.DepartedAlarms, want)
	}
	for _, mb := range obs.Members {
		if len(mb.Alarms) > 0 {
			t.Errorf("member %x carries alarms %v it never raised", mb.ID, mb.Alarms)
		}
	}
	cp := &controlplanev1.QuorumControlPlane{}
	SetEtcdHealthy(cp, obs, quorum.Decision{})
	msg := conditions.GetMessage(cp, controlplanev1.EtcdClusterHealthyCondition)
	for _, typ := range []string{"NOSPACE", "CORRUPT"} {
		if !conditions.IsFalse(cp, controlplanev1.EtcdClusterHealthyCondition) || !strings.Contains(msg, FormatMemberID(gone.ID)+", since removed, raised "+typ) {
			t.Errorf("EtcdClusterHealthy %v does not name %x's %s", conditions.Get(cp, controlplanev1.EtcdClusterHealthyCondition), gone.ID, typ)
		}
	}

	x := Executor{Etcd: obs.Etcd, Now: time.Now}
	disarm := quorum.Decision{Kind: quorum.DisarmAlarm, MemberID: gone.ID, Alarm: "NOSPACE"}
	if err := x.Execute(ctx, disarm, nil); err != nil {
		t.Fatalf("%s: %v", disarm, err)
	}
	alarms, err := cli.Alarms(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []etcd.Alarm{{MemberID: gone.ID, Type: "CORRUPT"}}; !slices.Equal(alarms, want) {
		t.Fatalf("etcd's alarms after disarming NOSPACE: %v, want %v", alarms, want)
	}
	// A retry after a lost reply finds nothing to disarm, and succeeds.
	if err := x.Execute(ctx, disarm, nil); err != nil {
		t.Fatalf("%s again: %v", disarm, err)
	}
	if obs, err = observe(ctx); err != nil {
		t.Fatal(err)
	}
	if want := want[1:]; !sameAlarms(obs.DepartedAlarms, want) {
		t.Fatalf("departed alarms after the disarm %v, want %v", obs.DepartedAlarms, want)
	}
}

func sameAlarms(got, want []quorum.Alarm) bool {
	key := func(a, b quorum.Alarm) int { return strings.Compare(a.Type, b.Type) }
	return slices.Equal(slices.SortedFunc(slices.Values(got), key), slices.SortedFunc(slices.Values(want), key))
}

// A departed member's alarm must turn EtcdClusterHealthy false even when
// every listed member is healthy, and say who raised it, what it does and
// who clears it.
func TestEtcdHealthyNamesDepartedAlarms(t *testing.T) {
	obs := &Observation{
		Members: []quorum.Member{{ID: 1, Name: "a", Healthy: true, Leader: true}, {ID: 2, Name: "b", Healthy: true}},
		State:   quorum.State{QuotaBackendBytes: DefaultQuotaBackendBytes},
	}
	cp := &controlplanev1.QuorumControlPlane{}
	SetEtcdHealthy(cp, obs, quorum.Decision{})
	if !conditions.IsTrue(cp, controlplanev1.EtcdClusterHealthyCondition) {
		t.Fatalf("healthy members, no alarm: %v", conditions.Get(cp, controlplanev1.EtcdClusterHealthyCondition))
	}
	obs.DepartedAlarms = []quorum.Alarm{{MemberID: 0x8e9e05c52164694d, Type: "CORRUPT"}, {MemberID: 0x91bc3c398fb3c146, Type: "NOSPACE"}}
	SetEtcdHealthy(cp, obs, quorum.Decision{})
	c := conditions.Get(cp, controlplanev1.EtcdClusterHealthyCondition)
	if c.Status != metav1.ConditionFalse || c.Reason != controlplanev1.EtcdClusterNotHealthyReason {
		t.Fatalf("EtcdClusterHealthy with departed alarms: %v", c)
	}
	for _, want := range []string{
		"* Member 8e9e05c52164694d, since removed, raised CORRUPT; ",
		"etcdctl alarm disarm",
		"* Member 91bc3c398fb3c146, since removed, raised NOSPACE; etcd refuses writes",
		"below the backend quota (2147483648 bytes)",
	} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("EtcdClusterHealthy message %q lacks %q", c.Message, want)
		}
	}
}

func TestQuotaBackendBytes(t *testing.T) {
	quota := int64(8589934592)
	legacy := func(v string) []controlplanev1.Arg {
		return []controlplanev1.Arg{{Name: "log-level", Value: "warn"}, {Name: "quota-backend-bytes", Value: v}}
	}
	for _, tc := range []struct {
		name  string
		field *int64
		args  []controlplanev1.Arg
		want  int64
	}{
		{"unset: etcd's default", nil, nil, 2147483648},
		{"the field", &quota, nil, 8589934592},
		{"the field wins over a stored flag", &quota, legacy("1073741824"), 8589934592},
		{"a stored object's flag, which its members run with", nil, legacy("1073741824"), 1073741824},
		{"a stored flag of 0 is etcd's default", nil, legacy("0"), 2147483648},
		{"a stored negative flag turns the quota off", nil, legacy("-1"), math.MaxInt64},
	} {
		if got := QuotaBackendBytes(tc.field, tc.args); got != tc.want {
			t.Errorf("%s: QuotaBackendBytes = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestObserveEtcdWithoutLostMachines: on a real 3-member cluster with one
// member killed and its machine confirmed lost, etcd is asked only through
// the other two (AskedMachines), and the lost machine's records still reach
// its member: since when it has been unhealthy is what replaces it after
// the timeout. (Reading the records from the asked machines alone, as
// 76b2cf3 did, left the member unhealthy since "now" forever, and it was
// never replaced.)
func TestObserveEtcdWithoutLostMachines(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "lostrecords", 3)
	list, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Hour).Truncate(time.Second)
	var machines []*clusterv1.Machine
	var lost *clusterv1.Machine
	var lostID uint64
	for _, p := range ps {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: p.Name},
			Status: clusterv1.MachineStatus{Addresses: []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: p.IP.String()}}}}
		i := slices.IndexFunc(list, func(mb etcd.Member) bool { return mb.Name == p.Name })
		SetRecord(m, MemberIDAnnotation, FormatMemberID(list[i].ID))
		if lost == nil {
			lost, lostID = m, list[i].ID
			if err := p.Kill(); err != nil {
				t.Fatal(err)
			}
			SetRecord(m, UnhealthySinceAnnotation, FormatTime(since))
			conditions.Set(m, metav1.Condition{Type: clusterv1.MachineInfrastructureReadyCondition, Status: metav1.ConditionFalse, Reason: "AgentExited"})
		}
		machines = append(machines, m)
	}
	owner := &controlplanev1.QuorumControlPlane{}
	asked := AskedMachines(owner, machines)
	if slices.Contains(asked, lost) || len(asked) != 2 {
		t.Fatalf("asked %d machines, the lost one among them: %v", len(asked), slices.Contains(asked, lost))
	}
	pool := etcd.NewPool()
	t.Cleanup(func() { _ = pool.Close() })
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "the lost member observed down, since its record", func(ctx context.Context) error {
		_, members, _, err := ObserveEtcd(ctx, pool, "lostrecords", cl.CA, nil, 0, owner, machines)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(members, func(mb quorum.Member) bool { return mb.ID == lostID })
		switch {
		case i < 0:
			return fmt.Errorf("member %x not listed", lostID)
		case members[i].Healthy:
			return fmt.Errorf("member %x healthy", lostID)
		case !members[i].UnhealthySince.Equal(since):
			return fmt.Errorf("member %x unhealthy since %v, want its machine's record %v", lostID, members[i].UnhealthySince, since)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A member that does not answer QCP while its machine says it answers
// there (issue 37) is named as such, not as merely unhealthy: QCP may be
// cut off from its machine.
func TestEtcdHealthyNamesAMemberCutOffFromQCP(t *testing.T) {
	machines := []*clusterv1.Machine{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Annotations: map[string]string{MemberIDAnnotation: FormatMemberID(1)}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Annotations: map[string]string{MemberIDAnnotation: FormatMemberID(2)}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{MemberIDAnnotation: FormatMemberID(3)}}},
	}
	obs := &Observation{
		Machines: machines,
		Members: []quorum.Member{{ID: 1, Name: "a", Healthy: true, Leader: true, PeerURL: "https://a:2380"},
			{ID: 2, Name: "b", PeerURL: "https://b:2380"}, {ID: 3, Name: "c", PeerURL: "https://c:2380"}},
		State: quorum.State{Machines: []quorum.Machine{{Name: "a", EtcdAnswersOnMachine: true}, {Name: "b", EtcdAnswersOnMachine: true}, {Name: "c"}}},
	}
	cp := &controlplanev1.QuorumControlPlane{}
	SetEtcdHealthy(cp, obs, quorum.Decision{})
	msg := conditions.GetMessage(cp, controlplanev1.EtcdClusterHealthyCondition)
	for _, want := range []string{
		"* Member 2 (machine b): does not answer QCP, but its machine says it answers there (is QCP cut off from the machine?)",
		"* Member 3 (machine c): not healthy",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("EtcdClusterHealthy's message %q does not say %q", msg, want)
		}
	}
}
