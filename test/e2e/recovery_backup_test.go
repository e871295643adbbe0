package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/ptr"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/objectstore"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// fromBackupInterval is TestRecoverFromBackup's backup schedule.
const fromBackupInterval = 15 * time.Second

// recoverFromBackup has cp back up every interval into srv's bucket
// "backups" (prefix e2e, the last 3 kept), with the credentials Secret
// secretName, under the quorum-loss policy FromBackup with recoveryAfter.
func recoverFromBackup(cp *controlplanev1.QuorumControlPlane, srv *objectstore.Server, secretName string, interval time.Duration) {
	cp.Spec.Backup = &controlplanev1.BackupSpec{
		Target:    controlplanev1.BackupTarget{Endpoint: srv.Endpoint, Bucket: "backups", Prefix: "e2e", CredentialsSecret: secretName},
		Schedule:  controlplanev1.BackupSchedule{IntervalSeconds: ptr.To(int32(interval / time.Second))},
		Retention: controlplanev1.BackupRetention{KeepLast: ptr.To[int32](3)},
	}
	cp.Spec.QuorumLossRecovery = &controlplanev1.QuorumLossRecovery{
		Policy: controlplanev1.RecoveryFromBackup, AfterSeconds: ptr.To(int32(recoveryAfter / time.Second)),
	}
}

