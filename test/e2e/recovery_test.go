package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// recoveryAfter is the scenarios' quorumLossRecovery.afterSeconds: the
// schema's least, so that the wait costs the suite little.
const recoveryAfter = 10 * time.Second

// recoverFromSurvivor sets the quorum-loss policy FromSurvivor, with
// recoveryAfter.
func recoverFromSurvivor(cp *controlplanev1.QuorumControlPlane) {
	cp.Spec.QuorumLossRecovery = &controlplanev1.QuorumLossRecovery{
		Policy: controlplanev1.RecoveryFromSurvivor, AfterSeconds: ptr.To(int32(recoveryAfter / time.Second)),
	}
}

// noRecovery is a check for holds: no recovery from a survivor started.
func (s *scenario) noRecovery(ctx context.Context) error {
	cp, err := s.controlPlane(ctx)
	if err != nil {
		return nil // the management cluster's answer, not the control plane's
	}
	if r := cp.Status.Recovery; r != nil {
		return fmt.Errorf("a recovery from %s on %s started at %v", r.FromMember, r.Machine, r.StartTime)
	}
	if _, ok := cp.Annotations[engine.RecoveryAnnotation]; ok {
		return fmt.Errorf("a recovery was recorded: %s", cp.Annotations[engine.RecoveryAnnotation])
	}
	return nil
}

// loseMajorityAndRecover kills all of a 3-machine control plane's machines
// but one, a writer and the invariant monitor running, and checks that QCP, whose policy is
// FromSurvivor, rebuilds etcd from the survivor once the process provider
// reports the others' agents gone (confirmed lost): the survivor's data
// kept with its revision bumped, the lost machines deleted, and 3 voters
// again. The acknowledged writes the survivor lacked are counted, not
// failed on: a member that was not in the last commits' majority cannot
// have them, which is what a recovery from a survivor gives up.
func (s *scenario) loseMajorityAndRecover(ctx context.Context, host *machinehost.Host) {
	s.t.Helper()
	s.loseMajority(ctx, host, 3, func(ctx context.Context) (*controlplanev1.RecoveryStatus, controlplanev1.LastOperation, error) {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return nil, controlplanev1.LastOperation{}, err
		}
		return cp.Status.Recovery, cp.Status.LastOperation, nil
	}, func() { s.waitAvailable(convergeTimeout, 3) })
}

// loseEtcdMajorityAndRecover is loseMajorityAndRecover for an EtcdCluster
// of replicas members: 3, or 5 with a lagging survivor (loseMajority).
func (s *scenario) loseEtcdMajorityAndRecover(ctx context.Context, host *machinehost.Host, replicas int) {
	s.t.Helper()
	s.loseMajority(ctx, host, replicas, func(ctx context.Context) (*controlplanev1.RecoveryStatus, controlplanev1.LastOperation, error) {
		ec, err := s.etcdCluster(ctx)
		if err != nil {
			return nil, controlplanev1.LastOperation{}, err
		}
		return ec.Status.Recovery, ec.Status.LastOperation, nil
	}, func() { s.waitEtcdReady(convergeTimeout, replicas) })
}

// lagFill is what the scenario writes while one member is frozen, so that
// it lags for certain: more than the TCP buffers between it and the leader
// can hold (a frozen member still applies, once thawed, what its socket
// buffered), in values of 1 MiB, below etcd's request limit.
const lagFill = 32

