package quorum

import (
	"strings"
	"testing"
	"time"
)

// certsDue has machine i's certificates pass their renewal point ago.
func certsDue(s *State, i int, ago time.Duration) {
	s.Machines[i].CertificatesRenewAt = s.Now.Add(-ago)
}

// renewStarted opens machine i's renewal record ago. etcd keeps
// answering: a renewal disrupts no member.
func renewStarted(s *State, i int, ago time.Duration) {
	s.Machines[i].RenewStartedAt = s.Now.Add(-ago)
}

// TestRenewCertificates is the planner table of in-place certificate
// renewal: when a machine is renewed, which one, and what waits for what.
func TestRenewCertificates(t *testing.T) {
	allFragmented := func(s *State) {
		for i := range s.Members {
			fragmented(s, i, 1<<30, 60)
		}
	}
	runPlanCases(t, []planCase{
		{"a machine whose certificates are due is renewed in place",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 1, time.Hour) }),
			RenewCertificates, "m-02", "machine m-02: its certificates are due for renewal since 2025-12-31T23:12:00Z; renewing in place, no machine is replaced"},
		{"certificates not due yet: nothing to do",
			edit(cluster(3, 3), func(s *State) { s.Machines[1].CertificatesRenewAt = s.Now.Add(time.Minute) }),
			Wait, "", "nothing to do"},
		{"due exactly now is due",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 1, 0) }), RenewCertificates, "m-02", "renewing in place"},
		{"an unknown renewal time is never due",
			edit(cluster(3, 3), func(s *State) { s.Machines[1].CertificatesRenewAt = time.Time{} }), Wait, "", "nothing to do"},
		{"the earliest first",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 1, time.Hour); certsDue(s, 2, 2*time.Hour) }),
			RenewCertificates, "m-03", "machine m-03: its certificates are due for renewal since 2025-12-31T22:12:00Z"},
		{"the leader is renewed in place, its leadership stays: etcd is not disrupted",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 0, time.Hour) }), RenewCertificates, "m-01", "renewing in place"},
		{"a single-machine control plane is renewed: a renewal needs no fault tolerance",
			edit(cluster(1, 1), func(s *State) { certsDue(s, 0, time.Hour) }), RenewCertificates, "m-01", "no machine is replaced"},
		{"so is an external etcd machine",
			edit(cluster(3, 3), func(s *State) { s.Topology = External; certsDue(s, 2, time.Hour) }), RenewCertificates, "m-03", "renewing in place"},
		{"one at a time: not while another machine renews",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 2, time.Hour); renewStarted(s, 1, time.Minute) }),
			Wait, "", "waiting for machine m-02 to finish renewing its certificates (started at 2026-01-01T00:11:00Z; counted as finished at 2026-01-01T00:16:00Z) before renewing the certificates of machine m-03"},
		{"a renewal in flight is not started again",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 1, time.Hour); renewStarted(s, 1, time.Minute) }),
			Wait, "", "waiting for machine m-02 to finish renewing its certificates"},
		{"past RenewTimeout an open record finished or failed: still due, it is renewed again",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 1, time.Hour); renewStarted(s, 1, 6*time.Minute) }),
			RenewCertificates, "m-02", "renewing in place"},
		{"RenewTimeout is tunable",
			edit(cluster(3, 3), func(s *State) {
				certsDue(s, 2, time.Hour)
				renewStarted(s, 1, 6*time.Minute)
				s.Tunables.RenewTimeout = 10 * time.Minute
			}), Wait, "", "(started at 2026-01-01T00:06:00Z; counted as finished at 2026-01-01T00:16:00Z) before renewing the certificates of machine m-03"},
		{"not while a member defragments",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 2, time.Hour); defragStarted(s, 1, time.Minute) }),
			Wait, "", "waiting for member m-02 to finish defragmenting (started at 2026-01-01T00:11:00Z; counted as unhealthy at 2026-01-01T00:21:00Z) before renewing the certificates of machine m-03"},
		{"nor while one restarts",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 2, time.Hour); restartStarted(s, 1, 30*time.Second) }),
			Wait, "", "waiting for member m-02 to finish restarting (started at 2026-01-01T00:11:30Z; counted as unhealthy at 2026-01-01T00:13:30Z) before renewing the certificates of machine m-03"},
		{"not on a machine whose member is unhealthy",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 2, time.Hour); down(s, 2, time.Minute) }),
			Wait, "", "waiting for member m-03 to become healthy"},
		{"but on the others meanwhile: a renewal is stacked on no member in trouble, and needs no tolerance",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 1, time.Hour); certsDue(s, 2, 2*time.Hour); down(s, 2, time.Minute) }),
			RenewCertificates, "m-02", "renewing in place"},
		{"nor on a machine hosting a learner: the join comes first",
			edit(withLearner(cluster(5, 3), 100, false), func(s *State) { certsDue(s, 3, time.Hour) }),
			Wait, "", "waiting for learner m-09 to catch up"},
		{"membership work comes first: a rollout before a renewal",
			edit(cluster(3, 3), func(s *State) { certsDue(s, 2, time.Hour); s.Machines[1].UpToDate = false }),
			CreateMachine, "", "rolling out"},
		{"a renewal before a defragmentation",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); certsDue(s, 0, time.Hour) }),
			RenewCertificates, "m-01", "renewing in place"},
		{"a defragmentation waits for a renewal in flight",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); renewStarted(s, 0, time.Minute) }),
			Wait, "", "waiting for machine m-01 to finish renewing its certificates (started at 2026-01-01T00:11:00Z; counted as finished at 2026-01-01T00:16:00Z) before defragmenting member m-02"},
		{"so does a restart for a new quota",
			edit(cluster(3, 3), func(s *State) { runsWithQuota(1 << 30)(s); renewStarted(s, 2, time.Minute) }),
			Wait, "", "waiting for machine m-03 to finish renewing its certificates (started at 2026-01-01T00:11:00Z; counted as finished at 2026-01-01T00:16:00Z) before restarting member m-02"},
		{"and a NOSPACE recovery's defragmentation",
			edit(cluster(3, 3), func(s *State) { noSpace(s); compacted(s); renewStarted(s, 2, time.Minute) }),
			Wait, "", "to finish renewing its certificates (started at 2026-01-01T00:11:00Z; counted as finished at 2026-01-01T00:16:00Z) before defragmenting member m-02 to recover from NOSPACE"},
		{"an old record holds nothing up",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); renewStarted(s, 0, 6*time.Minute) }),
			Defragment, "2", "defragmenting member m-02"},
	})
}

