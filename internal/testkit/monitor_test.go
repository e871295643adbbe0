package testkit

import (
	"errors"
	"strings"
	"testing"
	"time"

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
				m.record(t, t, s, err)
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
	m.record(now, now, []quorum.Member{a, b}, nil)
	m.record(now, now, nil, errors.New("no leader"))
	m.record(now, now, []quorum.Member{a, b, c}, nil)
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
	m.record(now, now, []quorum.Member{leader(1, true), leader(2, false), leader(3, false), leader(4, false)}, nil)
	m.record(now, now, []quorum.Member{leader(1, false), leader(2, true), leader(3, false), leader(4, false)}, nil)
	m.record(now, now, []quorum.Member{leader(2, true), leader(3, false), leader(4, false)}, nil)
	if got := m.report.LeadersRemoved; len(got) != 0 {
		t.Fatalf("leaders removed %v after a transfer, want none", got)
	}
	m.record(now, now, []quorum.Member{leader(3, false), leader(4, false)}, nil)
	if got := m.report.LeadersRemoved; len(got) != 1 || !strings.Contains(got[0], "[2 voter,leader]") {
		t.Errorf("leaders removed %v, want member 2, removed while it led", got)
	}
}

// TestMonitorJudgesNoLongGap: two readable samples that span more than
// maxSampleGap (a slow or unreadable one between them) are not compared, since
// leadership may have moved, or a learner been promoted, unseen in between;
// the gap is reported instead. Within maxSampleGap they are compared as ever.
func TestMonitorJudgesNoLongGap(t *testing.T) {
	member := func(id uint64, leads bool) quorum.Member { return quorum.Member{ID: id, Healthy: true, Leader: leads} }
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return start.Add(d) }

	m := newMonitor(3)
	m.record(at(0), at(50*time.Millisecond), []quorum.Member{member(1, true), member(2, false), member(3, false), member(4, false)}, nil)
	m.record(at(250*time.Millisecond), at(5*time.Second), nil, errors.New("context deadline exceeded"))
	m.record(at(5*time.Second), at(5100*time.Millisecond), []quorum.Member{member(2, true), member(3, false), member(4, false), member(5, false)}, nil)
	r := m.report
	if len(r.LeadersRemoved) != 0 || len(r.Violations) != 0 {
		t.Errorf("judged across a 5-s gap: leaders removed %v, violations %v", r.LeadersRemoved, r.Violations)
	}
	if len(r.Gaps) != 1 || !strings.Contains(r.Gaps[0], "5.1s since the previous readable sample started") {
		t.Errorf("gaps %q, want the one of 5.1 s", r.Gaps)
	}
	if len(r.LeadersGoneInGaps) != 1 || !strings.Contains(r.LeadersGoneInGaps[0], "[1 voter,leader] ") {
		t.Errorf("leaders gone in gaps %q, want member 1, which led before the gap", r.LeadersGoneInGaps)
	}

	// The same pair within maxSampleGap is judged: member 1 removed while it led,
	// and member 5 joining as a voter.
	m = newMonitor(3)
	m.record(at(0), at(50*time.Millisecond), []quorum.Member{member(1, true), member(2, false), member(3, false), member(4, false)}, nil)
	m.record(at(250*time.Millisecond), at(300*time.Millisecond), []quorum.Member{member(2, true), member(3, false), member(4, false), member(5, false)}, nil)
	r = m.report
	if len(r.LeadersRemoved) != 1 || len(r.Violations) != 1 || len(r.Gaps) != 0 || len(r.LeadersGoneInGaps) != 0 {
		t.Errorf("leaders removed %v, violations %v, gaps %v; want member 1 removed while it led, member 5 joining as a voter, no gap", r.LeadersRemoved, r.Violations, r.Gaps)
	}
}
