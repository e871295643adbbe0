package quorum

import (
	"fmt"
	"slices"
	"time"
)

// quorumLoss is what the survivors of a quorum loss show: the membership
// they applied, the voters that do not answer, and the survivor a
// recovery would keep.
type quorumLoss struct {
	// voters are the voters of the survivors' common view.
	voters []Member
	// lost are the voters that do not answer; unfenced those of them
	// whose machine exists and is not confirmed lost.
	lost, unfenced []Member
	// unfencedMachines names the machines of unfenced.
	unfencedMachines []string
	// keep is the answering voter with the highest applied index whose
	// machine stays; ok is false when there is none.
	keep Survivor
	ok   bool
	// machine hosts keep.
	machine Machine
}

// quorumLoss reads the survivors. lost is false when they show no loss:
// the members that answer are a majority of their view (an election, or
// a manager that cannot read the list), or none answers. problem says
// why no recovery can be planned from what they show.
func (v view) quorumLoss() (q quorumLoss, lost bool, problem string) {
	if !v.MembersUnknown || len(v.Survivors) == 0 {
		return q, false, ""
	}
	first := v.Survivors[0]
	want, wantLearners := memberIDs(first.View)
	for _, s := range v.Survivors[1:] {
		if ids, learners := memberIDs(s.View); !slices.Equal(ids, want) || !slices.Equal(learners, wantLearners) {
			return q, true, fmt.Sprintf("the members that answer disagree on the membership (%s lists %s, %s lists %s)",
				v.survivorName(first), idList(want), v.survivorName(s), idList(ids))
		}
	}
	q.voters = filter(first.View, Member.Voter)
	answering := func(m Member) bool {
		return slices.ContainsFunc(v.Survivors, func(s Survivor) bool { return s.ID == m.ID })
	}
	if 2*len(filter(q.voters, answering)) > len(q.voters) {
		return q, false, ""
	}
	q.lost = filter(q.voters, func(m Member) bool { return !answering(m) })
	for _, m := range q.lost {
		if mc, ok := v.machineOf(m); ok && !mc.ConfirmedLost {
			q.unfenced = append(q.unfenced, m)
			q.unfencedMachines = append(q.unfencedMachines, mc.Name)
		}
	}
	for _, s := range v.Survivors {
		mc, ok := v.machineOf(s.Member)
		if !ok || mc.Deleting || mc.ConfirmedLost || mc.PeerURL == "" || !slices.ContainsFunc(q.voters, func(m Member) bool { return m.ID == s.ID }) {
			continue
		}
		if !q.ok || s.AppliedIndex > q.keep.AppliedIndex || (s.AppliedIndex == q.keep.AppliedIndex && s.ID < q.keep.ID) {
			q.keep, q.machine, q.ok = s, mc, true
		}
	}
	if !q.ok {
		return q, true, "no voter that answers runs on a machine that stays"
	}
	return q, true, ""
}

// ShowsQuorumLoss reports whether the survivors in s show etcd without
// quorum: the member list could not be read, and the members that answer
// on their own are no majority of the voters they list.
func ShowsQuorumLoss(s State) bool {
	_, lost, _ := newView(s).quorumLoss()
	return lost
}

// ShowsTotalLoss reports whether s shows etcd with no member answering at
// all: the member list cannot be read, none answers on its own, and
// machines have hosted members.
func ShowsTotalLoss(s State) bool {
	_, _, lost := newView(s).totalLoss()
	return lost
}

// ShowsRecoverableLoss reports whether s shows a loss a recovery may come
// of: the survivors show quorum lost (ShowsQuorumLoss), or no member answers
// at all (ShowsTotalLoss) where a restore from a backup is asked for. The
// caller keeps when such a loss began, and looks again while it lasts.
func ShowsRecoverableLoss(s State) bool {
	v := newView(s)
	if _, lost, _ := v.quorumLoss(); lost {
		return true
	}
	_, _, total := v.totalLoss()
	return total && v.backupAsked()
}

// survivorName names a survivor for humans.
func (v view) survivorName(s Survivor) string { return v.memberName(s.Member) }

// recoveryAsked reports whether the policy or a trigger asks for a
// recovery from a survivor (FromBackup too: a survivor holds newer data
// than any snapshot).
func (v view) recoveryAsked() bool {
	return v.Recovery.Policy == RecoverFromSurvivor || v.Recovery.Policy == RecoverFromBackup || v.Recovery.Triggered
}

// backupAsked reports whether the policy or a trigger asks for a restore
// from a backup once no member answers.
func (v view) backupAsked() bool {
	return v.Recovery.Policy == RecoverFromBackup || v.Recovery.TriggerBackup
}

