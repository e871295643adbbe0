package testkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// TestMonitorFlagsViolations feeds the monitor member lists made for the
// purpose, through the same path live samples take: a clean replacement
// passes, and each invariant the monitor checks (I1 quorum, I2 bounded, I3
// learners first) is flagged when a sample breaks it.
func TestMonitorFlagsViolations(t *testing.T) {
	voter := func(id uint64, healthy bool) quorum.Member {
		return quorum.Member{ID: id, Name: string(rune('a' + id - 1)), Healthy: healthy}
	}
	learner := func(id uint64) quorum.Member {
		m := voter(id, true)
		m.Learner = true
		return m
	}
	a, b, c, d := voter(1, true), voter(2, true), voter(3, true), voter(4, true)
	// unreadable stands for a sample whose member list could not be read.
	var unreadable []quorum.Member
	cases := []struct {
		name    string
		desired int
		// scaleTo, when set, is the desired count after the first sample.
		scaleTo int
		samples [][]quorum.Member
		// want lists what each violation must name, in order; none for a clean run.
		want []string
	}{
		{
			name: "a replacement through a learner, with an unreadable sample, is clean", desired: 3,
			samples: [][]quorum.Member{{a, b, c}, {a, b, c, learner(4)}, unreadable, {a, b, c, d}, {b, c, d}},
		},
		{
			name: "a voter removed while two of three are down loses quorum", desired: 3,
			samples: [][]quorum.Member{{a, voter(2, false), voter(3, false)}, {a, voter(2, false)}},
			want:    []string{"I1 quorum"},
		},
		{
			name: "two more voters than desired", desired: 3,
			samples: [][]quorum.Member{{a, b, c, d, voter(5, true)}},
			want:    []string{"I2 bounded: 5 voters"},
		},
		{
			name: "two learners at once", desired: 3,
			samples: [][]quorum.Member{{a, b, c, learner(4), learner(5)}},
			want:    []string{"I2 bounded: 2 learners"},
		},
		{
			name: "a member joining as a voter", desired: 3,
			samples: [][]quorum.Member{{a, b, c}, {a, b, c, d}},
			want:    []string{"I3 learners first"},
		},
		{
			name: "voters growing back during a scale down", desired: 3, scaleTo: 1,
			samples: [][]quorum.Member{{a, b, c}, {a, b}, {a, b, learner(4)}, {a, b, d}},
			want:    []string{"I2 bounded: 3 voters, more than desired 1"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newMonitor(tc.desired)
			at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
			for i, s := range tc.samples {
				var err error
				if s == nil {
					err = errors.New("no leader")
				}
				t := at.Add(time.Duration(i) * 200 * time.Millisecond)
				m.record(t, t, t, s, err)
				if i == 0 && tc.scaleTo != 0 {
					m.SetDesired(tc.scaleTo)
				}
			}
			r := m.report
			if r.Samples != len(tc.samples) {
				t.Errorf("counted %d samples, fed %d", r.Samples, len(tc.samples))
			}
			if len(r.Violations) != len(tc.want) {
				t.Fatalf("violations %v, want %d naming %q", r.Violations, len(tc.want), tc.want)
			}
			for i, v := range r.Violations {
				if !strings.Contains(v.Err.Error(), tc.want[i]) {
					t.Errorf("violation %d is %v, want one naming %q", i, v, tc.want[i])
				}
			}
			if (r.Err() == nil) != (len(tc.want) == 0) {
				t.Errorf("report error %v with violations %v", r.Err(), r.Violations)
			}
		})
	}
}

