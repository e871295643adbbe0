package engine

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/qcp-dev/qcp/internal/quorum"
)

func TestRecordsRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 23, 1, 2, 3, 0, time.UTC)
	m := &clusterv1.Machine{}
	SetRecord(m, MemberIDAnnotation, FormatMemberID(0x8e9e05c52164694d))
	SetRecord(m, JoinStartedAnnotation, FormatTime(at))
	SetRecord(m, LearnerAddedAnnotation, FormatTime(at.Add(time.Second)))
	SetRecord(m, InfraReadyAnnotation, FormatTime(at.Add(-time.Minute)))
	SetRecord(m, DefragStartedAnnotation, FormatTime(at.Add(time.Hour)))
	SetRecord(m, DefragmentedAnnotation, FormatTime(at.Add(2*time.Minute)))
	SetRecord(m, RestartStartedAnnotation, FormatTime(at.Add(3*time.Minute)))
	SetRecord(m, QuotaAnnotation, "33554432")
	r := ReadRecords(m)
	var qm quorum.Machine
	r.Apply(&qm)
	if qm.MemberID != 0x8e9e05c52164694d || !qm.JoinStarted || !qm.InfraReadyAt.Equal(at.Add(-time.Minute)) || !r.LearnerAdded.Equal(at.Add(time.Second)) {
		t.Fatalf("records read back as %+v (machine %+v)", r, qm)
	}
	if !qm.DefragStartedAt.Equal(at.Add(time.Hour)) || !qm.DefragmentedAt.Equal(at.Add(2*time.Minute)) {
		t.Fatalf("defragmentation records read back as started %s, done %s", qm.DefragStartedAt, qm.DefragmentedAt)
	}
	if !qm.RestartStartedAt.Equal(at.Add(3*time.Minute)) || qm.QuotaBackendBytes != 32<<20 {
		t.Fatalf("restart records read back as started %s, quota %d", qm.RestartStartedAt, qm.QuotaBackendBytes)
	}
}

// A damaged record is unknown, never a time long past that fires a timeout
// at once, nor a member ID that maps the machine to the wrong member.
func TestDamagedRecordsAreUnknown(t *testing.T) {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		MemberIDAnnotation:       "not-hex",
		InfraReadyAnnotation:     "yesterday",
		UnhealthySinceAnnotation: "",
		QuotaAnnotation:          "-1",
	}}}
	r := ReadRecords(m)
	if r.MemberID != 0 || !r.InfraReady.IsZero() || !r.UnhealthySince.IsZero() || r.JoinStarted || r.QuotaBackendBytes != 0 {
		t.Fatalf("damaged records read as %+v, want all unknown", r)
	}
}
