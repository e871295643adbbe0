package engine

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// TestBackupScheduleAndStatus: a first snapshot is due at once; the next
// one the schedule's interval after the last success; a failure after it
// holds the next attempt back by BackupRetry; and status.backup and
// BackupsHealthy follow the records, a configuration error first.
func TestBackupScheduleAndStatus(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	sched, err := backup.ParseSchedule(ptr.To[int32](600), "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &BackupConfig{Schedule: sched}
	spec := &controlplanev1.BackupSpec{}
	owner := &controlplanev1.QuorumControlPlane{}
	record := func(key string, r controlplanev1.BackupRecord) {
		b, _ := json.Marshal(r)
		if owner.Annotations == nil {
			owner.Annotations = map[string]string{}
		}
		owner.Annotations[key] = string(b)
	}
	due := func(at time.Time) bool {
		s := quorum.State{Now: at}
		ReadBackup(owner, spec, cfg, nil, &s)
		return s.Backup.Due
	}
	if !due(now) {
		t.Error("no snapshot yet, and none due")
	}
	s := quorum.State{Now: now}
	if ReadBackup(owner, spec, nil, errors.New("no Secret"), &s); s.Backup.Due || s.Backup.Problem != "no Secret" || !s.Backup.Configured {
		t.Errorf("with a broken configuration: %+v", s.Backup)
	}
	s = quorum.State{Now: now}
	if ReadBackup(owner, nil, nil, nil, &s); s.Backup.Configured || s.Backup.Due {
		t.Errorf("without spec.backup: %+v", s.Backup)
	}
	if st, c := BackupStatus(owner, spec, cfg, nil); c.Status != metav1.ConditionUnknown || st.LastSuccessful != nil {
		t.Errorf("before the first: %+v, %+v", st, c)
	}

	record(BackupSucceededAnnotation, controlplanev1.BackupRecord{Time: metav1.NewTime(now), Object: "a.db", Revision: 42, SizeBytes: 10, Member: "m-2", Stored: 3})
	if due(now.Add(9*time.Minute)) || !due(now.Add(10*time.Minute)) {
		t.Error("the interval does not count from the last success")
	}
	st, c := BackupStatus(owner, spec, cfg, nil)
	if c.Status != metav1.ConditionTrue || st.Stored != 3 || st.LastSuccessful.Revision != 42 || !st.NextTime.Time.Equal(now.Add(10*time.Minute)) ||
		!strings.Contains(c.Message, "revision 42") {
		t.Errorf("after a success: %+v, %+v", st, c)
	}

	failedAt := now.Add(10 * time.Minute)
	record(BackupFailedAnnotation, controlplanev1.BackupRecord{Time: metav1.NewTime(failedAt), Message: "NoSuchBucket: the bucket does not exist"})
	if due(failedAt.Add(30*time.Second)) || !due(failedAt.Add(BackupRetry)) {
		t.Error("a failure does not hold the next attempt back by BackupRetry")
	}
	s = quorum.State{Now: failedAt}
	if ReadBackup(owner, spec, cfg, nil, &s); !s.Backup.RetryAt.Equal(failedAt.Add(BackupRetry)) || !s.Backup.LastVerified.Equal(now) || s.Backup.MaxAgeBeforeRisky != time.Hour {
		t.Errorf("after a failure: %+v", s.Backup)
	}
	if _, c := BackupStatus(owner, spec, cfg, nil); c.Status != metav1.ConditionFalse || c.Reason != controlplanev1.BackupFailedReason || !strings.Contains(c.Message, "NoSuchBucket") {
		t.Errorf("after a failure: %+v", c)
	}
	if _, c := BackupStatus(owner, spec, nil, errors.New("Secret ns/x does not exist")); c.Reason != controlplanev1.BackupConfigInvalidReason || !strings.Contains(c.Message, "ns/x") {
		t.Errorf("with a configuration error: %+v", c)
	}
	if st, c := BackupStatus(owner, nil, nil, nil); st != nil || c != nil {
		t.Errorf("without spec.backup: %+v, %+v", st, c)
	}
}

// TestRiskyStepAgeCountsFromVerification: the age a risky step allows a
// snapshot counts from its verification, so that a snapshot that took
// longer than that age (25 s here, against 10) lets the step go once
// verified; a record written before verifiedTime existed counts from its
// start.
func TestRiskyStepAgeCountsFromVerification(t *testing.T) {
	now := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	spec := &controlplanev1.BackupSpec{MaxAgeBeforeRiskyChangeSeconds: ptr.To[int32](10)}
	sched, err := backup.ParseSchedule(ptr.To[int32](86400), "")
	if err != nil {
		t.Fatal(err)
	}
	started, verified := now.Add(-26*time.Second), now.Add(-time.Second)
	for _, c := range []struct {
		name string
		rec  controlplanev1.BackupRecord
		want time.Time
	}{
		{"verified", controlplanev1.BackupRecord{Time: metav1.NewTime(started), VerifiedTime: &metav1.Time{Time: verified}}, verified},
		{"written before verifiedTime", controlplanev1.BackupRecord{Time: metav1.NewTime(started)}, started},
	} {
		b, _ := json.Marshal(c.rec)
		owner := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{BackupSucceededAnnotation: string(b)}}}
		s := quorum.State{Now: now}
		ReadBackup(owner, spec, &BackupConfig{Schedule: sched}, nil, &s)
		if !s.Backup.LastVerified.Equal(c.want) || s.Backup.MaxAgeBeforeRisky != 10*time.Second {
			t.Errorf("%s: LastVerified %v, MaxAgeBeforeRisky %v; want %v and 10s", c.name, s.Backup.LastVerified, s.Backup.MaxAgeBeforeRisky, c.want)
		}
	}
}

