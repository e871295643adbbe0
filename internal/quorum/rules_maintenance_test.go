package quorum

import (
	"strings"
	"testing"
	"time"
)

// fragmented gives member i a database of size bytes, pct percent of it
// free pages.
func fragmented(s *State, i int, size int64, pct int) {
	s.Members[i].DBSize, s.Members[i].DBSizeInUse = size, size*int64(100-pct)/100
}

// defragStarted opens member i's defragmentation record ago, and makes it
// stop answering, as a member busy defragmenting does.
func defragStarted(s *State, i int, ago time.Duration) {
	s.Machines[i].DefragStartedAt = s.Now.Add(-ago)
	down(s, i, ago)
}

// TestDefragment is issue 36's planner table: when a member is
// defragmented, and when not.
func TestDefragment(t *testing.T) {
	const gib = 1 << 30
	allFragmented := func(s *State) {
		for i := range s.Members {
			fragmented(s, i, gib, 60)
		}
	}
	runPlanCases(t, []planCase{
		{"a fragmented follower is defragmented, the most fragmented first",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); fragmented(s, 2, gib, 80) }),
			Defragment, "3", "80% of its 1024 MiB database is free pages (threshold 45%)"},
		{"followers go before the leader",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); fragmented(s, 0, gib, 90) }),
			Defragment, "2", "defragmenting member m-02"},
		{"a fragmented leader first hands leadership to another member",
			edit(cluster(3, 3), func(s *State) { fragmented(s, 0, gib, 90) }),
			MoveLeader, "2", "before defragmenting m-01"},
		{"no defragmentation while a voter is down (one of three)",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); down(s, 2, time.Minute) }),
			Wait, "", "waiting for member m-03 to become healthy"},
		{"no defragmentation while a voter is down (one of five)",
			edit(cluster(5, 5), func(s *State) { allFragmented(s); down(s, 4, time.Minute) }),
			Wait, "", "waiting for member m-05 to become healthy"},
		{"no defragmentation while a learner joins",
			withLearner(edit(cluster(5, 3), allFragmented), 100, false),
			Wait, "", "waiting for learner m-09 to catch up"},
		{"no defragmentation of a cluster that cannot lose a member",
			edit(cluster(1, 1), allFragmented),
			Wait, "", "with 1 voter etcd cannot lose one while it is out of service"},
		{"no second defragmentation while one is in flight",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); defragStarted(s, 1, time.Minute) }),
			Wait, "", "waiting for member m-02 to finish defragmenting (started at 2026-01-01T00:11:00Z; counted as unhealthy at 2026-01-01T00:21:00Z)"},
		{"a member defragmenting is not remediated for not answering",
			edit(cluster(3, 3), func(s *State) {
				defragStarted(s, 1, 9*time.Minute)
				s.Tunables.UnhealthyTimeout = time.Minute
			}),
			Wait, "", "waiting for member m-02 to finish defragmenting"},
		{"nor is a voter removed while it defragments",
			edit(cluster(3, 4), func(s *State) { defragStarted(s, 1, time.Minute); s.Machines[3].Deleting = true }),
			Wait, "", "waiting for member m-02 to finish defragmenting (started at 2026-01-01T00:11:00Z; counted as unhealthy at 2026-01-01T00:21:00Z) before removing a voter"},
		{"past DefragTimeout a member that does not answer is unhealthy, and remediated",
			edit(cluster(3, 3), func(s *State) { defragStarted(s, 1, 11*time.Minute) }),
			RemoveMember, "2", "has been unhealthy for 11m0s"},
		{"a database below the size floor is left alone",
			edit(cluster(3, 3), func(s *State) { fragmented(s, 1, 50<<20, 90) }),
			Wait, "", "nothing to do"},
		{"a database below the threshold is left alone",
			edit(cluster(3, 3), func(s *State) { fragmented(s, 1, gib, 44) }),
			Wait, "", "nothing to do"},
		{"an unknown in-use size is left alone",
			edit(cluster(3, 3), func(s *State) { s.Members[1].DBSize, s.Members[1].DBSizeInUse = gib, 0 }),
			Wait, "", "nothing to do"},
		{"a member defragmented within the minimum interval (default 1 hour) is left alone",
			edit(cluster(3, 3), func(s *State) {
				fragmented(s, 1, gib, 90)
				s.Machines[1].DefragmentedAt, s.Tunables = s.Now.Add(-59*time.Minute), Tunables{}
			}),
			Wait, "", "nothing to do"},
		{"and defragmented again once it has passed",
			edit(cluster(3, 3), func(s *State) {
				fragmented(s, 1, gib, 90)
				s.Machines[1].DefragmentedAt, s.Tunables = s.Now.Add(-61*time.Minute), Tunables{}
			}),
			Defragment, "2", "90% of its"},
		{"an open record on a member that answers counts as a defragmentation done",
			edit(cluster(3, 3), func(s *State) {
				fragmented(s, 1, gib, 90)
				s.Machines[1].DefragStartedAt, s.Tunables = s.Now.Add(-time.Minute), Tunables{}
			}),
			Wait, "", "nothing to do"},
		{"the threshold, floor and interval are tunable",
			edit(cluster(3, 3), func(s *State) {
				fragmented(s, 1, 20<<20, 30)
				s.Machines[1].DefragmentedAt = s.Now.Add(-2 * time.Minute)
				s.Tunables.DefragThresholdPercent, s.Tunables.DefragMinDBSize, s.Tunables.DefragMinInterval = 25, 10<<20, time.Minute
			}),
			Defragment, "2", "30% of its 20 MiB database is free pages (threshold 25%)"},
		{"defragmentation can be turned off",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); s.Tunables.DefragDisabled = true }),
			Wait, "", "nothing to do"},
		{"membership work comes first: a rollout before defragmentation",
			edit(cluster(3, 3), func(s *State) { allFragmented(s); s.Machines[1].UpToDate = false }),
			CreateMachine, "", "rolling out"},
	})
}

