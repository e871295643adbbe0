// Package engine proves the quorum planner against real etcd: a driver runs
// quorum.Plan in a loop and carries out each decision on etcd processes
// (the "machines"), while a recording writer and an invariant monitor watch.
// This is the engine without Kubernetes.
package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// machine is the driver's record of one machine: an etcd process on its own
// loopback address plus the metadata a Machine object would carry.
type machine struct {
	name      string
	fd        string
	proc      *testkit.EtcdProcess
	createdAt time.Time
	upToDate  bool
	deleting  bool
	hasHook   bool
	remediate bool
	memberID  uint64
	// joinStarted is recorded before MemberAddAsLearner (quorum.AddLearner).
	joinStarted bool
	// suppressed: its learner's start was suppressed (suppressStarts).
	suppressed bool
	// lost: the test confirmed the machine lost (quorum.Machine.ConfirmedLost).
	lost bool
	// version stands in for the Machine's resourceVersion: every change
	// bumps it, and a step planned on an older version is dropped.
	version int
}

// driverOptions change how the driver carries out decisions.
type driverOptions struct {
	// noLeaderTransfer plans with quorum.Options.SkipLeaderTransfer: the
	// planner removes a leading member without MoveLeader first. This is how
	// the value of I6 is measured; production code never sets it.
	noLeaderTransfer bool
	// tunables are passed to the planner.
	tunables quorum.Tunables
	// failureDomains are passed to the planner.
	failureDomains []string
	// recovery is the quorum-loss policy passed to the planner; the driver
	// keeps LostSince itself.
	recovery quorum.RecoveryState
}

// driver is the reconciler stand-in: observe → plan → act, one step at a time.
type driver struct {
	t    testing.TB
	name string
	opts driverOptions
	cl   *testkit.EtcdCluster
	cli  *etcd.Client // nil until the first machine exists

	desired        int
	machines       []*machine
	seq            int
	addedAt        map[uint64]time.Time
	unhealthySince map[uint64]time.Time
	endpoints      []string
	// suppressStarts is how many learner processes the driver "fails" to
	// start, as a machine whose etcd never comes up.
	suppressStarts int
	steps          []string
	// degraded are the Degraded reasons the planner gave, in order; a
	// scenario that breaks quorum on purpose asserts on them.
	degraded []string
	// dropped counts steps whose preconditions failed on the fresh
	// observation made right before acting.
	dropped int
	// afterStep runs after every step, for the monitor to sample each
	// intermediate membership.
	afterStep func(context.Context)
	// leader is the leader at the last observation.
	leader uint64
	// leaderRemovals counts RemoveMember steps whose member led when it was
	// removed.
	leaderRemovals int
	// lostSince is when the driver first saw quorum lost (State.Recovery.LostSince);
	// kept is the revision the last Recover kept.
	lostSince time.Time
	kept      int64
}

func newDriver(t testing.TB, name string, opts driverOptions) *driver {
	return &driver{t: t, name: name, opts: opts, cl: testkit.NewEtcdCluster(t, name),
		addedAt: map[uint64]time.Time{}, unhealthySince: map[uint64]time.Time{}}
}

// converge runs the loop until the planner has nothing left to do and the
// cluster is steady, or fails the test with the last thing it waited for.
func (d *driver) converge(ctx context.Context, desired int, timeout time.Duration) {
	d.t.Helper()
	d.desired = desired
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lastWait := ""
	lastStep := time.Now()
	for {
		before := d.observe(ctx)
		d.restartFailedJoins(before)
		dec := quorum.PlanWithOptions(before, quorum.Options{SkipLeaderTransfer: d.opts.noLeaderTransfer})
		switch {
		case dec.Kind == quorum.Degraded:
			if len(d.degraded) == 0 || d.degraded[len(d.degraded)-1] != dec.Reason {
				d.degraded = append(d.degraded, dec.Reason)
				d.steps = append(d.steps, time.Now().Format("15:04:05.000")+" "+dec.String())
			}
			lastWait = dec.Reason
		case dec.Kind == quorum.Wait && d.steady(before):
			return
		case dec.Kind == quorum.Wait:
			lastWait = dec.Reason
		default:
			d.step(ctx, before, dec)
			lastStep = time.Now()
			continue
		}
		if err := d.releaseDrainedMachines(); err != nil {
			d.t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			d.t.Fatalf("%s: not converged to %d voters within %s; waiting for %s\nsteps:\n%s", d.name, desired, timeout, lastWait, strings.Join(d.steps, "\n"))
		case <-time.After(pollAfter(time.Since(lastStep))):
		}
	}
}

