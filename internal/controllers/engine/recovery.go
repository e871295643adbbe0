package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// Records of a quorum loss, on the owner.
const (
	// QuorumLostSinceAnnotation is when QCP first saw etcd without quorum
	// in the loss that lasts (RFC 3339); removed once the member list can
	// be read again. A recovery policy's wait counts from it.
	QuorumLostSinceAnnotation = "controlplane.cluster.x-k8s.io/qcp-quorum-lost-since"
	// RecoveryAnnotation is the last recovery from a survivor (JSON): written
	// before the survivor's agent is called, and completed once the
	// recovered member answers. An open one is finished before anything
	// else is planned: until its machine records the new member's ID, the
	// planner would take that machine for spent.
	RecoveryAnnotation = "controlplane.cluster.x-k8s.io/qcp-recovery"
)

// ConfirmedLostReasons are the reasons of a Machine's InfrastructureReady
// condition that confirm the machine does not run: its infrastructure
// object was deleted (CAPI core's reason, any provider), or the process
// provider's agent exited (it never restarts a machine that stopped).
var ConfirmedLostReasons = []string{clusterv1.MachineInfrastructureDeletedReason, "AgentExited"}

// ConfirmedLost reports whether machine is known not to run: a user
// annotated it (quorum.ConfirmedLostAnnotation), or its infrastructure
// reports it stopped or gone (ConfirmedLostReasons).
func ConfirmedLost(machine *clusterv1.Machine) bool {
	if _, ok := machine.Annotations[quorum.ConfirmedLostAnnotation]; ok {
		return true
	}
	c := conditions.Get(machine, clusterv1.MachineInfrastructureReadyCondition)
	return c != nil && c.Status == metav1.ConditionFalse && slices.Contains(ConfirmedLostReasons, c.Reason)
}

// recoveryRecord is RecoveryAnnotation's content: the status, and the token
// that names the recovered cluster (etcd's --initial-cluster-token), which
// makes the agent's recovery idempotent.
type recoveryRecord struct {
	controlplanev1.RecoveryStatus `json:",inline"`
	Token                         string `json:"token"`
}

// ReadRecovery is the owner's last recovery; nil if none.
func ReadRecovery(owner client.Object) *controlplanev1.RecoveryStatus {
	if r := readRecoveryRecord(owner); r != nil {
		return &r.RecoveryStatus
	}
	return nil
}

func readRecoveryRecord(owner client.Object) *recoveryRecord {
	v, ok := owner.GetAnnotations()[RecoveryAnnotation]
	if !ok {
		return nil
	}
	var r recoveryRecord
	if err := json.Unmarshal([]byte(v), &r); err != nil {
		return nil
	}
	return &r
}

// RecoveredMachines are the machines through which etcd may be asked after
// the owner's last recovery: once it finished, a machine created before it
// began, other than the survivor it kept, hosts a member of the cluster it
// replaced. Such a member may still run: a survivor not kept (one that
// lagged) stays up without quorum, answers a linearizable request with
// nothing until it times out, and a client balancing over it would find the
// recovered cluster's membership unknown round after round. The planner
// still sees those machines, and replaces them; only etcd is not asked
// through them.
func RecoveredMachines(owner client.Object, machines []*clusterv1.Machine) []*clusterv1.Machine {
	rec := readRecoveryRecord(owner)
	if rec == nil || rec.FinishTime == nil {
		return machines
	}
	return slices.DeleteFunc(slices.Clone(machines), func(m *clusterv1.Machine) bool {
		return m.Name != rec.Machine && m.CreationTimestamp.Time.Before(rec.StartTime.Time)
	})
}