// totalLoss reads a cluster no member of which answers: the member list
// cannot be read, no member answers on its own, and machines have hosted
// members (recorded). unfenced names those of them not confirmed lost.
func (v view) totalLoss() (recorded []Machine, unfenced []string, lost bool) {
	if !v.MembersUnknown || len(v.Survivors) > 0 {
		return nil, nil, false
	}
	recorded = filter(v.machines, func(mc Machine) bool { return mc.MemberID != 0 || mc.JoinStarted })
	for _, mc := range recorded {
		if !mc.ConfirmedLost {
			unfenced = append(unfenced, mc.Name)
		}
	}
	return recorded, unfenced, len(recorded) > 0
}

// restoreFromBackup rebuilds etcd from the newest verified snapshot once no
// member answers (RestoreFromBackup), when the policy or a trigger asks:
// every machine that hosted a member is confirmed lost (I9), the loss has
// lasted Recovery.After (a trigger skips that wait), and State.Restore
// names a checked snapshot. While that recovery is open
// (Recovery.Restoring), it carries it on: the old cluster's machines go,
// then the first machine of the new one restores the snapshot.
func (p planner) restoreFromBackup() (Decision, bool) {
	if p.Topology == APIServersOnly {
		return Decision{}, false
	}
	if p.Recovery.Restoring {
		return p.continueRestore()
	}
	if !p.backupAsked() {
		return Decision{}, false
	}
	recorded, unfenced, lost := p.totalLoss()
	if !lost {
		return Decision{}, false
	}
	what := "etcd lost quorum and no member answers (machines " + names(recorded, func(m Machine) string { return m.Name }) + " hosted them)"
	switch {
	case len(unfenced) > 0 && !p.opts.recoverUnfenced:
		return degradedf("%s; restoring etcd from a backup waits until machines %s are confirmed lost (their infrastructure reports them stopped or gone, or the Machine is annotated %s), since a member that still runs would serve beside the restored cluster",
			what, joinNames(unfenced), ConfirmedLostAnnotation), true
	case !p.Restore.Requested || p.Restore.Snapshot == "" || p.Restore.Problem != "":
		problem := p.Restore.Problem
		if problem == "" {
			problem = "none was found"
		}
		return degradedf("%s; no verified snapshot can be restored: %s; fix the backup store, or bring a member back", what, problem), true
	}
	if due := p.recoveryDue(); p.Now.Before(due) {
		return waitf("%s; restoring snapshot %s onto a new machine at %s, after the loss has lasted %s, unless a member answers again",
			what, p.Restore.Snapshot, stamp(due), p.Recovery.After), true
	}
	d := Decision{Kind: RestoreFromBackup, Snapshot: p.Restore.Snapshot,
		Reason: fmt.Sprintf("%s, and their machines are confirmed lost; restoring etcd from snapshot %s onto a new machine, after which the lost machines are deleted",
			what, p.Restore.Snapshot)}
	d.Expect.Survivors = survivorIDs(p.Survivors)
	return d, true
}

// continueRestore carries an open recovery from a backup on: it deletes
// the lost cluster's machines and releases their hooks (their members went
// with that cluster), then bootstraps a new cluster from the snapshot. Once
// the new member is listed the caller closes the recovery, and the other
// rules grow the cluster back.
func (p planner) continueRestore() (Decision, bool) {
	if len(p.members) > 0 {
		return Decision{}, false
	}
	// Every lost machine is asked to go before any is waited for: none
	// hosts a member of a live cluster, and each deletion waits on what
	// went with them (their Nodes' API servers), so one at a time would add
	// those waits up.
	lost := slices.DeleteFunc(slices.Clone(p.machines), func(mc Machine) bool { return !slices.Contains(p.Recovery.LostMachines, mc.Name) })
	for _, mc := range lost {
		if !mc.Deleting {
			return Decision{Kind: DeleteMachine, Machine: mc.Name,
				Reason: fmt.Sprintf("restoring etcd from snapshot %s: machine %s hosted a member of the lost cluster; deleting it", p.Restore.Snapshot, mc.Name)}, true
		}
	}
	for _, mc := range lost {
		if mc.HasHook {
			return Decision{Kind: RemoveHook, Machine: mc.Name,
				Reason: fmt.Sprintf("restoring etcd from snapshot %s: machine %s is being deleted, and its member went with the lost cluster; releasing its drain", p.Restore.Snapshot, mc.Name)}, true
		}
	}
	if len(lost) > 0 {
		return waitf("restoring etcd from snapshot %s: waiting for machines %s of the lost cluster to finish deleting", p.Restore.Snapshot, joinNames(allMachineNames(lost))), true
	}
	if !p.Restore.Requested {
		// Never an empty cluster in the place of a lost one.
		return degradedf("a recovery from a backup is open, but no snapshot to restore is known: the recovery record on the owner may have been edited"), true
	}
	return p.bootstrap()
}

