package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// The fragmentation the defragmentation scenario makes: 320 values of
// 512 KiB written, deleted and compacted away beside 192 that stay leave
// each member's database at about 256 MiB with 96 MiB in use, past the
// 45 % threshold and the scenario's floor of 16 MiB. A defragmentation
// copies what is in use, so the live data sets how long it takes.
const (
	churnKeys      = 320
	liveKeys       = 192
	churnValueSize = 512 << 10
	defragFloorMiB = 16
)

// TestDefragmentation is issue 36's etcd maintenance under traffic. The
// control plane starts with defragmentation disabled, and its database is
// fragmented by churn. With one member's etcd frozen, enabling
// defragmentation starts none. Once it has thawed, QCP defragments all three
// members, one at a time, the followers first and the leader only after a
// leadership transfer, while the writer loses nothing. The writer's longest
// gap during that maintenance is logged beside the gap of the same
// defragmentation done by hand on the leader.
func TestDefragmentation(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, time.Minute+40*time.Second)
	s := newScenario(t, mgmt, "defrag", 3, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Etcd.Stacked.Maintenance = controlplanev1.EtcdMaintenance{
			Defragmentation: controlplanev1.DefragmentationDisabled, DefragMinSizeMiB: ptr.To[int32](defragFloorMiB),
		}
	})
	s.writerPause = 20 * time.Millisecond // a finer gap measurement
	cp := s.waitAvailable(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cli := s.workloadEtcd(ctx)
	s.fragment(ctx, cli)

	// One member down (its etcd process frozen; its Node stays Ready):
	// enabling defragmentation starts none. It is disabled again before
	// the thaw, so that the maintenance measured below runs under traffic
	// from its start.
	leader := leaderMachine(cp)
	var follower string
	for _, m := range cp.Status.Etcd.Members {
		if m.Machine != leader && m.Machine != "" {
			follower = m.Machine
		}
	}
	if leader == "" || follower == "" {
		t.Fatalf("no leader and follower in status.etcd.members %+v", cp.Status.Etcd.Members)
	}
	host := &machinehost.Host{Root: mgmt.env.MachineRoot()}
	s.freeze(host, follower, "etcd")
	s.eventually(2*time.Minute, "QCP waiting for the frozen member "+follower, s.lastOperationSays(follower))
	s.setDefragmentation(ctx, controlplanev1.DefragmentationAutomatic)
	s.holds(20*time.Second, "no defragmentation while "+follower+"'s member is down", func(context.Context) error {
		if order, _ := s.bound.defragmentations(); len(order) > 0 {
			return fmt.Errorf("machines %v defragmented while %s's member was down", order, follower)
		}
		return nil
	})
	s.setDefragmentation(ctx, controlplanev1.DefragmentationDisabled)
	if err := host.ThawProcess(ns, follower, "etcd"); err != nil {
		t.Fatal(err)
	}

	// Maintenance under traffic, from enabling it to the last member done.
	s.waitAvailable(convergeTimeout, 3)
	s.startTraffic(3)
	s.waitWrites(20)
	leader = s.etcdLeader(ctx, cli)
	s.setDefragmentation(ctx, controlplanev1.DefragmentationAutomatic)
	s.eventually(5*time.Minute, "every member defragmented", s.allDefragmented(ctx, cli))
	s.waitWrites(20)
	wr, mr := s.stopTraffic(ctx)
	s.checkI6(mr)
	qcpGap := wr.MaxWriteGap
	order, most := s.bound.defragmentations()
	t.Logf("QCP defragmented %v (leader %s at the start); the writer's longest gap was %s", order, leader, qcpGap)
	if most != 1 {
		t.Errorf("%d members defragmenting at once, want 1", most)
	}
	if len(order) != 3 || order[0] == order[1] || order[2] != leader {
		t.Errorf("defragmented %v; want the two followers, then %s, the leader when it began", order, leader)
	}
	s.checkEvent(ctx, "MoveLeader", "before defragmenting "+leader)
	if now := s.etcdLeader(ctx, cli); now == leader {
		t.Errorf("%s still leads: it was defragmented without a leadership transfer", leader)
	}

	// The same defragmentation by hand, on the leader.
	s.setDefragmentation(ctx, controlplanev1.DefragmentationDisabled)
	s.fragment(ctx, cli)
	s.startTraffic(3)
	s.waitWrites(20)
	l, err := cli.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cli.Defragment(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	s.waitWrites(20)
	wr, mr = s.stopTraffic(ctx)
	s.checkI6(mr)
	t.Logf("defragmentation by hand of the leader %x took %s; the writer's longest gap was %s (QCP's, all three members: %s)",
		l.ID, took.Round(time.Millisecond), wr.MaxWriteGap, qcpGap)
	s.finish()
}

// waitWrites waits for the writer to have n more writes acknowledged.
func (s *scenario) waitWrites(n int) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.traffic.writer.WaitAcknowledged(ctx, n); err != nil {
		s.t.Fatal(err)
	}
}

