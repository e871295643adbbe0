package controlplane

import (
	"errors"
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

// The role label follows the member: set, changed with the leadership,
// kept while the membership cannot be read, and removed with the member.
func TestEtcdRoleLabel(t *testing.T) {
	now := time.Date(2026, 11, 23, 1, 2, 3, 0, time.UTC)
	m := observedMachine("cp-1")
	obs := &observation{members: []quorum.Member{{ID: 0xa1, Name: "cp-1", Learner: true}}}
	for _, step := range []struct {
		member quorum.Member
		err    error
		want   string
	}{
		{quorum.Member{ID: 0xa1, Name: "cp-1", Learner: true}, nil, "learner"},
		{quorum.Member{ID: 0xa1, Name: "cp-1", Leader: true, Healthy: true}, nil, "leader"},
		{quorum.Member{ID: 0xa1, Name: "cp-1", Healthy: true}, nil, "voter"},
		{quorum.Member{ID: 0xb2, Name: "cp-2"}, errors.New("no quorum"), "voter"},
		{quorum.Member{ID: 0xb2, Name: "cp-2"}, nil, ""},
	} {
		obs.members, obs.membersErr = []quorum.Member{step.member}, step.err
		keepRecords(m, obs, now)
		if got := m.Labels[EtcdRoleLabel]; got != step.want {
			t.Errorf("member %+v (read error %v): role label %q, want %q", step.member, step.err, got, step.want)
		}
	}
}