// verifyRestoreFromBackup checks a RestoreFromBackup step against a fresh
// view: still no member answers, every machine that hosted one is still
// confirmed lost, the same snapshot is checked, and the wait is over.
func (v view) verifyRestoreFromBackup(d Decision) error {
	_, unfenced, lost := v.totalLoss()
	switch {
	case !lost:
		return fmt.Errorf("etcd no longer shows a loss with no member answering")
	case len(unfenced) > 0:
		return fmt.Errorf("machines %s are no longer confirmed lost", joinNames(unfenced))
	case v.Restore.Snapshot != d.Snapshot || v.Restore.Problem != "":
		return fmt.Errorf("snapshot %s is no longer the one to restore (now %q%s)", d.Snapshot, v.Restore.Snapshot, why(v.Restore.Problem != "", ": "+v.Restore.Problem, ""))
	case !v.backupAsked():
		return fmt.Errorf("no restore from a backup is asked for any more")
	case v.Now.Before(v.recoveryDue()):
		return fmt.Errorf("the loss has not lasted %s yet", v.Recovery.After)
	}
	return nil
}

// recoveryDue is when the policy recovers (a trigger at once).
func (v view) recoveryDue() time.Time {
	if v.Recovery.Triggered {
		return time.Time{}
	}
	since := v.Recovery.LostSince
	if since.IsZero() {
		since = v.Now
	}
	return since.Add(v.Recovery.After)
}

// recoverQuorum rebuilds etcd from a survivor once quorum is lost for
// good (Recover), when the policy or a trigger asks for it: the loss has
// lasted Recovery.After (a trigger skips that wait), the members that
// answer agree on the membership, and every voter that does not answer
// runs on a machine confirmed lost (I9: a member that may still run
// behind a partition could serve beside the recovered cluster). Once no
// member answers at all, it restores from a backup instead, if asked
// (restoreFromBackup). It runs before refuseUnknownMembership, which
// reports the loss otherwise.
func (p planner) recoverQuorum() (Decision, bool) {
	if d, ok := p.restoreFromBackup(); ok {
		return d, true
	}
	if !p.recoveryAsked() || p.Topology == APIServersOnly {
		return Decision{}, false
	}
	q, lost, problem := p.quorumLoss()
	switch {
	case !lost:
		return Decision{}, false
	case problem != "":
		return degradedf("etcd lost quorum, and QCP cannot recover from a survivor: %s; recover etcd by hand, or restore it from a backup", problem), true
	case len(q.unfenced) > 0 && !p.opts.recoverUnfenced:
		return degradedf("etcd lost quorum: voters %s of %d do not answer; recovering from survivor %s waits until machines %s are confirmed lost (their infrastructure reports them stopped or gone, or the Machine is annotated %s), since a member that still runs behind a partition would serve beside the recovered cluster",
			names(q.lost, p.memberName), len(q.voters), p.survivorName(q.keep), joinNames(q.unfencedMachines), ConfirmedLostAnnotation), true
	}
	if due := p.recoveryDue(); p.Now.Before(due) {
		return waitf("etcd lost quorum: voters %s of %d do not answer; recovering from survivor %s (applied index %d) at %s, after the loss has lasted %s, unless they answer again",
			names(q.lost, p.memberName), len(q.voters), p.survivorName(q.keep), q.keep.AppliedIndex, stamp(due), p.Recovery.After), true
	}
	d := Decision{Kind: Recover, Machine: q.machine.Name, MemberID: q.keep.ID, Revision: q.keep.Revision,
		Reason: fmt.Sprintf("etcd lost quorum: voters %s of %d do not answer and their machines are confirmed lost; recovering from survivor %s, the highest applied index (%d), as a new cluster of one that keeps revision %d",
			names(q.lost, p.memberName), len(q.voters), p.survivorName(q.keep), q.keep.AppliedIndex, q.keep.Revision)}
	d.Expect.Survivors = survivorIDs(p.Survivors)
	return d, true
}

// verifyRecovery checks a Recover step against a fresh view: quorum is
// still lost, the same survivor is the one to keep, and every lost
// voter's machine is still confirmed lost.
func (v view) verifyRecovery(d Decision) error {
	q, lost, problem := v.quorumLoss()
	switch {
	case !lost:
		return fmt.Errorf("etcd no longer shows a quorum loss")
	case problem != "":
		return fmt.Errorf("no recovery can be planned: %s", problem)
	case len(q.unfenced) > 0:
		return fmt.Errorf("machines %s are no longer confirmed lost", joinNames(q.unfencedMachines))
	case q.keep.ID != d.MemberID:
		return fmt.Errorf("survivor %s is no longer the one to keep (%s is)", idString(d.MemberID), idString(q.keep.ID))
	case !v.recoveryAsked():
		return fmt.Errorf("no recovery is asked for any more")
	case v.Now.Before(v.recoveryDue()):
		return fmt.Errorf("the loss has not lasted %s yet", v.Recovery.After)
	}
	return nil
}