// fragment grows the database of every member with churn, then deletes
// it and compacts it away, and waits until every member's database is
// fragmented past the default threshold and over the scenario's floor.
func (s *scenario) fragment(ctx context.Context, cli *etcd.Client) {
	s.t.Helper()
	raw, value := cli.Raw(), strings.Repeat("x", churnValueSize)
	const prefix = "/qcp-e2e/churn/"
	for i := range churnKeys + liveKeys {
		key := fmt.Sprintf("%s%04d", prefix, i)
		if i >= churnKeys {
			key = fmt.Sprintf("/qcp-e2e/live/%04d", i-churnKeys) // the same keys again the second time
		}
		if err := retry(ctx, func(ctx context.Context) error {
			_, err := raw.Put(ctx, key, value)
			return err
		}); err != nil {
			s.t.Fatal(err)
		}
	}
	var rev int64
	if err := retry(ctx, func(ctx context.Context) error {
		r, err := raw.Delete(ctx, prefix, clientv3.WithPrefix())
		if err == nil {
			rev = r.Header.Revision
		}
		return err
	}); err != nil {
		s.t.Fatal(err)
	}
	if err := retry(ctx, func(ctx context.Context) error {
		_, err := raw.Compact(ctx, rev, clientv3.WithCompactPhysical())
		return err
	}); err != nil && !strings.Contains(err.Error(), "required revision has been compacted") {
		s.t.Fatal(err)
	}
	s.eventually(time.Minute, "every member's database fragmented", func(ctx context.Context) error {
		return eachMember(ctx, cli, func(st etcd.MemberStatus) error {
			if frag := fragmentation(st); frag < 45 || st.DBSize < defragFloorMiB<<20 {
				return fmt.Errorf("member %x: %d%% of %d MiB free", st.ID, frag, st.DBSize>>20)
			}
			return nil
		})
	})
}

// allDefragmented is a check for eventually: every machine records a
// finished defragmentation, none an open one, and every member's database
// is under the threshold again.
func (s *scenario) allDefragmented(ctx context.Context, cli *etcd.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			_, open := m.Annotations[engine.DefragStartedAnnotation]
			if _, done := m.Annotations[engine.DefragmentedAnnotation]; !done || open {
				cp, _ := s.controlPlane(ctx)
				return fmt.Errorf("machine %s: defragmented %v, in flight %v; last operation %s", m.Name, done, open, lastOperation(cp))
			}
		}
		return eachMember(ctx, cli, func(st etcd.MemberStatus) error {
			if frag := fragmentation(st); frag >= 45 {
				return fmt.Errorf("member %x: still %d%% of %d MiB free", st.ID, frag, st.DBSize>>20)
			}
			return nil
		})
	}
}

// etcdLeader is the name of the member etcd's members follow.
func (s *scenario) etcdLeader(ctx context.Context, cli *etcd.Client) string {
	s.t.Helper()
	var name string
	if err := retry(ctx, func(ctx context.Context) error {
		l, err := cli.Leader(ctx)
		if err != nil {
			return err
		}
		members, err := cli.Members(ctx)
		if err != nil {
			return err
		}
		for _, m := range members {
			if m.ID == l.ID && m.Name != "" {
				name = m.Name
				return nil
			}
		}
		return fmt.Errorf("leader %x is not a started member", l.ID)
	}); err != nil {
		s.t.Fatal(err)
	}
	return name
}

// eachMember calls check on the status of every member.
func eachMember(ctx context.Context, cli *etcd.Client, check func(etcd.MemberStatus) error) error {
	members, err := cli.Members(ctx)
	if err != nil {
		return err
	}
	statuses, failed := cli.Statuses(ctx, members)
	for id, err := range failed {
		return fmt.Errorf("member %x: %w", id, err)
	}
	for _, st := range statuses {
		if err := check(st); err != nil {
			return err
		}
	}
	return nil
}

