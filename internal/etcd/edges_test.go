package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestMembershipEdgesAgainstRealEtcd covers what the planner relies on when
// members misbehave: leadership cannot move to a learner, a dead member
// neither stalls Statuses nor hides the live ones, and member-list agreement
// fails while a member cannot answer.
func TestMembershipEdgesAgainstRealEtcd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "edges", 3)

	t.Run("members agree on the member list", func(t *testing.T) {
		var a etcd.Agreement
		if err := testkit.Eventually(ctx, 200*time.Millisecond, "every member to answer the same list", func(ctx context.Context) error {
			var err error
			if a, err = cli.MemberListAgreement(ctx); err != nil {
				return err
			}
			if !a.Agree() || len(a.Views) != 3 {
				return fmt.Errorf("views %v, errors %v", a.Views, a.Errors)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for id, view := range a.Views {
			if len(view) != 3 {
				t.Errorf("member %x lists %v, want 3 voters", id, view)
			}
		}
	})

	newcomer, err := cl.NewMember("edges-learner")
	if err != nil {
		t.Fatal(err)
	}
	var learner etcd.Member
	if err := retry(ctx, "learner added", func(ctx context.Context) (err error) {
		learner, _, err = cli.AddLearner(ctx, newcomer.PeerURL())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := newcomer.Start(testkit.InitialCluster(append(ps, newcomer)...), "existing"); err != nil {
		t.Fatal(err)
	}
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "the learner to answer", func(ctx context.Context) error {
		s, err := cli.Status(ctx, newcomer.ClientURL())
		if err == nil && !s.IsLearner {
			t.Fatalf("member %s reports itself a voter", newcomer.Name)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}

	t.Run("voters agree while a learner is joining", func(t *testing.T) {
		// A learner serves no member list; the preflight "every member
		// reports the same list" must still pass on the voters' views.
		if err := testkit.Eventually(ctx, 200*time.Millisecond, "the voters to agree with a learner present", func(ctx context.Context) error {
			a, err := cli.MemberListAgreement(ctx)
			if err != nil {
				return err
			}
			if !a.Agree() || len(a.Views) != 3 {
				return fmt.Errorf("views %v, errors %v", a.Views, a.Errors)
			}
			for id, view := range a.Views {
				if !slices.Contains(view, fmt.Sprintf("%xL", learner.ID)) {
					return fmt.Errorf("voter %x lists %v, without learner %x", id, view, learner.ID)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("leadership does not move to a learner", func(t *testing.T) {
		before, err := cli.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := cli.MoveLeader(ctx, learner.ID); err == nil {
			t.Fatal("leadership moved to a learner")
		}
		after, err := cli.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after.ID != before.ID {
			t.Errorf("leader changed from %x to %x on a refused transfer", before.ID, after.ID)
		}
	})

	t.Run("a dead member is reported, not waited for", func(t *testing.T) {
		members, err := cli.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		dead := ps[2]
		if err := dead.Kill(); err != nil {
			t.Fatal(err)
		}
		var deadID uint64
		for _, m := range members {
			if m.Name == dead.Name {
				deadID = m.ID
			}
		}
		start := time.Now()
		ok, failed := cli.Statuses(ctx, members)
		// Each probe is bounded by StatusTimeout and they run in parallel;
		// the margin is for a loaded machine, far below a stalled client's
		// minutes of retries.
		if took := time.Since(start); took > 10*etcd.StatusTimeout {
			t.Errorf("Statuses took %s with one member dead", took)
		}
		if _, found := failed[deadID]; !found || len(failed) != 1 {
			t.Errorf("failed = %v, want only the dead member %x", failed, deadID)
		}
		if len(ok) != 3 {
			t.Errorf("statuses of %d members, want the 3 live ones: %v", len(ok), ok)
		}
		// MemberListAgreement asks the voters in parallel, each within
		// StatusTimeout: the dead member is reported, not waited for.
		start = time.Now()
		a, err := cli.MemberListAgreement(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 10*etcd.StatusTimeout {
			t.Errorf("MemberListAgreement took %s with one member dead", took)
		}
		if a.Agree() || a.Errors[deadID] == nil {
			t.Errorf("agreement with a dead member: agree %v, errors %v", a.Agree(), a.Errors)
		}
		if !a.Consistent() || len(a.Views) != 2 {
			t.Errorf("the two live members' views %v: want both, consistent", a.Views)
		}
	})
}

// TestAgreementNeedsTheSameListAndRoles checks Agree on member lists that
// differ the ways a lagging member's can: one member missing, or a member
// that is still a learner in one view and a voter in another.
func TestAgreementNeedsTheSameListAndRoles(t *testing.T) {
	view := func(ids ...string) []string { return ids }
	cases := []struct {
		name  string
		views map[uint64][]string
		want  bool
	}{
		{"same", map[uint64][]string{1: view("1", "2", "3L"), 2: view("1", "2", "3L")}, true},
		{"a member missing", map[uint64][]string{1: view("1", "2", "3L"), 2: view("1", "2")}, false},
		{"a learner promoted in one view", map[uint64][]string{1: view("1", "2", "3L"), 2: view("1", "2", "3")}, false},
	}
	for _, tc := range cases {
		if got := (etcd.Agreement{Views: tc.views}).Agree(); got != tc.want {
			t.Errorf("%s: Agree() = %v, want %v", tc.name, got, tc.want)
		}
	}
	errs := etcd.Agreement{Views: map[uint64][]string{1: view("1")}, Errors: map[uint64]error{2: errors.New("unreachable")}}
	if errs.Agree() {
		t.Error("agreement while a member could not answer")
	}
	if !errs.Consistent() {
		t.Error("a member that could not answer made the others inconsistent")
	}
	for _, tc := range cases {
		if got := (etcd.Agreement{Views: tc.views, Errors: errs.Errors}).Consistent(); got != tc.want {
			t.Errorf("%s with a member down: Consistent() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPoolForgetClosesTheClient checks that Forget closes the cached client
// and that the next Get builds a working one from the new configuration.
func TestPoolForgetClosesTheClient(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := testkit.NewEtcdCluster(t, "forget")
	ps, err := cl.Bootstrap(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	pool := etcd.NewPool()
	defer func() { _ = pool.Close() }()
	old, err := pool.Get("c1", cl.Config(ps[0].ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Raw().Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := pool.Forget("c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Raw().Get(ctx, "k"); err == nil {
		t.Error("the forgotten client still serves requests: it was not closed")
	}
	fresh, err := pool.Get("c1", cl.Config(ps[0].ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	if fresh == old {
		t.Fatal("Get after Forget returned the forgotten client")
	}
	resp, err := fresh.Raw().Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Errorf("the new client reads %v, %v", resp, err)
	}
	if err := pool.Forget("never-added"); err != nil {
		t.Errorf("forgetting an unknown cluster: %v", err)
	}
}

// TestRemoveThroughTheRemovedMember: a client whose only endpoint is the
// member being removed still removes it and reports success. Sent to that
// member, the request is applied and then answered "server stopped"; Remove
// sends it to the leader and, after an error, lets the member list decide.
func TestRemoveThroughTheRemovedMember(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "remove-self", 3)
	var leader etcd.MemberStatus
	if err := retry(ctx, "a leader", func(ctx context.Context) (err error) {
		leader, err = cli.Leader(ctx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	members, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(members, func(m etcd.Member) bool { return m.ID != leader.ID })
	victim := members[i]
	p := ps[slices.IndexFunc(ps, func(p *testkit.EtcdProcess) bool { return p.PeerURL() == victim.PeerURLs[0] })]
	self := cl.NewClient(p)
	// etcd refuses membership changes for a few seconds after it starts
	// ("unhealthy cluster"); only such a refusal is tried again.
	err = testkit.Eventually(ctx, 200*time.Millisecond, "the removal accepted", func(ctx context.Context) error {
		err := self.Remove(ctx, victim.ID)
		if err != nil && !etcd.IsRefused(err) {
			t.Fatalf("removing member %x through itself: %v", victim.ID, err)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(after, func(m etcd.Member) bool { return m.ID == victim.ID }) {
		t.Errorf("member %x is still listed: %v", victim.ID, after)
	}
}

// TestFrozenMemberHoldsNoRequest freezes a member (SIGSTOP: its connections
// stay open and nothing answers, as with a hung host, #8465, or a member
// cut off from the manager alone). Every membership read the control plane
// makes must still return within its bound, whichever member the client
// picks, instead of hanging the reconcile that made it, and the member
// list, which the other two can serve, must succeed.
func TestFrozenMemberHoldsNoRequest(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, ps, cli := testkit.StartEtcdCluster(ctx, t, "frozen", 3)
	if err := retry(ctx, "a leader", func(ctx context.Context) error { _, err := cli.Leader(ctx); return err }); err != nil {
		t.Fatal(err)
	}
	if err := ps[2].Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps[2].Thaw() })
	// Enough rounds that the client's round robin sends some to the
	// frozen member.
	bound := etcd.MembershipTimeout + etcd.StatusTimeout + time.Second
	// within fails the test if op has not returned after bound, rather
	// than hanging the test with it.
	within := func(what string, op func() error) {
		t.Helper()
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- op() }()
		select {
		case err := <-done:
			t.Logf("%s: %v (%s)", what, err, time.Since(start).Round(time.Millisecond))
		case <-time.After(bound):
			t.Fatalf("%s still waiting after %s with a member frozen", what, bound)
		}
	}
	// A health check of the frozen member fails within the bound: the
	// preflight of a control plane on external etcd runs it.
	within("health of the frozen member", func() error {
		if err := cli.Health(context.Background(), ps[2].ClientURL()); err == nil {
			t.Error("the frozen member passes its health check")
		}
		return nil
	})
	for i := range 12 {
		// And, read from the two that answer, it succeeds: a member the
		// manager cannot reach must not blank the control plane's status.
		within(fmt.Sprintf("member list %d", i), func() error {
			_, err := cli.Members(context.Background())
			if err != nil {
				t.Errorf("member list %d with one member of three frozen: %v", i, err)
			}
			return err
		})
		if i >= 6 {
			continue
		}
		within(fmt.Sprintf("member list agreement %d", i), func() error {
			_, err := cli.MemberListAgreement(context.Background())
			return err
		})
	}
}

// TestStoppingMemberAnswerIsAskedElsewhere: a member just removed answers
// "raft: stopped" until its process ends, and the client's endpoints still
// hold it. A request that member answers so is asked of the other members
// (as one a learner refused is), instead of failing the observation that
// made it: an EtcdCluster scaled down reported "Cannot observe etcd" for a
// round when its alarm list reached the removed member. The refusal is
// injected for the balanced client; the other members are real.
func TestStoppingMemberAnswerIsAskedElsewhere(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _, cli := testkit.StartEtcdCluster(ctx, t, "stopping", 3)
	for _, stopping := range []error{
		status.Error(codes.Unknown, "raft: stopped"), status.Error(codes.Unavailable, "etcdserver: server stopped"),
	} {
		asked := 0
		err := cli.OnVoter(func(c *clientv3.Client) error {
			asked++
			if c == cli.Balanced() {
				return stopping
			}
			_, err := c.AlarmList(ctx)
			return err
		})
		if err != nil || asked < 2 {
			t.Errorf("after %q: %v, asked %d clients; want the alarm list from another member", stopping, err, asked)
		}
	}
	// Anything else is the answer, not asked again.
	final := status.Error(codes.PermissionDenied, "etcdserver: permission denied")
	asked := 0
	if err := cli.OnVoter(func(*clientv3.Client) error { asked++; return final }); !errors.Is(err, final) || asked != 1 {
		t.Errorf("a final error: %v after %d asks; want it after 1", err, asked)
	}
}

// TestMembershipReadsWaitForALeader: the membership reads refuse a member without
// a leader (so that a member cut off from its peers does not hold them),
// yet a read made while no member has one goes on asking until a leader
// is elected within its bound, even after the client's own retries of
// that refusal (about 2.5 s) are spent, as on a loaded host's slow
// election.
func TestMembershipReadsWaitForALeader(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, ps, _ := testkit.StartEtcdCluster(ctx, t, "leaderless", 3)
	survivor := cl.NewClient(ps[0])
	for _, p := range ps[1:] {
		if err := p.Freeze(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Thaw() })
	}
	if err := testkit.Eventually(ctx, 100*time.Millisecond, "the survivor without a leader", func(ctx context.Context) error {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		st, err := survivor.Status(sctx, ps[0].ClientURL())
		if err == nil && st.Leader != 0 {
			err = fmt.Errorf("it follows %x", st.Leader)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The alarm list, read the same way as the member list, takes the
	// caller's bound (the member list has a 5-s one of its own, which a
	// slow host's election after the thaw could outlast).
	thawAfter := 4 * time.Second
	time.AfterFunc(thawAfter, func() {
		for _, p := range ps[1:] {
			_ = p.Thaw()
		}
	})
	start := time.Now()
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	if _, err := survivor.Alarms(rctx); err != nil {
		t.Fatalf("reading the alarms through a leaderless member while the others were frozen for %v: %v after %v; want an answer once a leader is elected",
			thawAfter, err, time.Since(start).Round(time.Millisecond))
	}
	if took := time.Since(start); took < thawAfter {
		t.Errorf("the read answered after %v, before the others were thawed at %v: a leaderless member served it", took, thawAfter)
	}
}