// AskedMachines are the machines of owner etcd is asked through: neither
// those confirmed lost (ConfirmedLost), whose endpoints would only hold
// each request until its timeout, nor, after a finished recovery, those of
// the replaced cluster (RecoveredMachines). With every member lost, each
// observation waited out its whole timeout on dead endpoints, twice a
// round (the plan's look and the step's fresh one), so a restore from a
// backup took one step every 12 to 32 s.
func AskedMachines(owner client.Object, machines []*clusterv1.Machine) []*clusterv1.Machine {
	return slices.DeleteFunc(slices.Clone(RecoveredMachines(owner, machines)), ConfirmedLost)
}

// PlannerRecovery is the planner's view of the owner's recovery policy
// (spec.quorumLossRecovery, nil for Manual) and of its records.
func PlannerRecovery(owner client.Object, spec *controlplanev1.QuorumLossRecovery) quorum.RecoveryState {
	var s quorum.RecoveryState
	s.After = time.Duration(controlplanev1.DefaultRecoveryAfterSeconds) * time.Second
	if spec != nil {
		switch spec.Policy {
		case controlplanev1.RecoveryFromSurvivor:
			s.Policy = quorum.RecoverFromSurvivor
		case controlplanev1.RecoveryFromBackup:
			s.Policy = quorum.RecoverFromBackup
		}
		if spec.AfterSeconds != nil {
			s.After = time.Duration(*spec.AfterSeconds) * time.Second
		}
	}
	a := owner.GetAnnotations()
	switch a[controlplanev1.RecoverAnnotation] {
	case controlplanev1.RecoverFromSurvivorValue:
		s.Triggered = true
	case controlplanev1.RecoverFromBackupValue:
		s.Triggered, s.TriggerBackup = true, true
	}
	s.LostSince = ParseTime(a[QuorumLostSinceAnnotation])
	if rec := readRecoveryRecord(owner); rec != nil && rec.FinishTime == nil && rec.Snapshot != "" {
		s.Restoring, s.LostMachines = true, rec.LostMachines
	}
	return s
}

// ResolveRecoveryRestore finds the snapshot a recovery from a backup
// restores: the newest verified one of owner (of kind) while one may come of
// it (the policy or a trigger asks, and no member answers), the recorded one
// while it runs; nil otherwise. It gives the planner its verdict
// (s.Restore): a missing Secret, an empty store or a snapshot that does not
// read back whole stops the recovery, and says why.
func ResolveRecoveryRestore(ctx context.Context, c client.Reader, owner client.Object, kind string, b *controlplanev1.BackupSpec, s *quorum.State, now time.Time) *Restore {
	var from controlplanev1.RestoreSource
	switch rec := readRecoveryRecord(owner); {
	case s.Recovery.Restoring && rec != nil:
		from.Object = rec.Snapshot
	case (s.Recovery.Policy == quorum.RecoverFromBackup || s.Recovery.TriggerBackup) && quorum.ShowsTotalLoss(*s):
		from.Cluster = owner.GetName()
	default:
		return nil
	}
	if b == nil {
		s.Restore = quorum.RestoreState{Requested: true, Problem: "spec.backup is not set, and a recovery from a backup restores its snapshots: set spec.backup, or recover by hand"}
		return nil
	}
	res, err := ResolveRestore(ctx, c, owner, kind, &controlplanev1.RestoreSpec{From: from}, b, now)
	if err != nil {
		err = fmt.Errorf("recovering from a backup: %w", err)
	}
	s.Restore = PlannerRestore(res, err)
	return res
}

// ObserveSurvivors fills in s.Survivors, when the member list could not be
// read and a recovery may come of it (a policy or a trigger): each
// machine's member, asked on its own.
func (o *Observation) ObserveSurvivors(ctx context.Context, s *quorum.State) {
	if !s.MembersUnknown || o.Etcd == nil || (s.Recovery.Policy == quorum.RecoverManually && !s.Recovery.Triggered) {
		return
	}
	var endpoints []string
	for _, m := range o.Machines {
		if u := ClientURL(m); u != "" {
			endpoints = append(endpoints, u)
		}
	}
	s.Survivors = o.Etcd.Survivors(ctx, endpoints)
}