// fragmentation is the share of st's database, in percent, that is free.
func fragmentation(st etcd.MemberStatus) int64 {
	if st.DBSize <= 0 {
		return 0
	}
	return (st.DBSize - st.DBSizeInUse) * 100 / st.DBSize
}

// setQuota sets the control plane's quotaBackendBytes.
func (s *scenario) setQuota(ctx context.Context, quota int64) {
	s.t.Helper()
	s.patchControlPlane(ctx, func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Etcd.Stacked.QuotaBackendBytes = ptr.To(quota) })
}

// setDefragmentation sets the control plane's defragmentation policy.
func (s *scenario) setDefragmentation(ctx context.Context, policy controlplanev1.DefragmentationPolicy) {
	s.t.Helper()
	s.patchControlPlane(ctx, func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Etcd.Stacked.Maintenance.Defragmentation = policy })
}

// workloadEtcd is a client of the workload etcd, closed when the scenario
// ends.
func (s *scenario) workloadEtcd(ctx context.Context) *etcd.Client {
	s.t.Helper()
	cli, _, err := s.etcdClient(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// checkEvent checks that the control plane emitted an event with reason
// whose message says what.
func (s *scenario) checkEvent(ctx context.Context, reason, what string) {
	s.t.Helper()
	var seen []string
	for _, e := range s.controlPlaneEvents(ctx, reason) {
		if strings.Contains(e.Message, what) {
			return
		}
		seen = append(seen, e.Message)
	}
	s.t.Errorf("no %s event saying %q; %s events: %q", reason, what, reason, seen)
}

// controlPlaneEvents are the control plane's events with reason.
func (s *scenario) controlPlaneEvents(ctx context.Context, reason string) []corev1.Event {
	s.t.Helper()
	var events corev1.EventList
	if err := s.reader(ctx).List(ctx, &events, client.InNamespace(ns), client.MatchingFields{"involvedObject.name": s.name}); err != nil {
		s.t.Fatal(err)
	}
	return slices.DeleteFunc(events.Items, func(e corev1.Event) bool {
		return e.InvolvedObject.Kind != "QuorumControlPlane" || e.Reason != reason
	})
}

// lastOperationSays is a check for eventually: the control plane's last
// operation names what.
func (s *scenario) lastOperationSays(what string) func(context.Context) error {
	return func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if !strings.Contains(cp.Status.LastOperation.Reason, what) {
			return fmt.Errorf("last operation %s", lastOperation(cp))
		}
		return nil
	}
}

func lastOperation(cp *controlplanev1.QuorumControlPlane) string {
	if cp == nil {
		return "unknown"
	}
	return fmt.Sprintf("%s: %s", cp.Status.LastOperation.Kind, cp.Status.LastOperation.Reason)
}

// The NOSPACE scenario's quota, and what fills it: a bounded set of keys
// overwritten with big values, so that the live data (16 × 256 KiB) stays
// far under the quota while the history fills it; then new keys, so that
// the live data itself outgrows it.
const (
	noSpaceQuota     = 32 << 20
	noSpaceKeys      = 16
	noSpaceValueSize = 256 << 10
	noSpaceRetention = 20
	// The live-data act: 16 MiB of new keys, then the quota lowered to
	// 16 MiB, under them.
	liveOverKeys = 64
	lowQuota     = 16 << 20
)

// TestNoSpaceRecovery is issue 36's NOSPACE scenario, in two acts on one
// control plane with a 32 MiB quota (spec.etcd.stacked.quotaBackendBytes)
// and defragMinIntervalSeconds' default of an hour.
//
// History: a writer overwriting a bounded set of keys fills the database
// with history until etcd raises NOSPACE and refuses every write. QCP
// brings it back to writable by itself: the alarm disarmed, every member's
// database below the quota, writes succeeding again.
//
// Live data: 16 MiB of new keys, then the quota lowered to 16 MiB, which
// restarts every member in place, one at a time. The next write raises
// NOSPACE with live data over the quota. QCP compacts; the members were
// defragmented minutes ago, so it takes no second pass (at most one per
// member per defragMinIntervalSeconds) and says in EtcdClusterHealthy that
// the data does not fit, naming quotaBackendBytes. Raising the quota
// restarts the members in place again, followers first and the leader
// after a transfer, adding no machine; the alarm ends and writes succeed.
//
// Throughout, no member is removed and no machine deleted, and the
// scenario's writer loses no acknowledged write.
func TestNoSpaceRecovery(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 2*time.Minute)
	s := newScenario(t, mgmt, "nospace", 3, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Etcd.Stacked.QuotaBackendBytes = ptr.To[int64](noSpaceQuota)
		cp.Spec.Etcd.Stacked.Maintenance = controlplanev1.EtcdMaintenance{CompactionRetentionRevisions: ptr.To[int64](noSpaceRetention)}
	})
	s.waitAvailable(convergeTimeout, 3)
	s.startTraffic(3)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cli := s.workloadEtcd(ctx)
	before, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, value := cli.Raw(), strings.Repeat("n", noSpaceValueSize)
	put := func(ctx context.Context, key string) error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := raw.Put(pctx, key, value)
		return err
	}
	writable := func(ctx context.Context) error {
		if err := put(ctx, "/qcp-e2e/nospace/00"); err != nil {
			cp, _ := s.controlPlane(ctx)
			return fmt.Errorf("%w; last operation %s", err, lastOperation(cp))
		}
		return nil
	}

	// History.
	alarmAt := s.fillUntilNoSpace(ctx, put, func(i int) string { return fmt.Sprintf("/qcp-e2e/nospace/%02d", i%noSpaceKeys) })
	s.eventually(5*time.Minute, "etcd taking writes again", writable)
	t.Logf("history: writable again %s after the alarm", time.Since(alarmAt).Round(time.Millisecond))
	s.checkNoSpaceOver(ctx, cli, noSpaceQuota)
	s.checkEvent(ctx, "Compact", "has alarms [NOSPACE]: compacting")
	s.checkEvent(ctx, "DisarmAlarm", "disarming NOSPACE")
	s.checkOnePass(ctx, 1)

	// Live data: 16 MiB of new keys, under the quota; then the quota
	// lowered under them, which restarts every member in place.
	for i := range liveOverKeys {
		if err := retry(ctx, func(ctx context.Context) error { return put(ctx, fmt.Sprintf("/qcp-e2e/nospace-live/%04d", i)) }); err != nil {
			t.Fatal(err)
		}
	}
	defragsBefore, _ := s.bound.defragmentations()
	s.setQuota(ctx, lowQuota)
	loweredAt := time.Now()
	nodes := s.nodeReadiness()
	s.eventually(3*time.Minute, "EtcdClusterHealthy naming the quota to raise", func(ctx context.Context) error {
		if err := put(ctx, "/qcp-e2e/nospace/00"); err == nil {
			return errors.New("etcd still takes writes")
		}
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if msg := conditions.GetMessage(cp, controlplanev1.EtcdClusterHealthyCondition); !strings.Contains(msg, "spec.etcd.stacked.quotaBackendBytes") {
			return fmt.Errorf("EtcdClusterHealthy says %q; last operation %s", msg, lastOperation(cp))
		}
		return nil
	})
	t.Logf("live data: QCP named the quota to raise %s after it was lowered", time.Since(loweredAt).Round(time.Millisecond))
	// The members were defragmented minutes ago: at most one pass per
	// member per interval (an hour) means none now, and none later.
	s.holds(30*time.Second, "no defragmentation, no member removed and no machine deleted while the data does not fit", func(context.Context) error {
		if order, _ := s.bound.defragmentations(); len(order) > len(defragsBefore) {
			return fmt.Errorf("defragmented %v since the quota was lowered", order[len(defragsBefore):])
		}
		if d := s.bound.departures(); len(d) > 0 {
			return fmt.Errorf("machines %v left", d)
		}
		return nil
	})
	t.Logf("live data: Nodes seen not Ready while the alarm held: %v", nodes())

	leader := s.etcdLeader(ctx, cli)
	lowered, _ := s.bound.restarts()
	raised := int64(4 * noSpaceQuota)
	s.setQuota(ctx, raised)
	raisedAt := time.Now()
	s.eventually(5*time.Minute, "etcd taking writes again under the raised quota", writable)
	t.Logf("live data: writable again %s after the quota was raised", time.Since(raisedAt).Round(time.Millisecond))
	s.eventually(time.Minute, "every member running with the raised quota", func(ctx context.Context) error {
		return eachMember(ctx, cli, func(st etcd.MemberStatus) error {
			if st.DBSizeQuota != raised {
				return fmt.Errorf("member %x runs with a quota of %d bytes, want %d", st.ID, st.DBSizeQuota, raised)
			}
			return nil
		})
	})
	all, most := s.bound.restarts()
	if len(lowered) != 3 || len(slices.Compact(slices.Sorted(slices.Values(lowered)))) != 3 {
		t.Errorf("restarted %v for the lowered quota; want each of the 3 members once", lowered)
	}
	if order := all[len(lowered):]; len(order) != 3 || order[0] == order[1] || order[2] != leader {
		t.Errorf("restarted %v for the raised quota; want the two followers, then %s, the leader when the quota was raised", order, leader)
	}
	if most != 1 {
		t.Errorf("%d members disrupted at once, want 1", most)
	}
	s.checkEvent(ctx, "RestartMember", "the machine stays")
	s.checkEvent(ctx, "MoveLeader", "before restarting "+leader)
	s.checkNoSpaceOver(ctx, cli, raised)
	s.checkOnePass(ctx, 2)

	after, err := cli.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(before, after, func(a, b etcd.Member) bool { return a.ID == b.ID }) {
		t.Errorf("members %v before NOSPACE, %v after: a member was removed", before, after)
	}
	if d, n := s.bound.departures(), s.bound.machinesSeen(); len(d) > 0 || n != 3 {
		t.Errorf("machines %v left and %d were seen: NOSPACE and the quota change must replace none", d, n)
	}
	s.finish()
}

