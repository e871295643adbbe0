package controlplane

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
	setRecord(m, MemberIDAnnotation, formatMemberID(0x8e9e05c52164694d))
	setRecord(m, JoinStartedAnnotation, formatTime(at))
	setRecord(m, LearnerAddedAnnotation, formatTime(at.Add(time.Second)))
	setRecord(m, InfraReadyAnnotation, formatTime(at.Add(-time.Minute)))
	r := readRecords(m)
	var qm quorum.Machine
	r.apply(&qm)
	if qm.MemberID != 0x8e9e05c52164694d || !qm.JoinStarted || !qm.InfraReadyAt.Equal(at.Add(-time.Minute)) || !r.learnerAdded.Equal(at.Add(time.Second)) {
		t.Fatalf("records read back as %+v (machine %+v)", r, qm)
	}
}

// A damaged record is unknown, never a time long past that fires a timeout
// at once, nor a member ID that maps the machine to the wrong member.
func TestDamagedRecordsAreUnknown(t *testing.T) {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		MemberIDAnnotation:       "not-hex",
		InfraReadyAnnotation:     "yesterday",
		UnhealthySinceAnnotation: "",
	}}}
	r := readRecords(m)
	if r.memberID != 0 || !r.infraReady.IsZero() || !r.unhealthySince.IsZero() || r.joinStarted {
		t.Fatalf("damaged records read as %+v, want all unknown", r)
	}
}