// TrackQuorumLoss keeps QuorumLostSinceAnnotation on owner: set when the
// survivors first show quorum lost (or, where a restore from a backup is
// asked, no member answers at all), removed once the member list can be
// read again, with a recovery trigger (controlplanev1.RecoverAnnotation);
// and gives the planner the time it holds.
func TrackQuorumLoss(ctx context.Context, c client.Client, owner client.Object, s *quorum.State, now time.Time) error {
	_, recorded := owner.GetAnnotations()[QuorumLostSinceAnnotation]
	x := Executor{Client: c, Owner: owner}
	switch {
	case quorum.ShowsRecoverableLoss(*s) && !recorded:
		if err := x.recordOnOwner(ctx, QuorumLostSinceAnnotation, FormatTime(now)); err != nil {
			return err
		}
		s.Recovery.LostSince = now
	case !s.MembersUnknown:
		// etcd has quorum: the loss, if one was recorded, is over, and a
		// trigger is dropped rather than kept for a later loss, which it
		// would recover without the policy's wait.
		return x.forgetOnOwner(ctx, QuorumLostSinceAnnotation, controlplanev1.RecoverAnnotation)
	}
	return nil
}

// recover takes Recover: it records the recovery on the owner, then has the
// survivor's agent rebuild etcd from its own data (finishRecovery).
func (x Executor) recover(ctx context.Context, d quorum.Decision, machine *clusterv1.Machine, s quorum.State) error {
	rec := x.newRecoveryRecord(s)
	rec.Token = fmt.Sprintf("%s-recovered-%d", x.Owner.GetName(), x.Now().Unix())
	rec.Machine, rec.FromMember, rec.Revision = machine.Name, FormatMemberID(d.MemberID), d.Revision
	for _, sv := range s.Survivors {
		if sv.ID != d.MemberID {
			continue
		}
		for _, m := range sv.View {
			if !m.Learner && !slices.ContainsFunc(s.Survivors, func(o quorum.Survivor) bool { return o.ID == m.ID }) {
				rec.LostMembers = append(rec.LostMembers, FormatMemberID(m.ID))
			}
		}
	}
	if err := x.writeRecovery(ctx, rec); err != nil {
		return fmt.Errorf("recording the recovery from member %x before it starts: %w", d.MemberID, err)
	}
	return x.finishRecovery(ctx, rec, machine)
}

// newRecoveryRecord starts the record of a recovery asked for in s: its
// start time, and what asked for it.
func (x Executor) newRecoveryRecord(s quorum.State) *recoveryRecord {
	rec := &recoveryRecord{}
	rec.StartTime = &metav1.Time{Time: x.Now()}
	rec.Trigger = "Policy"
	if s.Recovery.Triggered {
		rec.Trigger = "Annotation"
	}
	return rec
}

// writeRecovery records rec on the owner (RecoveryAnnotation).
func (x Executor) writeRecovery(ctx context.Context, rec *recoveryRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return x.recordOnOwner(ctx, RecoveryAnnotation, string(b))
}

// completeRecovery records rec as finished now, and drops the trigger and
// the loss's record.
func (x Executor) completeRecovery(ctx context.Context, rec *recoveryRecord) error {
	rec.FinishTime = &metav1.Time{Time: x.Now()}
	if err := x.writeRecovery(ctx, rec); err != nil {
		return err
	}
	return x.forgetOnOwner(ctx, controlplanev1.RecoverAnnotation, QuorumLostSinceAnnotation)
}

