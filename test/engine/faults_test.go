package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestLoseTwoOfFive kills two of five members. Five voters tolerate two
// failures, so the planner must not call for a human: it removes each dead
// member first, then replaces its machine, back to five healthy voters.
func TestLoseTwoOfFive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDriver(t, "twooffive", driverOptions{tunables: quorum.Tunables{UnhealthyTimeout: 3 * time.Second}})
	d.converge(ctx, 1, phaseTimeout)
	tr := startTraffic(t, d)
	tr.mon.SetDesired(5)
	d.converge(ctx, 5, 2*phaseTimeout)
	dead := d.nonLeaders(2)
	for _, mc := range dead {
		if err := mc.proc.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	from := len(d.steps)
	d.converge(ctx, 5, 2*phaseTimeout)
	tr.stop(t, ctx)
	logSteps(t, d)
	if len(d.degraded) > 0 {
		t.Errorf("the planner called for a human although 5 voters tolerate 2 failures: %v", d.degraded)
	}
	firstAdd := stepIndex(d, from, "AddLearner(")
	for _, mc := range dead {
		removed := stepIndex(d, from, "RemoveMember(", fmt.Sprintf("%x", mc.memberID))
		if removed < 0 || firstAdd < 0 || removed > firstAdd {
			t.Errorf("dead member %x removed at step %d, first replacement added at step %d; want every dead member removed first", mc.memberID, removed, firstAdd)
		}
	}
}

// userDeletion converges three members, has a user delete a non-leading
// voter's machine (and with removeHook remove its hook by hand), converges
// again and returns the driver, the victim, the first step after the
// deletion and the monitor's report.
func userDeletion(t *testing.T, name string, removeHook bool) (*driver, *machine, int, testkit.MonitorReport) {
	t.Helper()
	ctx := context.Background()
	d := newDriver(t, name, driverOptions{})
	d.converge(ctx, 3, phaseTimeout)
	tr := startTraffic(t, d)
	victim := d.nonLeaders(1)[0]
	victim.userDeletes(removeHook)
	from := len(d.steps)
	d.converge(ctx, 3, phaseTimeout)
	tr.stop(t, ctx)
	logSteps(t, d)
	return d, victim, from, tr.monitored
}

// TestUserDeletesVoterMachine deletes a voter's machine by hand: its hook
// holds it until the replacement is a promoted voter, and there are never
// more than four voters.
func TestUserDeletesVoterMachine(t *testing.T) {
	t.Parallel()
	d, victim, from, r := userDeletion(t, "userdelete", false)
	promoted := stepIndex(d, from, "Promote(")
	removed := stepIndex(d, from, "RemoveMember(", fmt.Sprintf("%x", victim.memberID))
	if promoted < 0 || removed < 0 || promoted > removed {
		t.Errorf("replacement promoted at step %d, deleted machine's member removed at step %d; want the replacement first", promoted, removed)
	}
	if r.MaxVoters > 4 {
		t.Errorf("%d voters at once, want at most 4", r.MaxVoters)
	}
}

// TestHookRemovedByHand is the escape hatch: an operator deletes a voter's
// machine and removes its hook, so it drains at once. QCP never puts the
// hook back, removes the dead member and heals back to three voters.
func TestHookRemovedByHand(t *testing.T) {
	t.Parallel()
	d, victim, from, _ := userDeletion(t, "hatch", true)
	if i := stepIndex(d, from, "AddHook("+victim.name+")"); i >= 0 {
		t.Errorf("the hook was put back on %s at step %d", victim.name, i)
	}
	if stepIndex(d, from, "RemoveMember(", fmt.Sprintf("%x", victim.memberID)) < 0 {
		t.Errorf("member %x of the released machine was never removed", victim.memberID)
	}
}