// fillUntilNoSpace writes values under key(i), i = 0, 1, …, until etcd
// refuses one with NOSPACE, and returns when.
func (s *scenario) fillUntilNoSpace(ctx context.Context, put func(context.Context, string) error, key func(int) string) time.Time {
	s.t.Helper()
	for i := 0; ; i++ {
		switch err := put(ctx, key(i)); {
		case err != nil && strings.Contains(err.Error(), "database space exceeded"):
			s.t.Logf("etcd raised NOSPACE after %d writes", i)
			return time.Now()
		case i > 4*noSpaceQuota/noSpaceValueSize:
			s.t.Fatalf("no NOSPACE after %d writes of %d KiB under a quota of %d MiB (last error %v)", i, noSpaceValueSize>>10, noSpaceQuota>>20, err)
		}
	}
}

// checkOnePass checks that the NOSPACE recoveries so far (recoveries of
// them) compacted once each, and defragmented each member once in all: the
// second recovery's members were defragmented within the interval.
func (s *scenario) checkOnePass(ctx context.Context, recoveries int) {
	s.t.Helper()
	if n := len(s.controlPlaneEvents(ctx, "Compact")); n != recoveries {
		s.t.Errorf("%d compactions in %d NOSPACE recoveries, want one each", n, recoveries)
	}
	if order, _ := s.bound.defragmentations(); len(order) != 3 || len(slices.Compact(slices.Sorted(slices.Values(order)))) != 3 {
		s.t.Errorf("defragmented %v; want each of the 3 members once", order)
	}
}