// TestRenewCertificatesSkipsDeletingMachines runs the rule alone: a
// deleting machine is never renewed, whatever the rules before it do.
func TestRenewCertificatesSkipsDeletingMachines(t *testing.T) {
	deleting := edit(cluster(3, 3), func(s *State) { s.Machines[1].Deleting = true; certsDue(s, 1, 2*time.Hour) })
	if d, ok := (planner{view: newView(deleting)}).renewCertificates(); ok {
		t.Fatalf("renewed with only a deleting machine due: %s", d)
	}
	other := edit(deleting, func(s *State) { certsDue(s, 2, time.Hour) })
	if d, ok := (planner{view: newView(other)}).renewCertificates(); !ok || d.Kind != RenewCertificates || d.Machine != "m-03" || d.MemberID != 3 {
		t.Fatalf("got %s (%v), want RenewCertificates of m-03, member 3", d, ok)
	}
}

// TestCheckRenewal shows that Check refuses a renewal its rule would not
// take, and a disruption beside a renewal in flight.
func TestCheckRenewal(t *testing.T) {
	due := edit(cluster(3, 3), func(s *State) { certsDue(s, 1, time.Hour); certsDue(s, 2, time.Hour) })
	renew := func(machine string) Decision { return Decision{Kind: RenewCertificates, Machine: machine} }
	tests := []struct {
		name  string
		state State
		d     Decision
		want  string
	}{
		{"a second renewal", edit(due, func(s *State) { renewStarted(s, 1, time.Minute) }), renew("m-03"),
			"I4 one at a time: renewing the certificates of machine m-03 while machine m-02 renews its own"},
		{"a renewal again while it is in flight", edit(due, func(s *State) { renewStarted(s, 1, time.Minute) }), renew("m-02"),
			"while machine m-02 renews its own"},
		{"a renewal while a member defragments", edit(due, func(s *State) { defragStarted(s, 0, time.Minute) }), renew("m-03"),
			"I4 one at a time: renewing the certificates of machine m-03 while member m-01 is defragmenting"},
		{"a renewal while a member restarts", edit(due, func(s *State) { restartStarted(s, 0, time.Minute) }), renew("m-03"),
			"while member m-01 is restarting"},
		{"a deleting machine", edit(due, func(s *State) { s.Machines[1].Deleting = true }), renew("m-02"), "renewal: renewing the certificates of deleting machine m-02"},
		{"an unknown renewal time", edit(due, func(s *State) { s.Machines[1].CertificatesRenewAt = time.Time{} }), renew("m-02"), "whose renewal time is unknown"},
		{"certificates not due yet", edit(cluster(3, 3), func(s *State) { s.Machines[1].CertificatesRenewAt = s.Now.Add(time.Hour) }), renew("m-02"),
			"before they are due (2026-01-01T01:12:00Z)"},
		{"an unhealthy member's machine", edit(due, func(s *State) { down(s, 1, time.Minute) }), renew("m-02"),
			"whose member is not a healthy, started voter"},
		{"a machine that is gone", due, renew("m-07"), "which does not exist"},
		{"a defragmentation beside a renewal", edit(due, func(s *State) { renewStarted(s, 0, time.Minute) }),
			Decision{Kind: Defragment, MemberID: 2, Machine: "m-02"}, "I4 one at a time: defragmenting 2 while machine m-01 renews its certificates"},
		{"a restart beside a renewal", edit(due, func(s *State) { renewStarted(s, 0, time.Minute) }),
			Decision{Kind: RestartMember, MemberID: 2, Machine: "m-02"}, "I4 one at a time: restarting 2 while machine m-01 renews its certificates"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkAlone(tt.state, tt.d)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check(%s, %s) = %v, want an error containing %q", tt.state.describe(), tt.d, err, tt.want)
			}
		})
	}
	for _, ok := range []State{due, edit(due, func(s *State) { renewStarted(s, 1, 6*time.Minute) }), edit(cluster(1, 1), func(s *State) { certsDue(s, 0, 0) })} {
		d := Plan(ok)
		if err := checkAlone(ok, d); d.Kind != RenewCertificates || err != nil {
			t.Fatalf("Plan(%s) = %s, checked: %v", ok.describe(), d, err)
		}
	}
}