// TestRecoversFromDegraded kills two of three members: quorum is lost, and
// the planner must say so and take no step. Once the two come back, the
// cluster is whole again with the same three members and nothing removed.
func TestRecoversFromDegraded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*phaseTimeout)
	defer cancel()
	d := newDriver(t, "degraded", driverOptions{})
	d.converge(ctx, 3, phaseTimeout)
	tr := startTraffic(t, d)
	dead := d.nonLeaders(2)
	for _, mc := range dead {
		if err := mc.proc.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	var dec quorum.Decision
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "the planner to report Degraded", func(ctx context.Context) error {
		if dec = quorum.Plan(d.observe(ctx)); dec.Kind != quorum.Degraded {
			return fmt.Errorf("planner decided %s", dec)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(dec.Reason, "lost quorum") && !strings.Contains(dec.Reason, "cannot be read") {
		t.Errorf("Degraded for the wrong reason: %s", dec.Reason)
	}
	for _, mc := range dead {
		if err := mc.proc.Restart(); err != nil {
			t.Fatal(err)
		}
	}
	from := len(d.steps)
	d.converge(ctx, 3, phaseTimeout)
	// Whole again: it takes writes.
	tr.waitWrites(t, 4)
	tr.stop(t, ctx)
	logSteps(t, d)
	for _, kind := range []string{"RemoveMember(", "DeleteMachine(", "CreateMachine("} {
		if i := stepIndex(d, from, kind); i >= 0 {
			t.Errorf("recovery took a %s step (%s); the members only had to come back", kind, d.steps[i])
		}
	}
}

// userDeletes is a user deleting the machine, and with removeHook also
// removing its pre-drain hook by hand (the escape hatch).
func (mc *machine) userDeletes(removeHook bool) {
	mc.deleting = true
	mc.hasHook = mc.hasHook && !removeHook
	mc.version++
}

// nonLeaders returns n machines whose members do not lead, newest first.
func (d *driver) nonLeaders(n int) []*machine {
	var out []*machine
	for i := len(d.machines) - 1; i >= 0 && len(out) < n; i-- {
		if mc := d.machines[i]; mc.memberID != d.leader {
			out = append(out, mc)
		}
	}
	if len(out) < n {
		d.t.Fatalf("only %d machines without the leader, want %d", len(out), n)
	}
	return out
}

// TestRecoverFromTheCurrentSurvivor loses three of five members for good,
// leaving two: one that lagged (frozen while the others wrote on) and one
// current. With the policy FromSurvivor, and the three machines confirmed
// lost, the planner recovers from the current one, whose revision is the
// higher, and grows back to five voters; the lagging one's machine is
// replaced. Writes acknowledged before the loss that the current survivor
// lacks would be lost: they are counted and logged.
func TestRecoverFromTheCurrentSurvivor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*phaseTimeout)
	defer cancel()
	d := newDriver(t, "survivor", driverOptions{recovery: quorum.RecoveryState{Policy: quorum.RecoverFromSurvivor, After: 2 * time.Second}})
	d.converge(ctx, 1, phaseTimeout)
	d.converge(ctx, 5, 2*phaseTimeout)
	w, err := testkit.StartWriter(d.cl.Config(d.endpoints...), testkit.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitAcknowledged(ctx, 4); err != nil {
		t.Fatal(err)
	}
	followers := d.nonLeaders(2)
	lagging, current := followers[0], followers[1]
	if err := lagging.proc.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitAcknowledged(ctx, 50); err != nil {
		t.Fatal(err)
	}
	var lost []*machine
	for _, mc := range d.machines {
		if mc != lagging && mc != current {
			lost = append(lost, mc)
		}
	}
	for _, mc := range lost {
		if err := mc.proc.Kill(); err != nil {
			t.Fatal(err)
		}
		mc.lost = true
		mc.version++
	}
	if err := lagging.proc.Thaw(); err != nil {
		t.Fatal(err)
	}
	// A thawed member goes on applying the appends its socket buffered
	// while it was frozen, under load for a while: its revision counts
	// once three reads in a row agree, as the recovery, seconds later,
	// sees it (a CI run read 29 at once, and the member was at 55 when
	// QCP recovered from it).
	revs := map[*machine]int64{}
	for _, mc := range []*machine{lagging, current} {
		agreed := 0
		if err := testkit.Eventually(ctx, 300*time.Millisecond, "the revision of "+mc.name+" to settle", func(ctx context.Context) error {
			st, err := d.cli.Status(ctx, mc.proc.ClientURL())
			if err != nil {
				agreed = 0
				return err
			}
			if st.Revision != revs[mc] {
				agreed = 0
			}
			revs[mc] = st.Revision
			if agreed++; agreed < 3 {
				return fmt.Errorf("revision %d read %d times in a row", st.Revision, agreed)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	lagged := revs[lagging] < revs[current]
	if !lagged {
		// On thawing, a frozen member applies the appends its socket
		// buffered meanwhile; with few small writes it may end level.
		t.Logf("the frozen member caught up to revision %d from what it had buffered: this run does not show the choice by lag", revs[lagging])
	}
	from := len(d.steps)
	d.converge(ctx, 5, 4*phaseTimeout)
	wr := w.Stop(ctx)
	logSteps(t, d)
	if stepIndex(d, from, "Recover(") < 0 {
		t.Error("no Recover step")
	}
	if d.kept != revs[current] {
		t.Errorf("the recovery kept revision %d; the current survivor was at %d, the other at %d", d.kept, revs[current], revs[lagging])
	}
	// The survivor not kept is replaced: its member belongs to the lost
	// cluster. With a lag, that is the lagging one.
	kept, other := current, lagging
	if d.machineByName(current.name) == nil {
		kept, other = lagging, current
	}
	if d.machineByName(kept.name) == nil || d.machineByName(other.name) != nil || lagged && kept != current {
		t.Errorf("machines %s (current, revision %d) and %s (revision %d): want the current one kept and the other replaced",
			current.name, revs[current], lagging.name, revs[lagging])
	}
	t.Logf("kept revision %d of the survivors' %d and %d; writer: %s; acknowledged writes lost: %d %v", d.kept, revs[current], revs[lagging], wr, len(wr.LostWrites), wr.LostWrites)
}
