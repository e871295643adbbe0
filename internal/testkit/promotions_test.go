package testkit

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// TestMonitorCoversUnseenPromotions feeds two monitors the same samples: a
// voter that appears between two samples, listed as a learner by neither,
// while etcd's promotion counter grew (chaos seed 702686: QCP added and
// promoted it within 340 ms), then one added directly as a voter, the
// counter unchanged. The monitor that reads the counters takes the first
// for a learner promoted and still reports the second (I3); the one that
// cannot read them reports both.
func TestMonitorCoversUnseenPromotions(t *testing.T) {
	ctx := context.Background()
	counts := map[string]uint64{"https://m1": 0}
	var reads atomic.Int32
	with, without := newMonitor(3), newMonitor(3)
	with.promotions = func(_ context.Context, url string) (uint64, error) { reads.Add(1); return counts[url], nil }
	now := time.Now()
	member := func(id uint64) etcd.Member {
		return etcd.Member{ID: id, Name: "m", ClientURLs: []string{fmt.Sprintf("https://m%d", id)}}
	}
	step := func(list []etcd.Member, members []quorum.Member) {
		now = now.Add(200 * time.Millisecond)
		for _, m := range []*Monitor{with, without} {
			prev := m.prev
			m.coverUnseenPromotions(ctx, list, prev, members)
			m.record(now, now, now, members, nil)
			m.rebasePromotions(ctx, list, prev, members)
		}
	}
	step([]etcd.Member{member(1)}, []quorum.Member{{ID: 1, Healthy: true, Leader: true}})
	counts["https://m1"] = 1 // member 1, leading, promoted member 2
	step([]etcd.Member{member(1), member(2)}, []quorum.Member{{ID: 1, Healthy: true, Leader: true}, {ID: 2, Healthy: true}})
	if err := with.result().Err(); err != nil || with.result().PromotedUnseen != 1 {
		t.Fatalf("a voter promoted between samples: %v, %d promoted unseen; want no violation, 1", err, with.result().PromotedUnseen)
	}
	if err := without.result().Err(); err == nil || !strings.Contains(err.Error(), "I3") {
		t.Fatalf("without the counters: %v; want the I3 report the samples alone make", err)
	}
	step([]etcd.Member{member(1), member(2), member(3)}, []quorum.Member{{ID: 1, Healthy: true, Leader: true}, {ID: 2, Healthy: true}, {ID: 3, Healthy: true}})
	if err := with.result().Err(); err == nil || !strings.Contains(err.Error(), "I3") || !strings.Contains(err.Error(), "member 3 joined as a voter") {
		t.Errorf("a voter added directly, no promotion counted: %v; want I3 for member 3", err)
	}
	// Counters are read at each membership change and when a voter shows up
	// unseen, not on every sample.
	before := reads.Load()
	step([]etcd.Member{member(1), member(2), member(3)}, []quorum.Member{{ID: 1, Healthy: true, Leader: true}, {ID: 2, Healthy: true}, {ID: 3, Healthy: true}})
	if n := reads.Load() - before; n != 0 {
		t.Errorf("%d counter reads for a sample that changed nothing", n)
	}
}

// TestPromotionCounterOfRealEtcd reads etcd's promotion counter from a
// real member's /metrics over TLS: 0, then 1 once a learner is promoted.
func TestPromotionCounterOfRealEtcd(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl, ps, cli := StartEtcdCluster(ctx, t, "promotions", 1)
	tlsCfg, err := cl.Config().TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	m := newMonitor(2)
	WithPromotionCounts(tlsCfg)(m)
	count := func() uint64 {
		t.Helper()
		n, err := m.promotions(ctx, ps[0].ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 0 {
		t.Fatalf("promotions before any: %d", n)
	}
	newcomer, err := cl.NewMember("promotions-new")
	if err != nil {
		t.Fatal(err)
	}
	var added etcd.Member
	if err := Eventually(ctx, 100*time.Millisecond, "learner added", func(ctx context.Context) (err error) {
		added, _, err = cli.AddLearner(ctx, newcomer.PeerURL())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := newcomer.Start(InitialCluster(append(ps, newcomer)...), "existing"); err != nil {
		t.Fatal(err)
	}
	if err := Eventually(ctx, 100*time.Millisecond, "learner promoted", func(ctx context.Context) error { return cli.Promote(ctx, added.ID) }); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Errorf("promotions after one: %d", n)
	}
	// Without the client's certificate the member refuses.
	if _, err := readPromotions(ctx, &http.Client{Timeout: time.Second}, ps[0].ClientURL()); err == nil {
		t.Error("read the counter without TLS")
	}
}