// pollAfter is how long the driver waits before it looks again, given the
// time since its last step: as the controllers do
// (engine.Wakeups.PollAfter), quickly after a step and then a tenth of
// the wait so far, up to a second. Every look asks each member for its
// status.
func pollAfter(since time.Duration) time.Duration {
	return min(max(since/10, 100*time.Millisecond), time.Second)
}

// step carries out one decision and checks it against the invariants with
// a fresh observation.
func (d *driver) step(ctx context.Context, before quorum.State, dec quorum.Decision) {
	d.t.Helper()
	start := time.Now()
	// The world may have changed since the plan: act only if the decision's
	// preconditions still hold, as a reconciler must.
	if err := dec.Verify(d.observe(ctx)); err != nil {
		d.dropped++
		d.steps = append(d.steps, fmt.Sprintf("%s dropped %s: %v", start.Format("15:04:05.000"), dec.Kind, err))
		return
	}
	if err := d.act(ctx, dec); err != nil {
		d.t.Fatalf("%s: carrying out %s: %v\nsteps:\n%s", d.name, dec, err, strings.Join(d.steps, "\n"))
	}
	d.steps = append(d.steps, fmt.Sprintf("%s +%s %s", start.Format("15:04:05.000"), time.Since(start).Round(time.Millisecond), dec))
	if err := d.releaseDrainedMachines(); err != nil {
		d.t.Fatal(err)
	}
	if d.afterStep != nil {
		d.afterStep(ctx)
	}
	var after quorum.State
	err := testkit.Eventually(ctx, 100*time.Millisecond, "an observation after "+string(dec.Kind), func(ctx context.Context) error {
		if after = d.observe(ctx); after.MembersUnknown && d.cli != nil {
			return errors.New("the member list could not be read")
		}
		return nil
	})
	if err != nil {
		d.t.Fatalf("%s: %v", d.name, err)
	}
	if err := quorum.Check(before, dec, after); err != nil && !d.measuringI6(err) {
		d.t.Errorf("%s: invariant broken by %s: %v", d.name, dec, err)
	}
}

// measuringI6 reports whether err is the I6 violation that noLeaderTransfer
// commits on purpose, and nothing else.
func (d *driver) measuringI6(err error) bool {
	return d.opts.noLeaderTransfer && quorum.OnlyI6(err)
}

// steady reports whether the cluster is where the test wants it: desired
// healthy voters on up-to-date machines, nothing joining or leaving.
func (d *driver) steady(s quorum.State) bool {
	if len(s.Machines) != d.desired || len(s.Members) != d.desired {
		return false
	}
	for _, m := range s.Members {
		if m.Learner || !m.Healthy || !m.Started() {
			return false
		}
	}
	for _, mc := range s.Machines {
		if !mc.UpToDate || mc.Deleting || !mc.HasHook {
			return false
		}
	}
	return true
}