// TestMonitorCountsUnreadableSamples checks that a sample without a member
// list is counted as unobserved and does not break the comparison: the
// samples either side of it are still compared with each other.
func TestMonitorCountsUnreadableSamples(t *testing.T) {
	a, b, c := quorum.Member{ID: 1, Healthy: true}, quorum.Member{ID: 2, Healthy: true}, quorum.Member{ID: 3, Healthy: true}
	m := newMonitor(3)
	now := time.Now()
	m.record(now, now, now, []quorum.Member{a, b}, nil)
	m.record(now, now, now, nil, errors.New("no leader"))
	m.record(now, now, now, []quorum.Member{a, b, c}, nil)
	r := m.report
	if r.Unobserved != 1 || r.Samples != 3 {
		t.Errorf("samples %d, unobserved %d; want 3 and 1", r.Samples, r.Unobserved)
	}
	if len(r.Violations) != 1 || !strings.Contains(r.Violations[0].Err.Error(), "I3") {
		t.Errorf("violations %v, want c joining as a voter across the unreadable sample", r.Violations)
	}
	if r.MaxVoters != 3 {
		t.Errorf("max voters %d, want 3", r.MaxVoters)
	}
}

// TestMonitorListsLeadersRemoved: a member that led in one sample and is
// gone in the next was removed without a leader transfer; one that handed
// leadership over first is not listed.
func TestMonitorListsLeadersRemoved(t *testing.T) {
	leader := func(id uint64, leads bool) quorum.Member { return quorum.Member{ID: id, Healthy: true, Leader: leads} }
	now := time.Now()
	m := newMonitor(3)
	m.record(now, now, now, []quorum.Member{leader(1, true), leader(2, false), leader(3, false), leader(4, false)}, nil)
	m.record(now, now, now, []quorum.Member{leader(1, false), leader(2, true), leader(3, false), leader(4, false)}, nil)
	m.record(now, now, now, []quorum.Member{leader(2, true), leader(3, false), leader(4, false)}, nil)
	if got := m.report.LeadersRemoved; len(got) != 0 {
		t.Fatalf("leaders removed %v after a transfer, want none", got)
	}
	m.record(now, now, now, []quorum.Member{leader(3, false), leader(4, false)}, nil)
	if got := m.report.LeadersRemoved; len(got) != 1 || !strings.Contains(got[0], "[2 voter,leader]") {
		t.Errorf("leaders removed %v, want member 2, removed while it led", got)
	}
}

// member is a healthy voter that leads or not; at is a time d into a test.
func member(id uint64, leads bool) quorum.Member {
	return quorum.Member{ID: id, Healthy: true, Leader: leads}
}

func at(d time.Duration) time.Time { return time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).Add(d) }

// TestMonitorJudgesNoLongGap: two readable samples that span more than
// maxSampleGap (a slow or unreadable one between them) are not compared, since
// leadership may have moved, or a learner been promoted, unseen in between;
// the gap is reported instead. Within maxSampleGap they are compared as ever.
func TestMonitorJudgesNoLongGap(t *testing.T) {
	m := newMonitor(3)
	m.record(at(0), at(50*time.Millisecond), at(50*time.Millisecond), []quorum.Member{member(1, true), member(2, false), member(3, false), member(4, false)}, nil)
	m.record(at(250*time.Millisecond), at(5*time.Second), at(5*time.Second), nil, errors.New("context deadline exceeded"))
	m.record(at(5*time.Second), at(5100*time.Millisecond), at(5100*time.Millisecond), []quorum.Member{member(2, true), member(3, false), member(4, false), member(5, false)}, nil)
	r := m.result()
	if len(r.LeadersRemoved) != 0 || len(r.Violations) != 0 {
		t.Errorf("judged across a 5-s gap: leaders removed %v, violations %v", r.LeadersRemoved, r.Violations)
	}
	if len(r.Gaps) != 1 || !strings.Contains(r.Gaps[0], "5.1s since the previous readable sample started") || r.Judged != 0 {
		t.Errorf("gaps %q, %d pairs judged; want the one of 5.1 s, and none judged", r.Gaps, r.Judged)
	}
	if len(r.LeadersGoneInGaps) != 1 || !strings.Contains(r.LeadersGoneInGaps[0], "[1 voter,leader] ") {
		t.Errorf("leaders gone in gaps %q, want member 1, which led before the gap", r.LeadersGoneInGaps)
	}

	// The same pair within maxSampleGap is judged: member 1 removed while it led
	// (no other member leads yet), and member 5 joining as a voter.
	m = newMonitor(3)
	m.record(at(0), at(50*time.Millisecond), at(50*time.Millisecond), []quorum.Member{member(1, true), member(2, false), member(3, false), member(4, false)}, nil)
	m.record(at(250*time.Millisecond), at(300*time.Millisecond), at(300*time.Millisecond), []quorum.Member{member(2, false), member(3, false), member(4, false), member(5, false)}, nil)
	r = m.result()
	if len(r.LeadersRemoved) != 1 || len(r.Violations) != 1 || len(r.Gaps) != 0 || len(r.LeadersGoneInGaps) != 0 || r.Judged != 1 {
		t.Errorf("leaders removed %v, violations %v, gaps %v; want member 1 removed while it led, member 5 joining as a voter, no gap", r.LeadersRemoved, r.Violations, r.Gaps)
	}
}

