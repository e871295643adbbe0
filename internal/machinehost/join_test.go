package machinehost

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestJoinAfterCompactionServesAtOnce joins three members, one after
// another, to an etcd cluster whose raft log is compacted, so the leader
// sends each a snapshot as it starts. etcd v3.5 often loses the new
// member's request to publish itself then, and serves nothing until it
// retries after its 7-s request timeout. Each member must serve sooner
// than that: the agent restarts a member that does not serve 2 s after it
// started.
func TestJoinAfterCompactionServesAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real etcd")
	}
	testkit.RequireBinaries(t, "etcd")
	h := newHost(t)
	c := newTestCluster(t, h, "ns5", "c5")
	start := func(spec MachineSpec, local bootstrap.LocalEtcd) {
		doc := bootstrap.NewEtcdOnly("c5-etcd", c.cas.Etcd, local)
		// A raft snapshot every 100 entries: etcd then keeps 5,000 entries
		// for followers that lag, and sends older ones as a snapshot.
		doc.ExtraArgs = map[bootstrap.Component][]bootstrap.Arg{bootstrap.Etcd: {{Name: "snapshot-count", Value: "100"}}}
		c.startDoc(spec, doc)
	}
	e1 := c.spec("e1", "fd-a")
	start(e1, bootstrap.NewMember())
	c.waitHealthy(e1, 2*time.Minute)
	cli := c.etcdClient(clientURL(e1))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// 5,300 entries: past the 5,000 kept after the snapshot at 5,200.
	const writes, workers = 5300, 16
	g, gctx := errgroup.WithContext(ctx)
	for w := range workers {
		g.Go(func() error {
			for i := w; i < writes; i += workers {
				if _, err := cli.Raw().Put(gctx, fmt.Sprintf("/fill/%05d", i), "x"); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	for i, fd := range []string{"fd-b", "fd-c", "fd-a"} {
		spec := c.spec(fmt.Sprintf("e%d", i+2), fd)
		learner := c.addLearner(cli, spec)
		started := time.Now()
		start(spec, bootstrap.JoinMember(clientURL(e1)))
		c.eventually(spec.Name+" serving its clients", time.Minute, func() error {
			// A member that has not published accepts connections and
			// answers nothing: each attempt is bounded.
			actx, acancel := context.WithTimeout(ctx, time.Second)
			defer acancel()
			_, err := cli.Status(actx, clientURL(spec))
			return err
		})
		took := time.Since(started)
		h := c.waitHealthy(spec, time.Minute)
		t.Logf("%s served %v after its machine started; etcd restarts: %d", spec.Name, took.Round(time.Millisecond), h.Components[bootstrap.Etcd].Restarts)
		if took >= 7*time.Second {
			t.Errorf("%s served %v after its machine started, want less than etcd's 7-s request timeout, after which etcd retries a lost publish itself", spec.Name, took.Round(time.Millisecond))
		}
		c.promote(cli, spec, learner)
	}
}