// recordRestoreFromBackup takes RestoreFromBackup: it records, on the
// owner, the recovery from snapshot res (which the decision names) and the
// lost cluster's machines and members; the planner then deletes those
// machines and creates a first one that restores the snapshot.
func (x Executor) recordRestoreFromBackup(ctx context.Context, d quorum.Decision, res *Restore, s quorum.State) error {
	if res == nil || res.Manifest.Snapshot != d.Snapshot {
		return fmt.Errorf("snapshot %s was not found and checked in this round", d.Snapshot)
	}
	rec := x.newRecoveryRecord(s)
	rec.Snapshot, rec.Revision = d.Snapshot, res.Manifest.Revision
	for _, m := range s.Machines {
		if m.MemberID != 0 || m.JoinStarted {
			rec.LostMachines = append(rec.LostMachines, m.Name)
			if m.MemberID != 0 {
				rec.LostMembers = append(rec.LostMembers, FormatMemberID(m.MemberID))
			}
		}
	}
	if err := x.writeRecovery(ctx, rec); err != nil {
		return fmt.Errorf("recording the recovery from snapshot %s: %w", d.Snapshot, err)
	}
	return nil
}

// finishRestoreFromBackup completes the open recovery from a backup rec
// once the restored cluster's member is listed: its ID and machine, and the
// revision it starts from; it drops the trigger and the loss's record.
func finishRestoreFromBackup(ctx context.Context, x Executor, rec *recoveryRecord, s quorum.State) error {
	m := s.Members[0]
	rec.Member, rec.StartRevision = FormatMemberID(m.ID), rec.Revision+backup.BumpRevision
	for _, mc := range s.Machines {
		if mc.MemberID == m.ID || mc.Name == m.Name {
			rec.Machine = mc.Name
		}
	}
	return x.completeRecovery(ctx, rec)
}

// RecoveryPoll is how often an owner looks at etcd while its survivors
// show quorum lost: whether the lost members answer again, or a
// recovery's wait ends, no watch says.
const RecoveryPoll = 5 * time.Second

// recoveryWait bounds how long finishRecovery waits for the recovered
// member to answer.
const recoveryWait = time.Minute

// finishRecovery has the agent on machine carry out the recovery rec
// (again, if it already did: the agent answers a token it knows from its
// record), waits for the new member to answer as the only one, records its
// ID on machine, and completes rec, dropping the trigger and the loss's
// record.
func (x Executor) finishRecovery(ctx context.Context, rec *recoveryRecord, machine *clusterv1.Machine) error {
	endpoint := ClientURL(machine)
	u, err := url.Parse(endpoint)
	if err != nil || endpoint == "" {
		return fmt.Errorf("recovering from machine %s: it has no etcd client URL (%q)", machine.Name, endpoint)
	}
	res, err := agent.RecoverEtcd(ctx, x.AgentTLS, u.Hostname(), agent.EtcdRecoverRequest{Token: rec.Token, BumpRevision: backup.BumpRevision})
	if err != nil {
		return fmt.Errorf("recovering etcd from its member on machine %s: %w", machine.Name, err)
	}
	if err := x.Etcd.WaitHealthy(ctx, endpoint, recoveryWait); err != nil {
		return fmt.Errorf("the recovered member on machine %s does not answer yet: %w", machine.Name, err)
	}
	view, err := x.Etcd.LocalView(ctx, endpoint)
	if err != nil {
		return fmt.Errorf("reading the recovered member on machine %s: %w", machine.Name, err)
	}
	if len(view.Members) != 1 || view.Members[0] != view.ID {
		return fmt.Errorf("the recovered member %x on machine %s lists members %x, not itself alone", view.ID, machine.Name, view.Members)
	}
	if err := x.recordOwn(ctx, machine, func(a map[string]string) {
		a[MemberIDAnnotation] = FormatMemberID(view.ID)
		delete(a, UnhealthySinceAnnotation)
	}); err != nil {
		return err
	}
	rec.Member, rec.StartRevision = FormatMemberID(view.ID), res.Revision+backup.BumpRevision
	if res.Revision != rec.Revision {
		// The survivor's database held less than its status said: etcd
		// was killed before it wrote all it had applied.
		rec.Revision = res.Revision
	}
	return x.completeRecovery(ctx, rec)
}