// checkOneCluster is I9, one cluster: etcd is rebuilt from a survivor
// (Recover) only when the policy or a trigger asked, after the loss lasted
// what the policy says, while the survivors show quorum lost and every
// voter that does not answer runs on a machine confirmed lost, and from
// the survivor with the highest applied index. The old members that may
// still run are then fewer than a majority of the old voters, so the old
// cluster can never serve again beside the new one.
func checkOneCluster(b view, d Decision, _ view) error {
	switch {
	case d.Kind == RestoreFromBackup:
		return checkRestoreFromBackup(b, d)
	case d.Kind == CreateMachine && b.Topology != APIServersOnly && len(b.members) == 0 &&
		(b.Bootstrapped || slices.ContainsFunc(b.machines, func(mc Machine) bool { return mc.MemberID != 0 })):
		// A first machine for a cluster that had members: only in an
		// open recovery from a backup, once the lost machines are gone.
		// (Machines that run no etcd member, APIServersOnly, make no
		// cluster to split.)
		if !b.Recovery.Restoring || !b.Restore.Requested {
			return fmt.Errorf("I9 one cluster: creating a first machine although etcd was bootstrapped before, outside a recovery from a backup")
		}
		if left := filter(b.machines, func(mc Machine) bool { return slices.Contains(b.Recovery.LostMachines, mc.Name) }); len(left) > 0 {
			return fmt.Errorf("I9 one cluster: creating the restored cluster's first machine while machines %s of the lost cluster remain", names(left, func(m Machine) string { return m.Name }))
		}
		return nil
	case d.Kind != Recover:
		return nil
	}
	q, lost, problem := b.quorumLoss()
	switch {
	case !b.recoveryAsked():
		return fmt.Errorf("I9 one cluster: recovering from %s while the policy is Manual and no recovery was triggered", idString(d.MemberID))
	case !lost || problem != "":
		return fmt.Errorf("I9 one cluster: recovering from %s while the survivors show no quorum loss to recover from%s", idString(d.MemberID), why(problem != "", " ("+problem+")", ""))
	case len(q.unfenced) > 0:
		return fmt.Errorf("I9 one cluster: recovering from %s while machines %s, whose members do not answer, are not confirmed lost", idString(d.MemberID), joinNames(q.unfencedMachines))
	case q.keep.ID != d.MemberID:
		return fmt.Errorf("I9 one cluster: recovering from %s, not from %s, the survivor with the highest applied index", idString(d.MemberID), idString(q.keep.ID))
	case b.Now.Before(b.recoveryDue()):
		return fmt.Errorf("I9 one cluster: recovering from %s before the loss lasted %s", idString(d.MemberID), b.Recovery.After)
	}
	return nil
}

// checkRestoreFromBackup is I9 for RestoreFromBackup: asked for, after the
// wait, with no member answering, and every machine that hosted a member
// confirmed lost, so that no old member can ever serve beside the restored
// cluster.
func checkRestoreFromBackup(b view, d Decision) error {
	_, unfenced, lost := b.totalLoss()
	switch {
	case !b.backupAsked():
		return fmt.Errorf("I9 one cluster: restoring snapshot %s while neither the policy nor a trigger asks for a restore from a backup", d.Snapshot)
	case !lost:
		return fmt.Errorf("I9 one cluster: restoring snapshot %s while a member answers, or none was ever recorded", d.Snapshot)
	case len(unfenced) > 0:
		return fmt.Errorf("I9 one cluster: restoring snapshot %s while machines %s, which hosted members, are not confirmed lost", d.Snapshot, joinNames(unfenced))
	case b.Now.Before(b.recoveryDue()):
		return fmt.Errorf("I9 one cluster: restoring snapshot %s before the loss lasted %s", d.Snapshot, b.Recovery.After)
	}
	return nil
}

// survivorIDs are the survivors' IDs, sorted and non-nil.
func survivorIDs(ss []Survivor) []uint64 {
	ids := make([]uint64, 0, len(ss))
	for _, s := range ss {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	return ids
}

func joinNames(ns []string) string { return names(ns, func(n string) string { return n }) }

// ConfirmedLostAnnotation, set on a Machine by a user, confirms that the
// machine does not run and never will again: a recovery from a survivor
// may then count its member as fenced.
const ConfirmedLostAnnotation = "controlplane.cluster.x-k8s.io/qcp-confirmed-lost"