// TestRecoverFromBackup: a 1-machine control plane backs up every 15 s
// under writes, with the quorum-loss policy FromBackup; its only machine is
// killed. QCP restores the newest verified snapshot onto a new machine: the
// recovery's record names that snapshot and its revision, the lost machine
// is deleted, and the new one serves exactly the snapshot's data from a
// revision above it. The writes acknowledged after the snapshot are what
// the recovery loses: they are counted, with the snapshot's age at the
// kill, against the schedule.
func TestRecoverFromBackup(t *testing.T) {
	mgmt := requireShared(t)
	testkit.RequireBinaries(t, "versitygw")
	parallel(t, 4*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	name := "frombackup"
	srv, _ := testkit.StartObjectStore(t, "backups")
	target := testkit.StoreTarget(srv, "backups")
	target.Prefix = "e2e"
	store, err := s3store.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	storeSecret(t, mgmt, name+"-s3", srv)
	s := newScenario(t, mgmt, name, 1, func(cp *controlplanev1.QuorumControlPlane) {
		recoverFromBackup(cp, srv, name+"-s3", fromBackupInterval)
	})
	s.waitAvailable(convergeTimeout, 1)
	lost := s.settled(convergeTimeout, 1)[0]
	cfg, err := s.etcdConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, err := testkit.StartWriter(cfg, testkit.WriterOptions{Pause: scenarioWriterPause})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitAcknowledged(ctx, 20); err != nil {
		t.Fatal(err)
	}
	ref := backup.ClusterRef{Namespace: ns, Kind: "QuorumControlPlane", Name: name}
	s.snapshotAfter(store, ref, time.Now())

	// The schedule stops, so that the snapshot a recovery restores is known
	// before the kill: once status.backup shows the next one a day away,
	// the round that took any snapshot in flight has ended.
	s.setBackup(ctx, func(b *controlplanev1.BackupSpec) { b.Schedule.IntervalSeconds = ptr.To[int32](86400) })
	s.eventually(2*time.Minute, "the schedule stopped", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if st := cp.Status.Backup; st == nil || st.NextTime == nil || st.NextTime.Time.Before(time.Now().Add(time.Hour)) {
			return fmt.Errorf("status.backup %+v", cp.Status.Backup)
		}
		return nil
	})
	manifests, _, err := engine.StoredBackups(ctx, store, ref)
	if err != nil {
		t.Fatal(err)
	}
	manifests = slices.DeleteFunc(manifests, func(m backup.Manifest) bool { return m.Verified == nil })
	newest := slices.MaxFunc(manifests, func(a, b backup.Manifest) int { return a.Started.Compare(b.Started) })
	atSnapshot := s.writerKeys(ctx, newest.Revision)
	// Writes after the snapshot: what the recovery loses.
	if err := w.WaitAcknowledged(ctx, w.Acknowledged()+20); err != nil {
		t.Fatal(err)
	}
	wr := w.Stop(ctx)
	if err := wr.Err(); err != nil {
		t.Errorf("before the kill: %v", err)
	}
	beforeKill := s.writerKeys(ctx, 0)

	host := &machinehost.Host{Root: mgmt.env.MachineRoot()}
	killed := time.Now()
	if err := host.Kill(ns, lost.Name); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s, the only machine; newest verified snapshot %s (revision %d) began %s before",
		lost.Name, newest.Snapshot, newest.Revision, killed.Sub(newest.Started).Round(time.Millisecond))
	var rec *controlplanev1.RecoveryStatus
	s.eventually(6*time.Minute, "QCP restoring etcd from the newest snapshot", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if rec = cp.Status.Recovery; rec == nil || rec.FinishTime == nil {
			return fmt.Errorf("no finished recovery; last operation %s: %s", cp.Status.LastOperation.Kind, cp.Status.LastOperation.Reason)
		}
		return nil
	})
	recovered := time.Now()
	cp := s.waitAvailable(convergeTimeout, 1)
	if rec.Snapshot != newest.Snapshot || rec.Revision != newest.Revision || rec.StartRevision != rec.Revision+backup.BumpRevision ||
		!slices.Equal(rec.LostMachines, []string{lost.Name}) || rec.Trigger != "Policy" {
		t.Errorf("the recovery's record %+v; want snapshot %s at revision %d, lost machine %s, by the policy", rec, newest.Snapshot, newest.Revision, lost.Name)
	}
	if started := rec.StartTime.Time; started.Before(killed.Add(recoveryAfter)) {
		t.Errorf("the recovery started %s after the kill, before the policy's %s", started.Sub(killed), recoveryAfter)
	}
	ms, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ms {
		names = append(names, m.Name)
	}
	if len(names) != 1 || names[0] == lost.Name || names[0] != rec.Machine {
		t.Errorf("machines %v after the recovery; want one new machine, %s", names, rec.Machine)
	}
	if cp.Status.Recovery == nil || cp.Status.Recovery.Member == "" {
		t.Errorf("status.recovery names no new member: %+v", cp.Status.Recovery)
	}
	restored := s.writerKeys(ctx, 0)
	if !maps.Equal(restored, atSnapshot) {
		t.Errorf("the restored etcd holds %d writer keys, not the %d the snapshot held at revision %d", len(restored), len(atSnapshot), newest.Revision)
	}
	cli, _, err := s.etcdClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	resp, err := cli.Raw().Get(ctx, writerPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Revision < rec.StartRevision {
		t.Errorf("the restored etcd serves revision %d, below its start %d", resp.Header.Revision, rec.StartRevision)
	}
	if _, err := cli.Raw().Get(ctx, writerPrefix, clientv3.WithPrefix(), clientv3.WithRev(rec.Revision)); err == nil {
		t.Errorf("a read at the snapshot's revision %d succeeded; the restore marks it compacted, so that watchers from before relist", rec.Revision)
	}
	lostWrites := 0
	for k, v := range beforeKill {
		if restored[k] != v {
			lostWrites++
		}
	}
	if lostWrites == 0 {
		t.Error("no write acknowledged after the snapshot was lost: the scenario wrote nothing after it, or the restore holds newer data than the snapshot")
	}
	t.Logf("restored snapshot %s (revision %d, begun %s before the kill; schedule %s) onto %s in %s after the kill, Available %s later; writes lost: %d keys changed since the snapshot; writer before the kill: %s",
		rec.Snapshot, rec.Revision, killed.Sub(newest.Started).Round(time.Millisecond), fromBackupInterval, rec.Machine,
		rec.FinishTime.Sub(killed).Round(time.Millisecond), time.Since(recovered).Round(time.Second), lostWrites, wr)
	s.finish()
}

// writerKeys reads the writer's keys at revision rev (0: the newest).
func (s *scenario) writerKeys(ctx context.Context, rev int64) map[string]string {
	s.t.Helper()
	cli, _, err := s.etcdClient(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	defer cli.Close()
	var resp *clientv3.GetResponse
	if err := retry(ctx, func(ctx context.Context) (err error) {
		resp, err = cli.Raw().Get(ctx, writerPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev))
		return err
	}); err != nil {
		s.t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	if len(out) == 0 {
		s.t.Fatalf("no writer key at revision %d", rev)
	}
	return out
}