// runsWithQuota has every member of s report quota q, under a configured
// quota of 2 GiB.
func runsWithQuota(q int64) func(*State) {
	return func(s *State) {
		s.QuotaBackendBytes = 2 << 30
		for i := range s.Members {
			s.Members[i].DBSizeQuota = q
		}
	}
}

// restartStarted opens member i's restart record ago, and makes it stop
// answering, as a member restarting does.
func restartStarted(s *State, i int, ago time.Duration) {
	s.Machines[i].RestartStartedAt = s.Now.Add(-ago)
	down(s, i, ago)
}

// TestRestartForQuota is issue 36 step 4's planner table: a quota change
// restarts the members in place, one at a time, as a disruption.
func TestRestartForQuota(t *testing.T) {
	old := runsWithQuota(1 << 30)
	runPlanCases(t, []planCase{
		{"a follower running with another quota is restarted with the configured one",
			edit(cluster(3, 3), old), RestartMember, "2", "restarting member m-02: it runs with a backend quota of 1024 MiB, and 2048 MiB is configured; the machine stays"},
		{"the leader last, after a transfer",
			edit(cluster(3, 3), func(s *State) { old(s); s.Members[1].DBSizeQuota, s.Members[2].DBSizeQuota = 2<<30, 2<<30 }),
			MoveLeader, "2", "before restarting m-01"},
		{"every member at the configured quota: nothing to do",
			edit(cluster(3, 3), runsWithQuota(2<<30)), Wait, "", "nothing to do"},
		{"etcd 3.5: the machine's record of the quota it was given",
			edit(cluster(3, 3), func(s *State) {
				old(s)
				for i := range s.Members {
					s.Members[i].DBSizeQuota, s.Machines[i].QuotaBackendBytes = 0, 2<<30
				}
				s.Machines[2].QuotaBackendBytes = 1 << 30
			}), RestartMember, "3", "runs with a backend quota of 1024 MiB"},
		{"an unknown quota (etcd 3.5, no record) is left alone",
			edit(cluster(3, 3), runsWithQuota(0)), Wait, "", "nothing to do"},
		{"not while a voter is down",
			edit(cluster(3, 3), func(s *State) { old(s); down(s, 2, time.Minute) }), Wait, "", "waiting for member m-03 to become healthy"},
		{"not while a learner joins",
			withLearner(edit(cluster(5, 3), old), 100, false), Wait, "", "waiting for learner m-09"},
		{"not while another member is restarting",
			edit(cluster(3, 3), func(s *State) { old(s); restartStarted(s, 1, 30*time.Second) }),
			Wait, "", "waiting for member m-02 to finish restarting (started at 2026-01-01T00:11:30Z; counted as unhealthy at 2026-01-01T00:13:30Z)"},
		{"nor while one is defragmenting",
			edit(cluster(3, 3), func(s *State) { old(s); defragStarted(s, 1, time.Minute) }), Wait, "", "to finish defragmenting"},
		{"a member restarting is not remediated for not answering",
			edit(cluster(3, 3), func(s *State) {
				restartStarted(s, 1, 90*time.Second)
				s.Tunables.UnhealthyTimeout = time.Minute
			}), Wait, "", "waiting for member m-02 to finish restarting"},
		{"past RestartTimeout it is unhealthy, and remediated",
			edit(cluster(3, 3), func(s *State) { restartStarted(s, 1, 11*time.Minute) }), RemoveMember, "2", "has been unhealthy for 11m0s"},
		{"a single-machine control plane restarts its only member: it never could lose one",
			edit(cluster(1, 1), old), RestartMember, "1", "the machine stays"},
		{"three desired, one voter left: it waits",
			edit(cluster(3, 1), old), CreateMachine, "", ""},
		{"membership work comes first: a rollout before the restart",
			edit(cluster(3, 3), func(s *State) { old(s); s.Machines[1].UpToDate = false }), CreateMachine, "", "rolling out"},
		{"before defragmentation",
			edit(cluster(3, 3), func(s *State) {
				old(s)
				for i := range s.Members {
					fragmented(s, i, 1<<30, 80)
				}
			}), RestartMember, "2", "the machine stays"},
		{"under NOSPACE, after the compaction and before the defragmentations, even of one of two voters",
			edit(cluster(2, 2), func(s *State) { noSpace(s); compacted(s); old(s) }), RestartMember, "2", "the machine stays"},
		{"under NOSPACE with the data over the old quota: the raised quota ends it",
			edit(cluster(3, 3), func(s *State) {
				recovered(s)
				s.QuotaBackendBytes = 4 << 30
				for i := range s.Members {
					s.Members[i].DBSize, s.Members[i].DBSizeQuota = 3<<30, 4<<30
				}
			}), DisarmAlarm, "m-01", "every member's database is below its quota"},
	})
}

