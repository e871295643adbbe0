package etcd_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestAlarmIsObservedApartFromHealth raises a NOSPACE alarm on one member
// of a real 3-member cluster. etcd then reports it in every member's status
// errors, but ObserveMembers must attribute it to the raising member only
// and keep every member healthy, so that the planner names the alarm
// instead of declaring lost quorum. Disarming clears it.
func TestAlarmIsObservedApartFromHealth(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, _, cli := testkit.StartEtcdCluster(ctx, t, "alarms", 3)
	list, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raiser := list[1].ID
	if err := testkit.RaiseAlarm(ctx, cli, raiser, etcdserverpb.AlarmType_NOSPACE); err != nil {
		t.Fatal(err)
	}

	// The trap: the raw status of a member that did not raise it lists it.
	other, err := cli.Status(ctx, list[0].ClientURLs[0])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(other.Errors, func(e string) bool { return strings.Contains(e, "NOSPACE") }) {
		t.Fatalf("status errors of %x = %v; expected etcd to repeat the cluster-wide NOSPACE there", list[0].ID, other.Errors)
	}

	var members []quorum.Member
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "every member observed healthy with the alarm", func(ctx context.Context) (err error) {
		members, err = cli.ObserveMembers(ctx)
		if err != nil {
			return err
		}
		for _, m := range members {
			if !m.Healthy {
				return fmt.Errorf("member %x observed unhealthy", m.ID)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		want := []string(nil)
		if m.ID == raiser {
			want = []string{"NOSPACE"}
		}
		if !slices.Equal(m.Alarms, want) {
			t.Errorf("member %x alarms = %v, want %v", m.ID, m.Alarms, want)
		}
	}
	s := quorum.State{Desired: 3, Topology: quorum.External, Members: members, Now: time.Now()}
	for _, m := range members {
		s.Machines = append(s.Machines, quorum.Machine{Name: m.Name, PeerURL: m.PeerURL, UpToDate: true, HasHook: true,
			NodeReady: true, ComponentsHealthy: true, MemberID: m.ID, CreatedAt: s.Now})
	}
	s.Machines = s.Machines[:2] // a machine to replace, so that the alarm blocks a step
	// Raised by hand, the alarm finds every database below its quota (the
	// members report theirs): the recovery's last step is all there is.
	if d := quorum.Plan(s); d.Kind != quorum.DisarmAlarm || d.MemberID != raiser || !strings.Contains(d.Reason, "NOSPACE") {
		t.Fatalf("Plan with a NOSPACE alarm = %s, want the alarm of %x disarmed", d, raiser)
	}

	if _, err := cli.Raw().AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: raiser, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
		t.Fatalf("disarming: %v", err)
	}
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "the alarm cleared", func(ctx context.Context) error {
		members, err := cli.ObserveMembers(ctx)
		if err != nil {
			return err
		}
		for _, m := range members {
			if len(m.Alarms) > 0 {
				return fmt.Errorf("member %x still has alarms %v", m.ID, m.Alarms)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestMemberListProposesNothing shows why the tests' monitor samples
// with the member list and the members' statuses (MembersWith): Observe
// reads the alarm list, which etcd serves as a raft proposal (the log
// grows by one each time), while the monitor's way sees the same members,
// their health and the leader and leaves the log as it was.
func TestMemberListProposesNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, ps, cli := testkit.StartEtcdCluster(ctx, t, "membership", 3)
	endpoint := ps[0].ClientURL()
	index := func() uint64 {
		t.Helper()
		s, err := cli.Status(ctx, endpoint)
		if err != nil {
			t.Fatal(err)
		}
		return s.RaftIndex
	}
	// A cluster just bootstrapped still publishes its members and version.
	last := index()
	if err := testkit.Eventually(ctx, time.Second, "a raft log that stopped growing", func(context.Context) error {
		now := index()
		defer func() { last = now }()
		if now != last {
			return fmt.Errorf("raft index %d, %d a second before", now, last)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	before := index()
	observed, _, err := cli.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after := index(); after <= before {
		t.Fatalf("raft index %d after Observe, %d before: the alarm list read should be a proposal", after, before)
	}

	before = index()
	for range 5 {
		list, err := cli.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		statuses, _ := cli.Statuses(ctx, list)
		members := etcd.MembersWith(list, statuses)
		leaders := 0
		for _, m := range members {
			if !m.Healthy {
				t.Errorf("member %x observed unhealthy", m.ID)
			}
			if m.Leader {
				leaders++
			}
		}
		if len(members) != len(observed) || leaders != 1 {
			t.Errorf("MembersWith: %d members with %d leaders; Observe saw %d members, want one leader", len(members), leaders, len(observed))
		}
	}
	if after := index(); after != before {
		t.Errorf("raft index %d after 5 member lists and statuses, %d before: they proposed something", after, before)
	}
}
