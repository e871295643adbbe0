package etcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// retry repeats op while etcd answers with a retryable refusal, as every
// caller of membership operations must (etcd refuses adds for 5 s after a
// membership change, and promotions until the learner is in sync).
func retry(ctx context.Context, what string, op func(context.Context) error) error {
	var lastErr error
	err := testkit.Eventually(ctx, 200*time.Millisecond, what, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		lastErr = op(cctx)
		if lastErr != nil && !etcd.IsRetryable(lastErr) {
			return nil // final: stop retrying and report it below
		}
		return lastErr
	})
	if err != nil {
		return err
	}
	return lastErr
}

func TestMembershipLifecycleAgainstRealEtcd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "members", 2)

	// A learner is added (retrying "unhealthy cluster" right after start),
	// starts with --initial-cluster-state existing and is promoted.
	newcomer, err := cl.NewMember("members-new")
	if err != nil {
		t.Fatal(err)
	}
	var added etcd.Member
	var list []etcd.Member
	if err := retry(ctx, "learner added", func(ctx context.Context) (err error) {
		added, list, err = cli.AddLearner(ctx, newcomer.PeerURL())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !added.IsLearner || added.Started() || len(list) != 3 {
		t.Fatalf("added %+v with list %+v; want an unstarted learner in a list of 3", added, list)
	}

	// A second add of the same peer URL is final. etcd derives member IDs
	// from peer URLs and the time, so within the same second it may answer
	// "member ID already exist" before checking the URL; and it checks the
	// leader's connections (unhealthy cluster, retryable) before either, so
	// on a busy host the final answer may come after retries, as it does for
	// every caller. A second learner is retryable (only one learner slot).
	err = retry(ctx, "the duplicate peer URL's final answer", func(ctx context.Context) (err error) {
		_, _, err = cli.AddLearner(ctx, newcomer.PeerURL())
		return err
	})
	if err == nil || etcd.IsRetryable(err) || !(etcd.IsPeerURLExists(err) || strings.Contains(err.Error(), "member ID already exist")) {
		t.Errorf("duplicate peer URL: got %v, want a final Peer URLs already exists", err)
	}
	other, err := cl.NewMember("members-other")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = cli.AddLearner(ctx, other.PeerURL())
	if err == nil || !etcd.IsRetryable(err) {
		t.Errorf("second learner: got %v, want a retryable refusal (too many learners or unhealthy cluster)", err)
	}

	if err := newcomer.Start(testkit.InitialCluster(append(ps, newcomer)...), "existing"); err != nil {
		t.Fatal(err)
	}
	// A learner answers Status but fails linearizable reads, by design.
	if err := testkit.Eventually(ctx, 100*time.Millisecond, "learner status", func(ctx context.Context) error {
		s, err := cli.Status(ctx, newcomer.ClientURL())
		if err == nil && !s.IsLearner {
			return errors.New("status does not report a learner")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	hctx, hcancel := context.WithTimeout(ctx, 2*time.Second)
	if err := cli.Health(hctx, newcomer.ClientURL()); err == nil {
		t.Error("health of a learner succeeded; etcd learners serve no linearizable reads")
	}
	hcancel()

	if err := retry(ctx, "learner promoted", func(ctx context.Context) error { return cli.Promote(ctx, added.ID) }); err != nil {
		t.Fatal(err)
	}
	// Promoting again must count as success ("member not learner").
	if err := cli.Promote(ctx, added.ID); err != nil {
		t.Errorf("second promotion: %v, want success", err)
	}
	if err := testkit.WaitHealthy(ctx, cli, newcomer); err != nil {
		t.Fatal(err)
	}

	// Every member agrees on the list; no alarms.
	if err := testkit.Eventually(ctx, 100*time.Millisecond, "member lists agree", func(ctx context.Context) error {
		a, err := cli.MemberListAgreement(ctx)
		if err != nil {
			return err
		}
		if !a.Agree() || len(a.Views) != 3 {
			return errors.New("member lists differ")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if alarms, err := cli.Alarms(ctx); err != nil || len(alarms) != 0 {
		t.Errorf("alarms = %v, %v; want none", alarms, err)
	}

	// Leadership moves to the newcomer, sent to whichever member leads.
	if err := retry(ctx, "leadership moved", func(ctx context.Context) error { return cli.MoveLeader(ctx, added.ID) }); err != nil {
		t.Fatal(err)
	}
	if err := testkit.Eventually(ctx, 100*time.Millisecond, "newcomer leads", func(ctx context.Context) error {
		l, err := cli.Leader(ctx)
		if err != nil {
			return err
		}
		if l.ID != added.ID {
			return errors.New("leader is still another member")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Remove a follower; a second removal counts as done; the removed
	// member stops itself.
	members, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := members[0]
	if victim.ID == added.ID {
		victim = members[1]
	}
	if err := retry(ctx, "member removed", func(ctx context.Context) error { return cli.Remove(ctx, victim.ID) }); err != nil {
		t.Fatal(err)
	}
	// Right after a membership change etcd may refuse any change as
	// "unhealthy cluster"; once it answers, removing a gone member must
	// count as done rather than fail with "member not found".
	if err := retry(ctx, "second removal to succeed", func(ctx context.Context) error { return cli.Remove(ctx, victim.ID) }); err != nil {
		t.Errorf("second removal: %v, want success", err)
	}
	var victimProc *testkit.EtcdProcess
	for _, p := range ps {
		if p.Name == victim.Name {
			victimProc = p
		}
	}
	select {
	case <-victimProc.Exited():
	case <-ctx.Done():
		t.Fatalf("removed member %s did not stop itself", victim.Name)
	}
	if err := cli.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cli.Endpoints(); len(got) != 2 {
		t.Errorf("endpoints after sync = %v, want the 2 remaining members", got)
	}
}

func TestPoolReusesClientPerCluster(t *testing.T) {
	t.Parallel()
	cl := testkit.NewEtcdCluster(t, "pool")
	p, err := cl.NewMember("pool-0")
	if err != nil {
		t.Fatal(err)
	}
	pool := etcd.NewPool()
	defer func() { _ = pool.Close() }()
	a, err := pool.Get("c1", cl.Config(p.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pool.Get("c1", cl.Config(p.ClientURL()))
	c, _ := pool.Get("c2", cl.Config(p.ClientURL()))
	if a != b || a == c {
		t.Errorf("pool returned a=%p b=%p c=%p; want one client per cluster", a, b, c)
	}
	bad := cl.Config(p.ClientURL())
	bad.KeyPEM = []byte("not a key")
	if _, err := pool.Get("c3", bad); err == nil {
		t.Error("pool accepted a client config with a broken key")
	}
}