// TestCheckOneDisruption shows that Check refuses a second disruption: a
// defragmentation or membership change while a member defragments, and a
// defragmentation the cluster cannot afford.
func TestCheckOneDisruption(t *testing.T) {
	busy := edit(cluster(3, 3), func(s *State) { defragStarted(s, 1, time.Minute) })
	tests := []struct {
		name  string
		state State
		d     Decision
		want  string
	}{
		{"a second defragmentation", busy, Decision{Kind: Defragment, MemberID: 3, Machine: "m-03"}, "I4 one at a time: Defragment while member m-02 is defragmenting"},
		{"a voter removed", busy, Decision{Kind: RemoveMember, MemberID: 3, Machine: "m-03"}, "I4 one at a time: RemoveMember of a voter while member m-02 is defragmenting"},
		{"a learner added", withLearner(busy, 5000, false), Decision{Kind: AddLearner, Machine: "m-09"}, "I4 one at a time: AddLearner while member m-02 is defragmenting"},
		{"a defragmentation with a voter down", edit(cluster(3, 3), func(s *State) { down(s, 1, time.Minute) }),
			Decision{Kind: Defragment, MemberID: 3, Machine: "m-03"}, "I4 one at a time: defragmenting m-03 while voter m-02 is unhealthy"},
		{"a defragmentation of one of two voters", cluster(2, 2), Decision{Kind: Defragment, MemberID: 2, Machine: "m-02"}, "the cluster cannot lose it"},
		{"a defragmentation of the leader", cluster(3, 3), Decision{Kind: Defragment, MemberID: 1, Machine: "m-01"}, "I6 leader: Defragment of leader m-01"},
		{"a restart while a member defragments", busy, Decision{Kind: RestartMember, MemberID: 3, Machine: "m-03"}, "I4 one at a time: RestartMember while member m-02 is defragmenting"},
		{"a defragmentation while a member restarts", edit(cluster(3, 3), func(s *State) { restartStarted(s, 1, time.Minute) }),
			Decision{Kind: Defragment, MemberID: 3, Machine: "m-03"}, "I4 one at a time: Defragment while member m-02 is restarting"},
		{"a restart with a voter down", edit(cluster(3, 3), func(s *State) { down(s, 1, time.Minute) }),
			Decision{Kind: RestartMember, MemberID: 3, Machine: "m-03"}, "I4 one at a time: restarting m-03 while voter m-02 is unhealthy"},
		{"a restart of one of two voters of three desired", cluster(3, 2), Decision{Kind: RestartMember, MemberID: 2, Machine: "m-02"}, "the cluster cannot lose it"},
		{"a restart of the leader", cluster(3, 3), Decision{Kind: RestartMember, MemberID: 1, Machine: "m-01"}, "I6 leader: RestartMember of leader m-01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkAlone(tt.state, tt.d)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check(%s, %s) = %v, want an error containing %q", tt.state.describe(), tt.d, err, tt.want)
			}
		})
	}
	if err := checkAlone(cluster(3, 3), Decision{Kind: Defragment, MemberID: 2, Machine: "m-02"}); err != nil {
		t.Fatalf("a follower's defragmentation in a healthy cluster of three: %v", err)
	}
}