// loseMajority is what both owners' scenarios do: recovery reads the
// owner's status.recovery and last operation, ready waits for replicas
// healthy members again.
//
// With 3 replicas, the oldest machine survives and the other two are
// killed. With 5, two followers survive: one lagging, frozen while
// lagFill MiB are written and the other three machines (the leader among
// them) are killed, and one current. QCP must recover from the current one,
// whose revision is the higher, and replace the lagging one's machine.
func (s *scenario) loseMajority(ctx context.Context, host *machinehost.Host, replicas int,
	recovery func(context.Context) (*controlplanev1.RecoveryStatus, controlplanev1.LastOperation, error), ready func()) {
	s.t.Helper()
	machines := s.settled(5*time.Minute, replicas)
	cfg, err := s.etcdConfig(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	w, err := testkit.StartWriter(cfg, testkit.WriterOptions{Pause: scenarioWriterPause})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := w.WaitAcknowledged(ctx, 20); err != nil {
		s.t.Fatal(err)
	}
	// The monitor follows the membership through the loss and the growth
	// back: pairs of samples across the loss, when nothing can be read, are
	// too far apart to judge (reported as gaps), every other pair is.
	mcfg := cfg
	mcfg.AutoSyncInterval = 500 * time.Millisecond
	mcli, err := etcd.New(mcfg)
	if err != nil {
		s.t.Fatal(err)
	}
	defer mcli.Close()
	tlsCfg, err := mcfg.TLSConfig()
	if err != nil {
		s.t.Fatal(err)
	}
	mon := testkit.StartMonitor(mcli, replicas, 0, testkit.WithPromotionCounts(tlsCfg))
	survivor, lagging := machines[0].Name, ""
	if replicas == 5 {
		survivor, lagging = s.lagOneFollower(ctx, host, mcli, machines)
	}
	var lost []string
	for _, m := range machines {
		if m.Name != survivor && m.Name != lagging {
			lost = append(lost, m.Name)
		}
	}
	// The writer is held from the kill to the end of the recovery, when
	// what the recovery kept is read back before new writes overwrite it.
	release := w.Hold()
	killed := time.Now()
	for _, name := range lost {
		if err := host.Kill(ns, name); err != nil {
			s.t.Fatal(err)
		}
	}
	s.t.Logf("killed %v, leaving %s", lost, survivor)
	var revs map[string]int64
	if lagging != "" {
		if err := host.Thaw(ns, lagging); err != nil {
			s.t.Fatal(err)
		}
		revs = s.survivorRevisions(ctx, mcli, machines, survivor, lagging)
		if revs[lagging] >= revs[survivor] {
			s.t.Fatalf("the frozen member of %s is at revision %d, the current one of %s at %d: %d MiB written while it was frozen did not make it lag",
				lagging, revs[lagging], survivor, revs[survivor], lagFill)
		}
	}
	var rec *controlplanev1.RecoveryStatus
	s.eventually(4*time.Minute, "QCP recovering etcd from survivor "+survivor, func(ctx context.Context) error {
		r, op, err := recovery(ctx)
		if err != nil {
			return err
		}
		// A recovery finished before (the owner's status keeps the
		// last one) is not this one.
		if rec = r; rec == nil || rec.FinishTime == nil || rec.StartTime.Time.Before(killed) {
			return fmt.Errorf("no finished recovery since the kill; last operation %s: %s", op.Kind, op.Reason)
		}
		return nil
	})
	recovered := time.Now()
	given := w.CheckKept(ctx)
	release()
	if rec.Machine != survivor {
		s.t.Errorf("recovered from machine %s, want the survivor %s (revisions %v)", rec.Machine, survivor, revs)
	}
	if rec.Trigger != "Policy" || len(rec.LostMembers) != len(lost) || rec.Revision <= 0 || rec.StartRevision != rec.Revision+backup.BumpRevision {
		s.t.Errorf("the recovery's record is not what it should be: %+v", rec)
	}
	if lagging != "" && rec.Revision != revs[survivor] {
		s.t.Errorf("the recovery kept revision %d; the current survivor was at %d, the lagging one at %d", rec.Revision, revs[survivor], revs[lagging])
	}
	if started := rec.StartTime.Time; started.Before(killed.Add(recoveryAfter)) {
		s.t.Errorf("the recovery started %s after the kill, before the policy's %s", started.Sub(killed), recoveryAfter)
	}
	ready()
	wr := w.Stop(ctx)
	mr := mon.Stop()
	s.t.Logf("monitor: %d samples (%d unobserved, %d pairs too far apart to judge), at most %d voters and %d learners",
		mr.Samples, mr.Unobserved, len(mr.Gaps), mr.MaxVoters, mr.MaxLearners)
	if err := mr.Err(); err != nil {
		s.t.Error(err)
	}
	now, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	// The lagging survivor's member belongs to the lost cluster: its
	// machine is replaced too.
	for _, m := range now {
		if slices.Contains(lost, m.Name) || m.Name == lagging {
			s.t.Errorf("machine %s, lost or lagging, is still there after the recovery", m.Name)
		}
	}
	if !slices.ContainsFunc(now, func(m clusterv1.Machine) bool { return m.Name == survivor }) {
		s.t.Errorf("the survivor %s is gone", survivor)
	}
	s.checkRecoveredEtcd(ctx, rec, replicas)
	// Every loss is one the recovery gave up: a write acknowledged after
	// it was never lost.
	if !slices.Equal(wr.LostWrites, given) {
		s.t.Errorf("acknowledged writes lost %v; the recovery gave up %v", wr.LostWrites, given)
	}
	s.t.Logf("recovered from %s (member %s, now %s) in %s after the kill, Available %s later; kept revision %d (survivors: %v), starts at %d; writer: %s; acknowledged writes the recovery gave up: %d (%v)",
		survivor, rec.FromMember, rec.Member, rec.FinishTime.Sub(killed).Round(time.Millisecond), time.Since(recovered).Round(time.Second),
		rec.Revision, revs, rec.StartRevision, wr, len(given), given)
}

// lagOneFollower picks two followers of the etcd leader among machines,
// freezes the first (lagging) and writes lagFill MiB while it is frozen,
// and returns the current one and the lagging one.
func (s *scenario) lagOneFollower(ctx context.Context, host *machinehost.Host, cli *etcd.Client, machines []clusterv1.Machine) (current, lagging string) {
	s.t.Helper()
	var leader etcd.MemberStatus
	if err := retry(ctx, func(ctx context.Context) (err error) { leader, err = cli.Leader(ctx); return err }); err != nil {
		s.t.Fatal(err)
	}
	var followers []string
	for _, m := range slices.Backward(machines) {
		if engine.ClientURL(&m) != leader.Endpoint {
			followers = append(followers, m.Name)
		}
	}
	if len(followers) < 2 {
		s.t.Fatalf("machines %d, leader at %s: fewer than two followers", len(machines), leader.Endpoint)
	}
	lagging, current = followers[0], followers[1]
	s.freeze(host, lagging, "")
	value := strings.Repeat("x", 1<<20)
	for i := range lagFill {
		if err := retry(ctx, func(ctx context.Context) error {
			_, err := cli.Raw().Put(ctx, fmt.Sprintf("/e2e-lag/%d", i), value)
			return err
		}); err != nil {
			s.t.Fatal(err)
		}
	}
	s.t.Logf("%s frozen while %d MiB were written; %s is current", lagging, lagFill, current)
	return current, lagging
}

// survivorRevisions reads each survivor's revision from its own member,
// once it has applied all it has: the same on two reads in a row.
func (s *scenario) survivorRevisions(ctx context.Context, cli *etcd.Client, machines []clusterv1.Machine, names ...string) map[string]int64 {
	s.t.Helper()
	revs := map[string]int64{}
	for _, m := range machines {
		if !slices.Contains(names, m.Name) {
			continue
		}
		endpoint, last := engine.ClientURL(&m), int64(-1)
		s.eventually(time.Minute, "the revision of "+m.Name+" settling", func(ctx context.Context) error {
			st, err := cli.Status(ctx, endpoint)
			if err != nil {
				return err
			}
			if st.Revision != last {
				last = st.Revision
				return fmt.Errorf("revision %d, was not yet read twice", st.Revision)
			}
			revs[m.Name] = st.Revision
			return nil
		})
	}
	return revs
}

// checkRecoveredEtcd checks the recovered etcd: replicas voters, among them
// the recovered member, a revision above the kept one bumped, and a read
// at the kept revision refused as compacted.
func (s *scenario) checkRecoveredEtcd(ctx context.Context, rec *controlplanev1.RecoveryStatus, replicas int) {
	s.t.Helper()
	cli, _, err := s.etcdClient(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	defer cli.Close()
	var members []etcd.Member
	if err := retry(ctx, func(ctx context.Context) (err error) { members, err = cli.Members(ctx); return err }); err != nil {
		s.t.Fatal(err)
	}
	voters := slices.DeleteFunc(slices.Clone(members), func(m etcd.Member) bool { return m.IsLearner })
	if len(voters) != replicas || !slices.ContainsFunc(voters, func(m etcd.Member) bool { return strconv.FormatUint(m.ID, 16) == rec.Member }) {
		s.t.Errorf("after the recovery etcd lists %v, want %d voters, recovered member %s among them", members, replicas, rec.Member)
	}
	for _, m := range members {
		if slices.Contains(rec.LostMembers, strconv.FormatUint(m.ID, 16)) {
			s.t.Errorf("lost member %x is listed after the recovery", m.ID)
		}
	}
	resp, err := cli.Raw().Get(ctx, writerPrefix, clientv3.WithPrefix())
	if err != nil {
		s.t.Fatal(err)
	}
	if resp.Header.Revision < rec.StartRevision {
		s.t.Errorf("the recovered etcd serves revision %d, below its start %d", resp.Header.Revision, rec.StartRevision)
	}
	if _, err := cli.Raw().Get(ctx, writerPrefix, clientv3.WithPrefix(), clientv3.WithRev(rec.Revision)); err == nil {
		s.t.Errorf("a read at the kept revision %d succeeded; the recovery marks it compacted, so that watchers from before relist", rec.Revision)
	}
}