// TestMonitorSeesHandOverBetweenSamples: QCP can move leadership and remove
// the old leader within one sampling interval, so one sample shows the old
// leader and the next another member leading without it. Within etcd's
// shortest election (minElection) of the first sample, that new leader can
// only come from a transfer before the removal, so it is no I6 report;
// later, an election after a removal without one could explain it, and it
// still is.
func TestMonitorSeesHandOverBetweenSamples(t *testing.T) {
	before := []quorum.Member{member(1, true), member(2, false), member(3, false), member(4, false)}
	after := []quorum.Member{member(2, true), member(3, false), member(4, false)}
	for _, c := range []struct {
		name     string
		done     time.Duration
		reported bool
	}{
		{"the next sample's statuses answered 500 ms after the first began", 500 * time.Millisecond, false},
		{"the next sample's statuses answered 1.2 s after the first began", 1200 * time.Millisecond, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMonitor(3)
			m.record(at(0), at(50*time.Millisecond), at(60*time.Millisecond), before, nil)
			m.record(at(400*time.Millisecond), at(450*time.Millisecond), at(c.done), after, nil)
			r := m.result()
			if got := len(r.LeadersRemoved) > 0; got != c.reported {
				t.Errorf("leaders removed %q; want a report: %v", r.LeadersRemoved, c.reported)
			}
			if r.Judged != 1 || len(r.Violations) != 0 {
				t.Errorf("%d pairs judged, violations %v; want 1 judged, none broken", r.Judged, r.Violations)
			}
		})
	}
}

// TestMonitorCountsLearnersTheMembersSaw: a member that joins and is
// promoted between two samples first appears as a voter, which the monitor
// judges a voter that joined directly (I3), unless a member's own view,
// read between the samples, listed it as a learner.
func TestMonitorCountsLearnersTheMembersSaw(t *testing.T) {
	before := []quorum.Member{member(1, true), member(2, false)}
	after := []quorum.Member{member(1, true), member(2, false), member(3, false)}
	for _, seen := range []bool{false, true} {
		m := newMonitor(3)
		m.record(at(0), at(50*time.Millisecond), at(60*time.Millisecond), before, nil)
		if seen {
			m.recordView(at(200*time.Millisecond), etcd.LocalView{ID: 2, Leader: 1, Members: []uint64{1, 2, 3}, Learners: []uint64{3}})
		} else {
			m.recordView(at(200*time.Millisecond), etcd.LocalView{ID: 2, Leader: 1, Members: []uint64{1, 2}})
		}
		m.record(at(400*time.Millisecond), at(450*time.Millisecond), at(460*time.Millisecond), after, nil)
		r := m.result()
		flagged := len(r.Violations) == 1 && strings.Contains(r.Violations[0].Err.Error(), "I3 learners first: member 3 joined as a voter")
		if flagged == seen || (!flagged && len(r.Violations) != 0) {
			t.Errorf("learner seen by a member's view: %v; violations %v", seen, r.Violations)
		}
	}
}