// noSpace raises NOSPACE on every member of s, over the quota.
func noSpace(s *State) {
	for i := range s.Members {
		s.Members[i].Alarms = []string{"NOSPACE"}
		s.Members[i].DBSize, s.Members[i].DBSizeInUse = 2<<30+1, 200<<20
	}
}

// compacted records a compaction an hour ago to revision 3000.
func compacted(s *State) { s.CompactedRevision, s.CompactedAt = 3000, s.Now.Add(-time.Hour) }

// defragmentedAgo is NOSPACE just after a compaction, with every member
// defragmented ago, and defragmentations at least an hour apart.
func defragmentedAgo(ago time.Duration) func(*State) {
	return func(s *State) {
		noSpace(s)
		compacted(s)
		s.CompactedAt = s.Now.Add(-time.Minute)
		for i := range s.Machines {
			s.Machines[i].DefragmentedAt = s.Now.Add(-ago)
		}
		s.Tunables.DefragMinInterval = time.Hour
	}
}

// defraggedSinceCompaction records member i's machine defragmented after
// the compaction, its database then below the quota.
func defraggedSinceCompaction(s *State, i int) {
	s.Machines[i].DefragmentedAt = s.CompactedAt.Add(time.Minute)
	s.Members[i].DBSize = 300 << 20
}

// recovered is s under NOSPACE, compacted and every member defragmented
// since.
func recovered(s *State) {
	noSpace(s)
	compacted(s)
	for i := range s.Members {
		defraggedSinceCompaction(s, i)
	}
}