// TestLoadBackupNamesTheSecretAtFault: each missing Secret or key, and a
// key that is no age identity, is refused naming the Secret, the field and
// the fix.
func TestLoadBackupNamesTheSecretAtFault(t *testing.T) {
	owner := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1"}}
	spec := &controlplanev1.BackupSpec{
		Target:     controlplanev1.BackupTarget{Endpoint: "https://s3.example.com", Bucket: "b", CredentialsSecret: "creds"},
		Schedule:   controlplanev1.BackupSchedule{Cron: "@hourly"},
		Encryption: &controlplanev1.BackupEncryption{KeySecret: "key"},
	}
	key, _ := backup.NewKey()
	secret := func(name string, data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	creds := secret("creds", map[string]string{BackupAccessKeyIDKey: "a", BackupSecretAccessKeyKey: "s"})
	for _, tc := range []struct {
		name    string
		objs    []client.Object
		wantErr string
	}{
		{"no credentials Secret", nil, "Secret ns/creds (spec.backup.target.credentialsSecret) does not exist: create it with the keys accessKeyID and secretAccessKey"},
		{"no secret access key", []client.Object{secret("creds", map[string]string{BackupAccessKeyIDKey: "a"})}, `Secret ns/creds (spec.backup.target.credentialsSecret) has no key "secretAccessKey"`},
		{"no key Secret", []client.Object{creds}, "Secret ns/key (spec.backup.encryption.keySecret) does not exist"},
		{"a key that is no age identity", []client.Object{creds, secret("key", map[string]string{BackupEncryptionKeyKey: "password"})}, "not an age identity"},
		{"all there", []client.Object{creds, secret("key", map[string]string{BackupEncryptionKeyKey: string(key)})}, ""},
	} {
		c := fake.NewClientBuilder().WithObjects(tc.objs...).Build()
		cfg, err := LoadBackup(t.Context(), c, owner, "QuorumControlPlane", spec)
		switch {
		case tc.wantErr == "" && (err != nil || cfg.Encryption == nil || cfg.Target.AccessKeyID != "a" || cfg.Owner.Name != "c1"):
			t.Errorf("%s: %+v, %v", tc.name, cfg, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: %v; want %q", tc.name, err, tc.wantErr)
		}
	}
	if cfg, err := LoadBackup(t.Context(), fake.NewClientBuilder().Build(), owner, "QuorumControlPlane", nil); cfg != nil || err != nil {
		t.Errorf("without spec.backup: %+v, %v", cfg, err)
	}
}