// observe builds the planner's State from the member list, per-member
// status and process liveness. A member list that cannot be read is
// reported as unknown, never as empty.
func (d *driver) observe(ctx context.Context) quorum.State {
	now := time.Now()
	s := quorum.State{Desired: d.desired, Topology: quorum.External, FailureDomains: d.opts.failureDomains, Now: now, Tunables: d.opts.tunables,
		Bootstrapped: d.cli != nil}
	if d.cli != nil {
		members, departed, err := d.cli.Observe(ctx)
		s.MembersUnknown = err != nil
		if err == nil {
			d.recordMembers(members, now)
			s.Members, s.DepartedAlarms = members, departed
		}
		// The driver's members run with etcd's default backend quota, 2 GiB.
		s.QuotaBackendBytes = 2 << 30
	}
	for _, mc := range d.machines {
		running := mc.proc.Running()
		s.Machines = append(s.Machines, quorum.Machine{
			Name: mc.name, FailureDomain: mc.fd, PeerURL: mc.proc.PeerURL(), UpToDate: mc.upToDate,
			CreatedAt: mc.createdAt, InfraReadyAt: mc.createdAt, Deleting: mc.deleting, HasHook: mc.hasHook, NodeReady: true,
			ComponentsHealthy: running, MemberID: mc.memberID, JoinStarted: mc.joinStarted, Remediate: mc.remediate,
			ResourceVersion: strconv.Itoa(mc.version), ConfirmedLost: mc.lost,
		})
	}
	d.observeLoss(ctx, &s, now)
	return s
}

// observeLoss gives the planner the recovery policy and, while the member
// list cannot be read, the members that answer on their own, as the
// controllers do (engine.Observation.ObserveSurvivors, TrackQuorumLoss).
func (d *driver) observeLoss(ctx context.Context, s *quorum.State, now time.Time) {
	s.Recovery = d.opts.recovery
	if d.cli == nil || !s.MembersUnknown || s.Recovery.Policy == quorum.RecoverManually && !s.Recovery.Triggered {
		if !s.MembersUnknown {
			d.lostSince = time.Time{}
		}
		return
	}
	var endpoints []string
	for _, mc := range d.machines {
		endpoints = append(endpoints, mc.proc.ClientURL())
	}
	s.Survivors = d.cli.Survivors(ctx, endpoints)
	if quorum.ShowsQuorumLoss(*s) && d.lostSince.IsZero() {
		d.lostSince = now
	}
	s.Recovery.LostSince = d.lostSince
}

// recordMembers keeps the caller's records a reconciler would persist: when
// each member was first seen unhealthy, when it was added, and the member a
// machine bootstrapped.
func (d *driver) recordMembers(members []quorum.Member, now time.Time) {
	for i := range members {
		m := &members[i]
		if m.Healthy {
			delete(d.unhealthySince, m.ID)
		} else if _, ok := d.unhealthySince[m.ID]; !ok {
			d.unhealthySince[m.ID] = now
		}
		m.UnhealthySince = d.unhealthySince[m.ID]
		m.AddedAt = d.addedAt[m.ID]
		d.recordBootstrapMember(*m)
	}
	d.leader = 0
	for _, m := range members {
		if m.Leader {
			d.leader = m.ID
		}
	}
	d.refreshEndpoints(members)
}

// recordBootstrapMember remembers the member a machine bootstrapped, as a
// reconciler records it on the Machine.
func (d *driver) recordBootstrapMember(m quorum.Member) {
	for _, mc := range d.machines {
		if mc.memberID == 0 && m.Name == mc.name {
			mc.memberID = m.ID
			mc.version++
		}
	}
}

// refreshEndpoints points the driver's client at the started voters:
// learners refuse the linearizable reads membership calls rely on.
func (d *driver) refreshEndpoints(members []quorum.Member) {
	var eps []string
	for _, m := range members {
		if m.Learner || !m.Started() {
			continue
		}
		if mc := d.machineByName(m.Name); mc != nil {
			eps = append(eps, mc.proc.ClientURL())
		}
	}
	slices.Sort(eps)
	if len(eps) > 0 && !slices.Equal(eps, d.endpoints) {
		d.cli.SetEndpoints(eps...)
		d.endpoints = eps
	}
}

func (d *driver) machineByName(name string) *machine {
	for _, mc := range d.machines {
		if mc.name == name {
			return mc
		}
	}
	return nil
}