// TestNoSpaceRecovery is issue 36's NOSPACE table: compact once, defragment
// every member once after it, followers first, then disarm, or say that
// the data does not fit; and no removal for a mark the alarm brought.
func TestNoSpaceRecovery(t *testing.T) {
	runPlanCases(t, []planCase{
		{"first it compacts, keeping the retention",
			edit(cluster(3, 3), noSpace), Compact, "", "compacting etcd's history to revision 3000 (the current 4000, less a retention of 1000 revisions)"},
		{"not before the leader's revision is known",
			edit(cluster(3, 3), func(s *State) { noSpace(s); s.Members[0].Revision = 0 }), Wait, "", "waiting to read the leader's revision"},
		{"a revision moved by less than the retention since the last compaction is not compacted again",
			edit(cluster(3, 3), func(s *State) {
				noSpace(s)
				compacted(s)
				s.CompactedRevision = 2990
			}), Defragment, "2", "after the compaction to revision 2990"},
		{"one moved by a whole retention is",
			edit(cluster(3, 3), func(s *State) {
				noSpace(s)
				compacted(s)
				s.CompactedRevision = 2000
			}), Compact, "", "to revision 3000"},
		{"the retention is tunable",
			edit(cluster(3, 3), func(s *State) { noSpace(s); s.Tunables.CompactionRetention = 10 }), Compact, "", "to revision 3990"},
		{"then it defragments a follower",
			edit(cluster(3, 3), func(s *State) { noSpace(s); compacted(s) }), Defragment, "2", "its 2048 MiB database holds 200 MiB of data after the compaction to revision 3000"},
		{"the next follower",
			edit(cluster(3, 3), func(s *State) { noSpace(s); compacted(s); defraggedSinceCompaction(s, 1) }), Defragment, "3", "after the compaction"},
		{"the leader after a transfer",
			edit(cluster(3, 3), func(s *State) {
				noSpace(s)
				compacted(s)
				defraggedSinceCompaction(s, 1)
				defraggedSinceCompaction(s, 2)
			}), MoveLeader, "2", "before defragmenting m-01"},
		{"a defragmentation before the compaction counts for nothing",
			edit(cluster(3, 3), func(s *State) {
				noSpace(s)
				compacted(s)
				s.Machines[1].DefragmentedAt = s.CompactedAt.Add(-time.Minute)
			}), Defragment, "2", "after the compaction"},
		{"then it disarms, once every member is below the quota",
			edit(cluster(3, 3), recovered), DisarmAlarm, "m-01", "disarming NOSPACE raised by member m-01"},
		{"a member's own quota counts (etcd 3.6)",
			edit(cluster(3, 3), func(s *State) {
				recovered(s)
				s.QuotaBackendBytes, s.Members[0].DBSizeQuota, s.Members[1].DBSizeQuota, s.Members[2].DBSizeQuota = 256<<20, 4<<30, 4<<30, 256<<20
				s.Members[0].DBSize, s.Members[1].DBSize = 3<<30, 3<<30
			}), RestartMember, "2", "it runs with a backend quota of 4096 MiB, and 256 MiB is configured"},
		{"a member below its own quota is not over it",
			edit(cluster(3, 3), func(s *State) {
				recovered(s)
				s.QuotaBackendBytes = 256 << 20
				for i := range s.Members {
					s.Members[i].DBSizeQuota = 256 << 20
				}
				s.Members[2].DBSize = 200 << 20
			}), Degraded, "", "member m-01's database is 300 MiB after compaction and defragmentation, not below its quota of 256 MiB"},
		{"data over the quota: it says which setting to raise, and takes no second pass",
			edit(cluster(3, 3), func(s *State) {
				noSpace(s)
				compacted(s)
				s.Members[0].Revision, s.Members[1].Revision, s.Members[2].Revision = 3500, 3500, 3500
				for i := range s.Machines {
					s.Machines[i].DefragmentedAt = s.CompactedAt.Add(time.Minute)
				}
			}), Degraded, "", "raise etcd's quota (quotaBackendBytes: spec.etcd.stacked.quotaBackendBytes of a QuorumControlPlane"},
		{"a member defragmented within the interval is not defragmented again: a second NOSPACE soon after means the data does not fit",
			edit(cluster(3, 3), defragmentedAgo(10*time.Minute)), Degraded, "", "(it was last defragmented at 2026-01-01T00:02:00Z; QCP defragments it again once defragMinIntervalSeconds, 1h0m0s, has passed)"},
		{"and is once the interval has passed",
			edit(cluster(3, 3), defragmentedAgo(61*time.Minute)), Defragment, "2", "after the compaction"},
		{"a single voter defragments itself: the cluster refuses writes already",
			edit(cluster(1, 1), func(s *State) { noSpace(s); compacted(s) }), Defragment, "1", "after the compaction"},
		{"not while a voter is down",
			edit(cluster(3, 3), func(s *State) { noSpace(s); compacted(s); down(s, 2, time.Minute) }), Wait, "", "waiting for member m-03 to become healthy"},
		{"a learner whose join cannot finish goes first",
			withLearner(edit(cluster(5, 3), func(s *State) { noSpace(s); compacted(s) }), 5000, true), RemoveMember, "9", "removing learner m-09"},
		{"a health check's mark on a healthy member removes nothing",
			edit(cluster(3, 3), func(s *State) {
				noSpace(s)
				for i := range s.Machines {
					s.Machines[i].Remediate, s.Machines[i].NodeReady = true, false
				}
			}), Compact, "", "compacting"},
		{"nor does a marked member down for less than the timeout",
			edit(cluster(3, 3), func(s *State) { noSpace(s); s.Machines[2].Remediate = true; down(s, 2, time.Minute) }), Compact, "", "compacting"},
		{"a member down past the timeout is still removed",
			edit(cluster(3, 3), func(s *State) { noSpace(s); down(s, 2, time.Hour) }), RemoveMember, "3", "has alarms [NOSPACE]"},
		{"with CORRUPT raised too, a human decides",
			edit(cluster(3, 3), func(s *State) { noSpace(s); s.Members[2].Alarms = []string{"NOSPACE", "CORRUPT"} }), Degraded, "", "has alarms [NOSPACE]"},
	})
}