// TestVerifyRenewal shows a planned renewal dropped when, right before it
// is taken, the machine is no longer due or another renewal started.
func TestVerifyRenewal(t *testing.T) {
	s := edit(cluster(3, 3), func(s *State) { certsDue(s, 1, time.Hour); certsDue(s, 2, 30*time.Minute) })
	d := Plan(s)
	if d.Kind != RenewCertificates || d.Machine != "m-02" || d.MemberID != 2 || d.Expect.MachineResourceVersion != s.Machines[1].ResourceVersion {
		t.Fatalf("Plan = %s, expecting %+v", d, d.Expect)
	}
	if err := d.Verify(s); err != nil {
		t.Fatalf("Verify on the state it was planned on: %v", err)
	}
	for _, tt := range []struct {
		name  string
		fresh State
		want  string
	}{
		{"renewed since (its record kept the resourceVersion)", edit(s, func(s *State) { s.Machines[1].CertificatesRenewAt = s.Now.Add(200 * 24 * time.Hour) }),
			"machine m-02's certificates are no longer due for renewal"},
		{"another machine started renewing", edit(s, func(s *State) { renewStarted(s, 2, 0) }), "machine m-03 started renewing its certificates since the plan"},
		{"the machine changed", edit(s, func(s *State) { s.Machines[1].ResourceVersion += "x" }), "machine m-02 changed since the plan"},
	} {
		if err := d.Verify(tt.fresh); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Verify = %v, want %q", tt.name, err, tt.want)
		}
	}
}
