package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// threeVoters is a healthy 3-member stacked cluster, member 1 leading,
// each member on a machine that carries the hook.
func threeVoters() quorum.State {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	s := quorum.State{Desired: 3, Topology: quorum.Stacked, Bootstrapped: true, Now: now}
	for i, name := range []string{"m-1", "m-2", "m-3"} {
		url := "https://127.0.0.1" + string(rune('1'+i)) + ":2380"
		s.Machines = append(s.Machines, quorum.Machine{Name: name, PeerURL: url, UpToDate: true, HasHook: true,
			CreatedAt: now.Add(-time.Hour), NodeReady: true, ComponentsHealthy: true})
		s.Members = append(s.Members, quorum.Member{ID: uint64(i + 1), Name: name, PeerURL: url, Healthy: true, Leader: i == 0,
			AppliedIndex: 100, Revision: 50})
	}
	return s
}

// TestStepperJudgesTakenSteps: a step taken is judged against the state it
// was planned on and the owner's next readable observation; what it
// breaks is counted and raised as an event, a measurement's I6 aside, and
// an unreadable observation defers the judgement.
func TestStepperJudgesTakenSteps(t *testing.T) {
	ctx := context.Background()
	owner := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "judged"}}
	metrics := NewMetrics("qcp_test", "test owner")
	violations := func() float64 {
		var d dto.Metric
		if err := metrics.invariantViolations.WithLabelValues("ns", "judged").Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetCounter().GetValue()
	}
	newStepper := func(measuring bool) (*Stepper, *record.FakeRecorder) {
		rec := record.NewFakeRecorder(10)
		return &Stepper{Recorder: rec, Metrics: metrics, MeasuringWithoutLeaderTransfer: measuring}, rec
	}
	before := threeVoters()
	removeLeader := quorum.Decision{Kind: quorum.RemoveMember, MemberID: 1}
	after := threeVoters()
	after.Members = after.Members[1:]

	s, rec := newStepper(false)
	s.took(ctx, owner, before, removeLeader)
	unreadable := quorum.State{Desired: 3, Topology: quorum.Stacked, MembersUnknown: true}
	s.CheckTaken(ctx, owner, unreadable)
	if len(rec.Events) != 0 || violations() != 0 {
		t.Fatalf("judged on an unreadable observation: %d events, %v violations", len(rec.Events), violations())
	}
	s.CheckTaken(ctx, owner, after)
	if len(rec.Events) != 1 || violations() != 1 {
		t.Fatalf("%d events, %v violations; want the leader's removal without a transfer reported once", len(rec.Events), violations())
	}
	if e := <-rec.Events; !strings.Contains(e, "InvariantViolated") || !strings.Contains(e, "I6 leader") {
		t.Errorf("event %q, want InvariantViolated naming I6", e)
	}
	s.CheckTaken(ctx, owner, after) // judged once only
	if violations() != 1 {
		t.Errorf("%v violations after a second observation, want the step judged once", violations())
	}

	// A measurement that skips leadership transfers breaks I6 on purpose.
	s, rec = newStepper(true)
	s.took(ctx, owner, before, removeLeader)
	s.CheckTaken(ctx, owner, after)
	if len(rec.Events) != 0 || violations() != 1 {
		t.Errorf("measuring: %d events, %v violations; want the I6 violation ignored", len(rec.Events), violations())
	}

	// A member that appears as a voter after a learner was asked for
	// breaks I3, which only the next observation shows; a step still
	// waiting when the next is taken is judged on its own state.
	s, rec = newStepper(false)
	joined := threeVoters()
	joined.Members = append(joined.Members, quorum.Member{ID: 9, Name: "m-4", PeerURL: "https://127.0.0.14:2380", Healthy: true})
	s.took(ctx, owner, before, quorum.Decision{Kind: quorum.AddLearner, Machine: "m-4"})
	s.CheckTaken(ctx, owner, joined)
	if len(rec.Events) != 1 || violations() != 2 {
		t.Fatalf("%d events, %v violations; want the voter that joined directly reported", len(rec.Events), violations())
	}
	if e := <-rec.Events; !strings.Contains(e, "I3 learners first") {
		t.Errorf("event %q, want I3", e)
	}
	s.took(ctx, owner, before, removeLeader)
	s.took(ctx, owner, before, quorum.Decision{Kind: quorum.MoveLeader, MemberID: 2})
	if len(rec.Events) != 1 || violations() != 3 {
		t.Errorf("%d events, %v violations; want the unjudged removal judged on its own state when the next step came", len(rec.Events), violations())
	}
}