// TestTakeSnapshot is issue 35's planner table: a due backup is taken
// from a healthy follower, from the only member of a one-member cluster,
// after membership work, and not beside a disruption in flight.
func TestTakeSnapshot(t *testing.T) {
	due := func(s *State) { s.Backup.Due = true }
	runPlanCases(t, []planCase{
		{"a due backup is taken from a follower, the first by name",
			edit(cluster(3, 3), due), Snapshot, "2", "taking a scheduled backup from member m-02 (a follower)"},
		{"a one-member cluster's only member serves it",
			edit(cluster(1, 1), due), Snapshot, "1", "from member m-01 (the only member)"},
		{"a down follower is passed over: the rules wait for it first",
			edit(cluster(3, 3), func(s *State) { due(s); down(s, 1, time.Minute) }), Wait, "", "waiting for member m-02 to become healthy"},
		{"membership work comes first",
			edit(cluster(5, 3), due), CreateMachine, "", "scaling up"},
		{"not beside a defragmentation in flight",
			edit(cluster(3, 3), func(s *State) { due(s); defragStarted(s, 1, time.Minute) }),
			Wait, "", "waiting for member m-02 to finish defragmenting"},
		{"nothing due, nothing to do",
			cluster(3, 3), Wait, "", "nothing to do"},
	})
}

// TestBackupBeforeRiskyChange is issue 35's second table: with backups
// configured, a rollout's first machine and a scale-down wait for a
// verified snapshot younger than MaxAgeBeforeRisky, taking one if none is;
// remediation never waits; and a wait names why no snapshot can be had.
func TestBackupBeforeRiskyChange(t *testing.T) {
	configured := func(s *State) { s.Backup.Configured, s.Backup.MaxAgeBeforeRisky = true, time.Hour }
	outdated := func(s *State) {
		for i := range s.Machines {
			s.Machines[i].UpToDate = false
		}
	}
	fresh := func(s *State) { s.Backup.LastVerified = s.Now.Add(-10 * time.Minute) }
	stale := func(s *State) { s.Backup.LastVerified = s.Now.Add(-2 * time.Hour) }
	runPlanCases(t, []planCase{
		{"a rollout's first machine waits for a snapshot, taken from a follower",
			edit(cluster(3, 3), func(s *State) { configured(s); outdated(s) }), Snapshot, "2", "before rolling out the first machine: there is none"},
		{"a snapshot too old is taken again",
			edit(cluster(3, 3), func(s *State) { configured(s); outdated(s); stale(s) }), Snapshot, "2", "the newest was verified at 2025-12-31T22:12:00Z, more than maxAgeBeforeRiskyChangeSeconds (1h0m0s) ago"},
		{"a recent snapshot lets the rollout go",
			edit(cluster(3, 3), func(s *State) { configured(s); outdated(s); fresh(s) }), CreateMachine, "", "replacing outdated machine"},
		{"without backups the rollout goes",
			edit(cluster(3, 3), outdated), CreateMachine, "", "replacing outdated machine"},
		{"maxSurge 0: the first deletion waits too",
			edit(cluster(3, 3), func(s *State) { configured(s); outdated(s); s.Strategy = RemoveFirst }), Snapshot, "2", "before rolling out the first machine"},
		{"a later machine of the rollout does not wait",
			edit(cluster(3, 4), func(s *State) {
				configured(s)
				outdated(s)
				s.Machines[3].UpToDate = true
				s.Members[0].Leader, s.Members[1].Leader = false, true
			}),
			DeleteMachine, "m-01", "outdated"},
		{"a scale-down waits for a snapshot",
			edit(cluster(3, 5), configured), Snapshot, "2", "before scaling down"},
		{"a scale-down with a recent snapshot goes",
			edit(cluster(3, 5), func(s *State) { configured(s); fresh(s) }), MoveLeader, "2", "before m-01 leaves"},
		{"remediation never waits for a backup",
			edit(cluster(3, 3), func(s *State) { configured(s); s.Machines[2].Remediate = true }), CreateMachine, "", "remediating"},
		{"no snapshot can be taken: the wait says why",
			edit(cluster(3, 3), func(s *State) { configured(s); outdated(s); s.Backup.Problem = "Secret ns/s3 does not exist" }),
			Wait, "", "none can be taken: Secret ns/s3 does not exist"},
		{"after a failure the next attempt waits its turn",
			edit(cluster(3, 3), func(s *State) { configured(s); outdated(s); s.Backup.RetryAt = s.Now.Add(30 * time.Second) }),
			Wait, "", "the last attempt failed, the next is at"},
	})
}
