package etcd_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestPeersReachAMemberQCPCannot observes a real three-member cluster
// through clients that cannot reach one member, as a manager cut off from
// one machine (issue 37): their dialer refuses that member's address,
// while the members reach each other. A follower cut off that way, and
// the leader, must read as unhealthy but reached by their peers; every
// other member as healthy. Once the follower is killed, its peers no
// longer reach it either, and it must read as down.
func TestPeersReachAMemberQCPCannot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, ps, cli := testkit.StartEtcdCluster(ctx, t, "peersview", 3)
	var leader etcd.MemberStatus
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "a leader", func(ctx context.Context) (err error) {
		leader, err = cli.Leader(ctx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var follower *testkit.EtcdProcess
	for _, p := range ps {
		if p.ClientURL() != leader.Endpoint {
			follower = p
			break
		}
	}
	// cutFrom observes the cluster through a client that cannot reach the
	// member at endpoint.
	cutFrom := func(endpoint string) *etcd.Client {
		var eps []string
		for _, p := range ps {
			eps = append(eps, p.ClientURL())
		}
		cfg := cl.Config(eps...)
		cut := endpoint[len("https://"):]
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			if addr == cut {
				return nil, fmt.Errorf("%s is cut off from this client", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		})}
		c, err := etcd.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	// check reports whether c sees the member at endpoint as want says,
	// and every other member healthy.
	check := func(ctx context.Context, c *etcd.Client, endpoint string, want func(quorum.Member) bool) error {
		list, err := c.Members(ctx)
		if err != nil {
			return err
		}
		members, err := c.ObserveMembers(ctx)
		if err != nil {
			return err
		}
		for i, m := range members {
			switch {
			case list[i].ClientURLs[0] == endpoint && !want(m):
				return fmt.Errorf("member %s observed %+v", list[i], m)
			case list[i].ClientURLs[0] != endpoint && (!m.Healthy || m.ReachedByPeers):
				return fmt.Errorf("member %s, which this client reaches, observed %+v", list[i], m)
			}
		}
		return nil
	}
	eventually := func(what string, cond func(context.Context) error) {
		t.Helper()
		if err := testkit.Eventually(ctx, 200*time.Millisecond, what, cond); err != nil {
			t.Fatal(err)
		}
	}
	reached := func(m quorum.Member) bool { return !m.Healthy && m.ReachedByPeers }
	cutFollower := cutFrom(follower.ClientURL())
	eventually("a follower the client cannot reach, reached by its peers", func(ctx context.Context) error {
		return check(ctx, cutFollower, follower.ClientURL(), reached)
	})
	// Whoever leads at each attempt: leadership may move on a loaded host.
	eventually("the leader the client cannot reach, named by its followers", func(ctx context.Context) error {
		leader, err := cli.Leader(ctx)
		if err != nil {
			return err
		}
		return check(ctx, cutFrom(leader.Endpoint), leader.Endpoint, func(m quorum.Member) bool { return reached(m) && m.Leader })
	})
	if err := follower.Kill(); err != nil {
		t.Fatal(err)
	}
	eventually("the killed follower, which its peers no longer reach", func(ctx context.Context) error {
		return check(ctx, cutFollower, follower.ClientURL(), func(m quorum.Member) bool { return !m.Healthy && !m.ReachedByPeers })
	})
}