// restartFailedJoins starts the etcd of a learner again when it exited
// before it joined, as qcp-agent's supervisor restarts its etcd: a member
// joining with --initial-cluster-state existing exits when the peer it
// asks for the membership has not yet applied the latest change ("member
// count is unequal"), as right after a leader was removed. Without this the
// learner stayed unstarted until the planner's 5-minute replacement, past
// the test's deadline. A member that started, and a start suppressed on
// purpose, are left alone.
func (d *driver) restartFailedJoins(s quorum.State) {
	for _, mc := range d.machines {
		if mc.memberID == 0 || mc.suppressed || mc.deleting || mc.proc.Running() {
			continue
		}
		for _, mb := range s.Members {
			if mb.ID != mc.memberID || !mb.Learner || mb.Started() {
				continue
			}
			if err := mc.proc.Restart(); err != nil {
				d.t.Logf("restarting the etcd of learner %s: %v", mc.name, err)
				continue
			}
			d.steps = append(d.steps, fmt.Sprintf("%s (etcd of learner %s exited before it joined; started again)", time.Now().Format("15:04:05.000"), mc.name))
		}
	}
}

// releaseDrainedMachines plays the infrastructure provider: a deleting
// machine whose pre-drain hook is gone is drained, its process stopped and
// the machine forgotten.
func (d *driver) releaseDrainedMachines() error {
	kept := d.machines[:0]
	for _, mc := range d.machines {
		if mc.deleting && !mc.hasHook {
			if err := mc.proc.Stop(); err != nil {
				return fmt.Errorf("stopping deleted machine %s: %w", mc.name, err)
			}
			if d.cli != nil {
				d.cli.ForgetEndpoint(mc.proc.ClientURL())
			}
			d.steps = append(d.steps, fmt.Sprintf("%s machine %s drained and gone", time.Now().Format("15:04:05.000"), mc.name))
			continue
		}
		kept = append(kept, mc)
	}
	d.machines = kept
	return nil
}

