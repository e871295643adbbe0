package quorum

import (
	"testing"
	"time"
)

// lacks sets what machine i lacks of the rotation's stage.
func lacks(s *State, i int, u AuthorityUpdate) { s.Machines[i].AuthorityUpdate = u }

// TestRotateEtcdAuthority is the planner table of an etcd CA rotation's
// machine steps: a trust change is a member restart, a leaf move is like a
// renewal.
func TestRotateEtcdAuthority(t *testing.T) {
	allTrust := func(s *State) {
		for i := range s.Machines {
			lacks(s, i, AuthorityTrust)
		}
	}
	runPlanCases(t, []planCase{
		{"a trust change restarts a follower first",
			edit(cluster(3, 3), allTrust), SetAuthority, "m-02", "restarting member m-02: an etcd CA rotation changes the authorities it trusts"},
		{"the leader last, and its leadership moves first",
			edit(cluster(3, 3), func(s *State) { lacks(s, 0, AuthorityTrust) }), MoveLeader, "2", "moving etcd leadership from m-01 to m-02 before restarting m-01"},
		{"one restart at a time",
			edit(cluster(3, 3), func(s *State) { allTrust(s); restartStarted(s, 1, 10*time.Second) }),
			Wait, "", "waiting for member m-02 to finish restarting (started at 2026-01-01T00:11:50Z; counted as unhealthy at 2026-01-01T00:13:50Z) before restarting member m-03 to trust the etcd authorities"},
		{"not while the cluster cannot lose the member",
			edit(cluster(3, 3), func(s *State) { lacks(s, 1, AuthorityTrust); down(s, 2, time.Minute) }),
			Wait, "", "waiting for member m-03 to become healthy"},
		{"a single-member control plane restarts its only member: its size never tolerates a loss",
			edit(cluster(1, 1), func(s *State) { lacks(s, 0, AuthorityTrust) }), SetAuthority, "m-01", "restarting member m-01"},
		{"not beside a renewal",
			edit(cluster(3, 3), func(s *State) { lacks(s, 1, AuthorityTrust); renewStarted(s, 2, time.Minute) }),
			Wait, "", "waiting for machine m-03 to finish renewing its certificates"},
		{"a leaf move restarts nothing, and may be on the leader",
			edit(cluster(3, 3), func(s *State) { lacks(s, 0, AuthorityLeaves) }), SetAuthority, "m-01", "bringing machine m-01 to the CA rotation's stage; no etcd member restarts"},
		{"a leaf move needs no fault tolerance",
			edit(cluster(3, 3), func(s *State) { lacks(s, 1, AuthorityLeaves); down(s, 2, time.Minute) }), SetAuthority, "m-02", "bringing machine m-02 to the CA rotation's stage"},
		{"but not on a member in trouble",
			edit(cluster(3, 3), func(s *State) { lacks(s, 2, AuthorityLeaves); down(s, 2, time.Minute) }), Wait, "", "waiting for member m-03 to become healthy"},
		{"one leaf move at a time",
			edit(cluster(3, 3), func(s *State) {
				lacks(s, 1, AuthorityLeaves)
				lacks(s, 2, AuthorityLeaves)
				renewStarted(s, 2, time.Minute)
			}),
			Wait, "", "waiting for machine m-03 to finish renewing its certificates (started at 2026-01-01T00:11:00Z; counted as finished at 2026-01-01T00:16:00Z) before bringing machine m-02 to the CA rotation's stage"},
		{"nor beside a restart",
			edit(cluster(3, 3), func(s *State) { lacks(s, 2, AuthorityLeaves); restartStarted(s, 1, 10*time.Second) }),
			Wait, "", "waiting for member m-02 to finish restarting"},
		{"membership work comes first",
			edit(cluster(3, 3), func(s *State) { allTrust(s); s.Machines[1].UpToDate = false }), CreateMachine, "", "rolling out"},
		{"a due renewal comes first, then the rotation",
			edit(cluster(3, 3), func(s *State) { allTrust(s); certsDue(s, 2, time.Hour) }), RenewCertificates, "m-03", "renewing in place"},
	})
}

// TestVerifyAuthority drops a planned authority step once the machine no
// longer lacks it, or a renewal started since.
func TestVerifyAuthority(t *testing.T) {
	s := edit(cluster(3, 3), func(s *State) { lacks(s, 1, AuthorityLeaves) })
	d := Plan(s)
	if d.Kind != SetAuthority || d.RestartsMember {
		t.Fatalf("planned %v", d)
	}
	if err := d.Verify(s); err != nil {
		t.Fatalf("unchanged world: %v", err)
	}
	if err := d.Verify(edit(s, func(s *State) { lacks(s, 1, AuthorityCurrent) })); err == nil {
		t.Fatal("verified a move the machine no longer lacks")
	}
	if err := d.Verify(edit(s, func(s *State) { renewStarted(s, 2, 0) })); err == nil {
		t.Fatal("verified a move beside a renewal that started since")
	}
	if err := Check(s, Decision{Kind: SetAuthority, Machine: "m-02", MemberID: s.Members[1].ID, RestartsMember: true}, s); err == nil {
		t.Fatal("the checker took a restart on a machine that lacks only a leaf move")
	}
	if err := Check(edit(s, func(s *State) { restartStarted(s, 2, 0); down(s, 2, 0) }), d, s); err == nil {
		t.Fatal("the checker took a leaf move beside a restart")
	}
}