// FinishOpenRecovery completes a recovery that was recorded but not
// finished (the manager stopped in between), before the owner plans
// anything: until then the survivor's machine records the lost cluster's
// member ID. It reports whether there was one.
func FinishOpenRecovery(ctx context.Context, x Executor, recorder record.EventRecorder, machines []*clusterv1.Machine) (bool, error) {
	rec := readRecoveryRecord(x.Owner)
	if rec == nil || rec.FinishTime != nil || rec.Snapshot != "" {
		return false, nil // a recovery from a backup goes on through the planner's steps
	}
	i := slices.IndexFunc(machines, func(m *clusterv1.Machine) bool { return m.Name == rec.Machine })
	if i < 0 || x.Etcd == nil {
		return true, fmt.Errorf("finishing the recovery from machine %s: the machine or an etcd client is missing", rec.Machine)
	}
	if err := x.finishRecovery(ctx, rec, machines[i]); err != nil {
		return true, err
	}
	RecordRecoveryEvent(recorder, x.Owner, &rec.RecoveryStatus)
	return true, nil
}

// TendRecovery is every owner's round's first word on quorum loss, right
// after it observed: it finishes a recovery recorded but not finished
// (FinishOpenRecovery; open says there was one, and the owner then plans
// nothing this round), else keeps the loss's record (TrackQuorumLoss).
func TendRecovery(ctx context.Context, c client.Client, recorder record.EventRecorder, owner client.Object, obs *Observation, now func() time.Time) (open bool, err error) {
	x := Executor{Client: c, Etcd: obs.Etcd, AgentTLS: obs.AgentTLS, Owner: owner, Now: now}
	if open, err := FinishOpenRecovery(ctx, x, recorder, obs.Machines); open {
		return true, err
	}
	if rec := readRecoveryRecord(owner); rec != nil && rec.FinishTime == nil && rec.Snapshot != "" {
		// A recovery from a backup: done once the restored member is
		// listed; until then the planner carries it on.
		if obs.State.MembersUnknown || len(obs.State.Members) == 0 {
			return false, nil
		}
		if err := finishRestoreFromBackup(ctx, x, rec, obs.State); err != nil {
			return false, err
		}
		RecordRecoveryEvent(recorder, owner, &rec.RecoveryStatus)
		obs.State.Recovery.Restoring, obs.State.Recovery.LostMachines = false, nil
		return false, nil
	}
	return false, TrackQuorumLoss(ctx, c, owner, &obs.State, now())
}

// RecordRecoveryEvent announces a finished recovery.
func RecordRecoveryEvent(recorder record.EventRecorder, owner client.Object, st *controlplanev1.RecoveryStatus) {
	if st.Snapshot != "" {
		recorder.Eventf(owner, corev1.EventTypeWarning, "QuorumRecovered",
			"etcd restored from snapshot %s onto machine %s as new member %s, keeping revision %d (starts at %d); lost machines %v deleted, what was written after the snapshot is lost",
			st.Snapshot, st.Machine, st.Member, st.Revision, st.StartRevision, st.LostMachines)
		return
	}
	recorder.Eventf(owner, corev1.EventTypeWarning, "QuorumRecovered",
		"etcd recovered from member %s on machine %s as new member %s, keeping revision %d (starts at %d); lost members %v dropped",
		st.FromMember, st.Machine, st.Member, st.Revision, st.StartRevision, st.LostMembers)
}

// forgetOnOwner removes records from the owner, as recordOnOwner sets one.
func (x Executor) forgetOnOwner(ctx context.Context, keys ...string) error {
	a := x.Owner.GetAnnotations()
	nulls := map[string]any{}
	for _, k := range keys {
		if _, ok := a[k]; ok {
			nulls[k] = nil
		}
	}
	if len(nulls) == 0 {
		return nil
	}
	if err := x.patchOwnerAnnotations(ctx, nulls); err != nil {
		return err
	}
	for k := range nulls {
		delete(a, k)
	}
	x.Owner.SetAnnotations(a)
	return nil
}
