package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

func TestElectedLeader(t *testing.T) {
	st := func(id, term, leader uint64) etcd.MemberStatus {
		return etcd.MemberStatus{ID: id, RaftTerm: term, Leader: leader}
	}
	views := func(ss ...etcd.MemberStatus) map[uint64]etcd.MemberStatus {
		out := map[uint64]etcd.MemberStatus{}
		for _, s := range ss {
			out[s.ID] = s
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		statuses map[uint64]etcd.MemberStatus
		want     uint64
	}{
		{"nobody answers", nil, 0},
		{"every member agrees", views(st(1, 4, 2), st(2, 4, 2), st(3, 4, 2)), 2},
		{"the leader's own status is missing; its followers name it", views(st(1, 4, 2), st(3, 4, 2)), 2},
		{"one follower names the leader", views(st(3, 7, 2)), 2},
		{"an isolated old leader loses to the others' newer term", views(st(1, 3, 1), st(2, 4, 3), st(3, 4, 3)), 3},
		{"an old leader loses to a newer term whichever answers first", views(st(9, 3, 9), st(2, 4, 5)), 5},
		{"the newer term wins even named by one member", views(st(1, 5, 1), st(2, 5, 1), st(3, 6, 2)), 2},
		{"a newer term without a leader yet keeps the last one", views(st(1, 3, 1), st(2, 4, 0), st(3, 4, 0)), 1},
		{"an election under way with nobody leading", views(st(1, 4, 0), st(2, 4, 0)), 0},
		{"a learner's view counts", views(st(4, 8, 2)), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := etcd.ElectedLeader(tc.statuses); got != tc.want {
				t.Errorf("ElectedLeader = %x, want %x", got, tc.want)
			}
		})
	}
}

// TestLeaderWhoseStatusTimesOutIsNotRemoved makes the leader's own status
// request time out, as on a host too loaded to answer within
// StatusTimeout, with a gRPC interceptor on the observing client that
// holds back the leader's status reply. Its followers still name it, so
// the observation must mark it leader (and unhealthy), and the planner,
// with its machine leaving and a replacement voter in place, must never
// remove it without moving leadership first.
func TestLeaderWhoseStatusTimesOutIsNotRemoved(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Four voters: the three that stay and the leader's, which leaves.
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "slowleader", 4)

	var slow atomic.Uint64
	holdLeader := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(*etcdserverpb.StatusResponse); ok && err == nil && r.GetHeader().GetMemberId() == slow.Load() {
			<-ctx.Done()
			return ctx.Err()
		}
		return err
	}
	var eps []string
	for _, p := range ps {
		eps = append(eps, p.ClientURL())
	}
	cfg := cl.Config(eps...)
	cfg.DialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(holdLeader)}
	observer, err := etcd.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = observer.Close() })

	var leader etcd.MemberStatus
	var members []quorum.Member
	// Leadership may move on a loaded host between finding the leader and
	// observing; each round holds back whoever leads then.
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "the leader observed as leader although its status timed out", func(ctx context.Context) (err error) {
		if leader, err = cli.Leader(ctx); err != nil {
			return err
		}
		slow.Store(leader.ID)
		sctx, scancel := context.WithTimeout(ctx, etcd.StatusTimeout)
		_, serr := observer.Status(sctx, leader.Endpoint)
		scancel()
		if !errors.Is(serr, context.DeadlineExceeded) {
			return fmt.Errorf("the leader's status was not held back: %v", serr)
		}
		if members, err = observer.ObserveMembers(ctx); err != nil {
			return err
		}
		for _, m := range members {
			if m.ID == leader.ID && m.Healthy {
				return fmt.Errorf("leader %x observed healthy; its status should have timed out", m.ID)
			}
			if m.ID == leader.ID && !m.Leader {
				return fmt.Errorf("leader %x, whose status timed out, is not observed as leader", m.ID)
			}
			if m.ID != leader.ID && m.Leader {
				return fmt.Errorf("member %x observed as leader, but %x leads", m.ID, leader.ID)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	now := time.Now()
	s := quorum.State{Desired: 3, Topology: quorum.External, Members: members, Bootstrapped: true, Now: now}
	for _, m := range members {
		s.Machines = append(s.Machines, quorum.Machine{Name: m.Name, PeerURL: m.PeerURL, UpToDate: true, HasHook: true,
			NodeReady: true, ComponentsHealthy: m.Healthy, MemberID: m.ID, CreatedAt: now.Add(-time.Hour),
			InfraReadyAt: now.Add(-time.Hour), Deleting: m.ID == leader.ID})
	}
	// However long the leader stays unanswering, it is never removed.
	for _, since := range []time.Duration{0, time.Minute, time.Hour} {
		for i := range s.Members {
			s.Members[i].UnhealthySince = time.Time{}
			if !s.Members[i].Healthy {
				s.Members[i].UnhealthySince = now.Add(-since)
			}
		}
		d := quorum.Plan(s)
		t.Logf("unhealthy for %s: %s", since, d)
		if d.Kind == quorum.RemoveMember {
			t.Fatalf("Plan removed a member (%s) while leader %x's status timed out: %s", idOf(d.MemberID), leader.ID, d)
		}
	}
}

func idOf(id uint64) string { return fmt.Sprintf("%x", id) }
