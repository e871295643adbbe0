package etcd_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestStatusReusesItsConnection: asking a member for its status again and
// again (every sample of a monitor, every round of an observation) reuses
// one connection to it, instead of a TCP connection and a TLS handshake on
// both sides each time, as clientv3's Maintenance.Status does; and the
// connection still sees a member that was killed and came back.
func TestStatusReusesItsConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, ps, _ := testkit.StartEtcdCluster(ctx, t, "reuse", 1)
	var dials atomic.Int32
	cfg := cl.Config(ps[0].ClientURL())
	cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})}
	cli, err := etcd.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	const asks = 20
	for i := range asks {
		if _, err := cli.Status(ctx, ps[0].ClientURL()); err != nil {
			t.Fatalf("status %d: %v", i, err)
		}
	}
	// One connection for the cluster's client and one for the member's
	// pinned client.
	if n := dials.Load(); n > 2 {
		t.Errorf("%d statuses of one member dialled %d connections, want at most 2 (one kept for the member)", asks, n)
	}

	if err := ps[0].Kill(); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, etcd.StatusTimeout)
	_, err = cli.Status(sctx, ps[0].ClientURL())
	scancel()
	if err == nil {
		t.Fatal("a killed member answered its status")
	}
	if err := ps[0].Restart(); err != nil {
		t.Fatal(err)
	}
	// The kept connection reconnects within its backoff's second.
	err = testkit.Eventually(ctx, 100*time.Millisecond, "the restarted member's status", func(ctx context.Context) error {
		sctx, scancel := context.WithTimeout(ctx, etcd.StatusTimeout)
		defer scancel()
		_, err := cli.Status(sctx, ps[0].ClientURL())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