// TestMonitorJudgesLeaderFollowedAfterRemoval: across a sample gap, a
// leader that a member still followed after applying its removal was
// removed while it led. A leader a lagging member follows before it has
// applied the leader's addition is not: it is still listed.
func TestMonitorJudgesLeaderFollowedAfterRemoval(t *testing.T) {
	m := newMonitor(3)
	m.record(at(0), at(50*time.Millisecond), at(50*time.Millisecond), []quorum.Member{member(1, true), member(2, false), member(3, false), member(4, false)}, nil)
	// Member 3 lags: it follows 4 before it has applied 4's addition.
	m.recordView(at(time.Second), etcd.LocalView{ID: 3, Leader: 4, Members: []uint64{1, 2, 3}})
	// Member 2 has applied 1's removal and still follows 1.
	m.recordView(at(time.Second), etcd.LocalView{ID: 2, Leader: 1, Members: []uint64{2, 3, 4}})
	m.recordView(at(time.Second), etcd.LocalView{ID: 2, Leader: 1, Members: []uint64{2, 3, 4}})
	m.record(at(3*time.Second), at(3100*time.Millisecond), at(3100*time.Millisecond), []quorum.Member{member(2, false), member(3, false), member(4, true)}, nil)
	r := m.result()
	if len(r.LeadersRemoved) != 1 || !strings.Contains(r.LeadersRemoved[0], "member 2 still followed 1 after applying its removal") {
		t.Errorf("leaders removed %q, want member 1, which member 2 still followed after its removal", r.LeadersRemoved)
	}
	if len(r.LeadersGoneInGaps) != 0 || len(r.Gaps) != 1 {
		t.Errorf("leaders gone in gaps %q, gaps %q; want the gap only, its leader judged", r.LeadersGoneInGaps, r.Gaps)
	}
}