// checkNoSpaceOver checks that no alarm is raised and that every member's
// database is below quota.
func (s *scenario) checkNoSpaceOver(ctx context.Context, cli *etcd.Client, quota int64) {
	s.t.Helper()
	alarms, err := cli.Raw().AlarmList(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	if len(alarms.Alarms) > 0 {
		s.t.Errorf("alarms still raised: %v", alarms.Alarms)
	}
	// A member's status may time out (1 s) on a loaded host, right after
	// its restart: that is retried; a database over the quota is not.
	var over []string
	s.eventually(time.Minute, "every member's status", func(ctx context.Context) error {
		over = nil
		return eachMember(ctx, cli, func(st etcd.MemberStatus) error {
			if st.DBSize >= quota {
				over = append(over, fmt.Sprintf("member %x's database is %d MiB, not below the quota of %d MiB", st.ID, st.DBSize>>20, quota>>20))
			}
			return nil
		})
	})
	for _, o := range over {
		s.t.Error(o)
	}
}

// nodeReadiness samples the workload cluster's Nodes every two seconds
// until the function it returns is called, which returns the Nodes seen
// with Ready other than True, each with the first status seen.
func (s *scenario) nodeReadiness() func() []string {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := s.workload(ctx)
	if err != nil {
		cancel()
		s.t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]string{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
				mu.Lock()
				for _, n := range nodes.Items {
					for _, c := range n.Status.Conditions {
						if _, ok := seen[n.Name]; !ok && c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
							seen[n.Name] = string(c.Status)
						}
					}
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
	}()
	return func() []string {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, name := range slices.Sorted(maps.Keys(seen)) {
			out = append(out, name+"="+seen[name])
		}
		return out
	}
}