// retry repeats op while etcd answers with a retryable refusal ("unhealthy
// cluster" for 5 s after a membership change, "not in sync" until a learner
// catches up, elections), within limit.
func retry(ctx context.Context, limit time.Duration, op func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		octx, ocancel := context.WithTimeout(ctx, 3*time.Second)
		err := op(octx)
		ocancel()
		if err == nil || !etcd.IsRetryable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still refused after %s: %w", limit, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// act carries out one decision.
func (d *driver) act(ctx context.Context, dec quorum.Decision) error {
	switch dec.Kind {
	case quorum.CreateMachine:
		return d.createMachine(ctx, dec.FailureDomain)
	case quorum.AddLearner:
		return d.addLearner(ctx, dec)
	case quorum.Promote:
		return retry(ctx, 20*time.Second, func(ctx context.Context) error { return d.cli.Promote(ctx, dec.MemberID) })
	case quorum.MoveLeader:
		return retry(ctx, 20*time.Second, func(ctx context.Context) error { return d.cli.MoveLeader(ctx, dec.MemberID) })
	case quorum.RemoveMember:
		if dec.MemberID == d.leader {
			d.leaderRemovals++
		}
		return retry(ctx, 20*time.Second, func(ctx context.Context) error { return d.cli.Remove(ctx, dec.MemberID) })
	case quorum.DisarmAlarm:
		return retry(ctx, 20*time.Second, func(ctx context.Context) error { return d.cli.DisarmAlarm(ctx, dec.MemberID, dec.Alarm) })
	case quorum.Recover:
		return d.recover(ctx, dec)
	case quorum.AddHook, quorum.RemoveHook, quorum.DeleteMachine:
		mc := d.machineByName(dec.Machine)
		if mc == nil {
			return fmt.Errorf("no machine %s", dec.Machine)
		}
		switch dec.Kind {
		case quorum.AddHook:
			mc.hasHook = true
		case quorum.RemoveHook:
			mc.hasHook = false
		default:
			mc.deleting = true
		}
		mc.version++
		return nil
	}
	return fmt.Errorf("unknown decision kind %q", dec.Kind)
}

func (d *driver) createMachine(ctx context.Context, fd string) error {
	d.seq++
	name := fmt.Sprintf("%s-m%d", d.name, d.seq)
	proc, err := d.cl.NewMember(name)
	if err != nil {
		return err
	}
	mc := &machine{name: name, fd: fd, proc: proc, createdAt: time.Now(), upToDate: true}
	d.machines = append(d.machines, mc)
	if d.cli != nil {
		return nil // it joins once the planner adds it as a learner
	}
	// No cluster yet: this machine bootstraps one on its own.
	if err := proc.Start(testkit.InitialCluster(proc), "new"); err != nil {
		return err
	}
	d.cli, err = etcd.New(d.cl.Config(proc.ClientURL()))
	if err != nil {
		return err
	}
	d.t.Cleanup(func() { _ = d.cli.Close() })
	d.endpoints = []string{proc.ClientURL()}
	return testkit.WaitHealthy(ctx, d.cli, proc)
}

func (d *driver) addLearner(ctx context.Context, dec quorum.Decision) error {
	mc := d.machineByName(dec.Machine)
	if mc == nil {
		return fmt.Errorf("no machine %s", dec.Machine)
	}
	mc.joinStarted = true
	mc.version++
	var added etcd.Member
	var list []etcd.Member
	err := retry(ctx, 30*time.Second, func(ctx context.Context) (err error) {
		added, list, err = d.cli.AddLearner(ctx, dec.PeerURL)
		return err
	})
	if err != nil {
		return err
	}
	mc.memberID = added.ID
	mc.version++
	d.addedAt[added.ID] = time.Now()
	if d.suppressStarts > 0 {
		d.suppressStarts--
		mc.suppressed = true
		d.steps = append(d.steps, "  (start of "+mc.name+" suppressed: its etcd never comes up)")
		return nil
	}
	var ic []string
	for _, m := range list {
		name := m.Name
		if m.ID == added.ID {
			name = mc.name
		}
		for _, u := range m.PeerURLs {
			ic = append(ic, name+"="+u)
		}
	}
	return mc.proc.Start(strings.Join(ic, ","), "existing")
}

// recover plays the survivor's agent (agent.EtcdRecoverPath): it stops the
// member gracefully, restores its database as the only member of a new
// cluster, its revision bumped and marked compacted, and starts it on the
// result; then records the new member's ID as the controllers do.
func (d *driver) recover(ctx context.Context, dec quorum.Decision) error {
	mc := d.machineByName(dec.Machine)
	if mc == nil {
		return fmt.Errorf("no machine %s", dec.Machine)
	}
	if err := mc.proc.Stop(); err != nil {
		return err
	}
	bin, err := binaries.Path("etcd", binaries.EtcdVersion)
	if err != nil {
		return err
	}
	work, restored := d.t.TempDir(), mc.proc.DataDir+".recovered"
	member := backup.Member{Name: mc.name, InitialCluster: mc.name + "=" + mc.proc.PeerURL(), Token: d.name + "-recovered", PeerURL: mc.proc.PeerURL()}
	st, err := backup.RestoreDB(ctx, bin, filepath.Join(mc.proc.DataDir, "member", "snap", "db"), work, restored, member, backup.BumpRevision)
	if err != nil {
		return err
	}
	if err := os.Rename(mc.proc.DataDir, mc.proc.DataDir+".before-recovery"); err != nil {
		return err
	}
	if err := os.Rename(restored, mc.proc.DataDir); err != nil {
		return err
	}
	if err := mc.proc.Restart(); err != nil {
		return err
	}
	d.cli.SetEndpoints(mc.proc.ClientURL())
	d.endpoints = []string{mc.proc.ClientURL()}
	if err := testkit.WaitHealthy(ctx, d.cli, mc.proc); err != nil {
		return err
	}
	view, err := d.cli.LocalView(ctx, mc.proc.ClientURL())
	if err != nil {
		return err
	}
	mc.memberID, d.kept, d.lostSince = view.ID, st.Revision, time.Time{}
	mc.version++
	return nil
}