// TestMonitorProbesLeaderRemovals removes leaders from real etcd members
// with a long election timeout: the remaining members follow a leader
// removed without a transfer until they elect another, which the probe of
// their own views sees while every member list request waits. The monitor
// samples only on demand here, so the one sample pair around that removal
// spans the election and cannot judge it; the probe must.
func TestMonitorProbesLeaderRemovals(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := NewEtcdCluster(t, "leaderrm")
	cl.ExtraArgs = []string{"--heartbeat-interval=300", "--election-timeout=3000"}
	ps, err := cl.Bootstrap(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	cli := cl.NewClient(ps...)
	mon := StartMonitor(cli, 4, time.Hour)
	first, err := cli.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var next uint64
	for _, p := range ps {
		if s, err := cli.Status(ctx, p.ClientURL()); err == nil && s.ID != first.ID {
			next = s.ID
			break
		}
	}
	// With a transfer: the new leader commits the removal.
	if err := cli.MoveLeader(ctx, next); err != nil {
		t.Fatal(err)
	}
	mon.SampleNow(ctx)
	// etcd refuses a removal ("unhealthy cluster") until the members left
	// have been connected for a few seconds.
	remove := func(id uint64) {
		t.Helper()
		if err := Eventually(ctx, 100*time.Millisecond, "member removed", func(ctx context.Context) error { return cli.Remove(ctx, id) }); err != nil {
			t.Fatal(err)
		}
	}
	remove(first.ID)
	mon.SampleNow(ctx)
	// Without: the others follow the removed leader until they elect one.
	remove(next)
	if err := Eventually(ctx, 100*time.Millisecond, "a leader elected after the removal", func(ctx context.Context) error {
		s, err := cli.Leader(ctx)
		if err == nil && s.ID == next {
			return fmt.Errorf("%x still leads", next)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	mon.SampleNow(ctx)
	r := mon.Stop()
	if len(r.LeadersRemoved) != 1 || !strings.Contains(r.LeadersRemoved[0], fmt.Sprintf("still followed %x after applying its removal", next)) {
		t.Errorf("leaders removed %q, want %x (removed while it led, seen by the probe), and not %x (handed over first)", r.LeadersRemoved, next, first.ID)
	}
	if len(r.LeadersGoneInGaps) != 0 {
		t.Errorf("leaders gone in gaps %q, want none: the probe judged the removal", r.LeadersGoneInGaps)
	}
}

// TestMonitorFlagsTwoClusters: members of two clusters that each follow a
// leader in one probe round are two clusters serving (I9); a member
// without a leader, or one cluster, is not.
func TestMonitorFlagsTwoClusters(t *testing.T) {
	m := newMonitor(3)
	now := time.Now()
	m.recordRound(now, []etcd.LocalView{{ID: 1, Leader: 1, ClusterID: 0xa}, {ID: 2, Leader: 1, ClusterID: 0xa}, {ID: 9, ClusterID: 0xb}})
	if err := m.result().Err(); err != nil {
		t.Fatalf("one cluster with a leader and a member of another without one: %v", err)
	}
	m.recordRound(now, []etcd.LocalView{{ID: 1, Leader: 1, ClusterID: 0xa}, {ID: 9, Leader: 9, ClusterID: 0xb}})
	err := m.result().Err()
	if err == nil || !strings.Contains(err.Error(), "I9 one cluster") {
		t.Fatalf("two clusters each with a leader: %v; want an I9 violation", err)
	}
}

// TestMonitorJudgesWhileAMemberIsDead kills a follower of a real 3-member
// cluster and keeps sampling: the killed member stays listed (nothing
// removes it), and its status request waits out etcd.StatusTimeout each
// time. The first sample after the kill waits it out and finds the member
// down; the later ones do not ask it again (a loop of its own does) and
// stay close enough to judge every pair. When each sample waited for every
// status, every pair spanned more than a second and none was judged until
// the member was replaced.
func TestMonitorJudgesWhileAMemberIsDead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cl := NewEtcdCluster(t, "deadmember")
	ps, err := cl.Bootstrap(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	cli := cl.NewClient(ps...)
	mon := StartMonitor(cli, 3, time.Hour)
	leader, err := cli.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var victim *EtcdProcess
	var victimID uint64
	for _, p := range ps {
		if s, err := cli.Status(ctx, p.ClientURL()); err == nil && s.ID != leader.ID {
			victim, victimID = p, s.ID
			break
		}
	}
	if victim == nil {
		t.Fatal("no follower answered its status")
	}
	mon.SampleNow(ctx)
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	observed := func() (healthy, listed bool) {
		mon.mu.Lock()
		defer mon.mu.Unlock()
		for _, mb := range mon.prev {
			if mb.ID == victimID {
				return mb.Healthy, true
			}
		}
		return false, false
	}
	if err := Eventually(ctx, 100*time.Millisecond, "the killed member observed unhealthy", func(ctx context.Context) error {
		mon.SampleNow(ctx)
		if healthy, listed := observed(); healthy || !listed {
			return fmt.Errorf("member %x: healthy %v, listed %v", victimID, healthy, listed)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The sample that found it down waited out its status timeout, so the
	// pair it starts spans more than a second; from the next one on, no
	// sample waits for it.
	mon.SampleNow(ctx)
	mon.mu.Lock()
	judged, gaps := mon.report.Judged, len(mon.report.Gaps)
	mon.mu.Unlock()
	const more = 5
	for range more {
		mon.SampleNow(ctx)
	}
	r := mon.Stop()
	if r.Judged-judged != more || len(r.Gaps) != gaps {
		t.Errorf("%d of %d pairs judged while member %x was down (gaps %q); want every one", r.Judged-judged, more, victimID, r.Gaps[gaps:])
	}
	if healthy, listed := observed(); healthy || !listed {
		t.Errorf("member %x at the end: healthy %v, listed %v; want listed and unhealthy", victimID, healthy, listed)
	}
	if err := r.Err(); err != nil {
		t.Error(err)
	}
}
