package chaos

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRunsReplayFromTheirSeed: the same seed always gives the same run, so
// a failing run can be replayed exactly.
func TestRunsReplayFromTheirSeed(t *testing.T) {
	for seed := range uint64(200) {
		if a, b := NewRun(seed), NewRun(seed); !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d gave %+v and then %+v", seed, a, b)
		}
	}
	if reflect.DeepEqual(NewRun(1), NewRun(2)) {
		t.Error("seeds 1 and 2 gave the same run")
	}
	for seed := range uint64(200) {
		if a, b := NewRun(LossRunBit|seed), NewRun(LossRunBit|seed); !reflect.DeepEqual(a, b) {
			t.Fatalf("loss seed %d gave %+v and then %+v", seed, a, b)
		}
	}
}

// TestLossRuns: a seed with LossRunBit draws a loss run: a majority of 3
// or 5 machines lost under Manual or FromSurvivor, every one of 1 or 3
// under FromBackup, with only management faults beside it (a machine fault
// could take the survivors too); a campaign
// makes one run in lossEvery a loss run, and a replay runs its seeds as
// given.
func TestLossRuns(t *testing.T) {
	sizes, policies, kinds := map[int]int{}, map[string]int{}, map[FaultKind]int{}
	for seed := range uint64(2000) {
		r := NewRun(LossRunBit | seed)
		sizes[r.Replicas]++
		policies[r.Policy]++
		switch {
		case r.Operation != LoseMajority || r.Desired != r.Replicas || r.MayLoseQuorum():
			t.Fatalf("loss seed %d draws %+v", seed, r)
		case r.Policy == PolicyFromBackup && (r.Killed() != r.Replicas || r.Replicas > 3):
			t.Fatalf("loss seed %d kills %d of %d under FromBackup: want all of at most 3", seed, r.Killed(), r.Replicas)
		case r.Policy != PolicyFromBackup && (r.Killed() <= r.Replicas/2 || r.Killed() >= r.Replicas || r.Replicas < 3):
			t.Fatalf("loss seed %d kills %d of %d: not a majority with a survivor", seed, r.Killed(), r.Replicas)
		case len(r.Faults) > 2:
			t.Fatalf("loss seed %d: %d faults", seed, len(r.Faults))
		}
		for i, f := range r.Faults {
			kinds[f.Kind]++
			if !slices.Contains(lossFaultKinds, f.Kind) || f.At < 0 || f.At >= Window || (i > 0 && f.At < r.Faults[i-1].At) {
				t.Fatalf("loss seed %d: fault %+v", seed, f)
			}
		}
	}
	if len(sizes) != 3 || sizes[1] == 0 || sizes[3] == 0 || sizes[5] == 0 ||
		policies[PolicyManual] == 0 || policies[PolicyFromSurvivor] == 0 || policies[PolicyFromBackup] == 0 || len(policies) != 3 ||
		len(kinds) != len(lossFaultKinds) {
		t.Errorf("loss runs: sizes %v, policies %v, faults %v", sizes, policies, kinds)
	}
	losses := 0
	for _, seed := range Seeds(0, 4*lossEvery, false)[len(RegressionSeeds):] {
		if NewRun(seed).Operation == LoseMajority {
			losses++
		}
	}
	if losses != 4 {
		t.Errorf("a campaign of %d new seeds makes %d loss runs, want 4", 4*lossEvery, losses)
	}
	if got := Seeds(LossRunBit|17, 1, true); !reflect.DeepEqual(got, []uint64{LossRunBit | 17}) {
		t.Errorf("a replay of a loss seed runs %v", got)
	}
}

// TestRunsAreValidAndCoverEverything: over many seeds every run is one the
// campaign can carry out, and every operation, fault kind and size shows
// up.
func TestRunsAreValidAndCoverEverything(t *testing.T) {
	ops, kinds, sizes := map[Operation]int{}, map[FaultKind]int{}, map[int]int{}
	lose := 0
	for seed := range uint64(5000) {
		r := NewRun(seed)
		ops[r.Operation]++
		sizes[r.Replicas]++
		if r.MayLoseQuorum() {
			lose++
		}
		switch {
		case r.Replicas != 1 && r.Replicas != 3 && r.Replicas != 5:
			t.Fatalf("seed %d: %d replicas", seed, r.Replicas)
		case r.Desired < 1 || r.Desired > 7 || r.Desired%2 == 0:
			t.Fatalf("seed %d: %s from %d to %d replicas", seed, r.Operation, r.Replicas, r.Desired)
		case (r.Operation == ScaleUp || r.Operation == EtcdScaleUp) != (r.Desired > r.Replicas),
			(r.Operation == ScaleDown || r.Operation == EtcdScaleDown) != (r.Desired < r.Replicas),
			r.Operation == Remediate && r.Replicas == 1:
			t.Fatalf("seed %d: %s from %d to %d replicas", seed, r.Operation, r.Replicas, r.Desired)
		case len(r.Faults) < 1 || len(r.Faults) > 3:
			t.Fatalf("seed %d: %d faults", seed, len(r.Faults))
		}
		for i, f := range r.Faults {
			kinds[f.Kind]++
			if f.At < 0 || f.At >= Window || (i > 0 && f.At < r.Faults[i-1].At) {
				t.Fatalf("seed %d: fault %d at %s, out of order or outside the window", seed, i, f.At)
			}
			if (f.Kind == FreezeMachine || f.Kind == CutPeerTraffic) && (f.For < 5*time.Second || f.For >= 40*time.Second) {
				t.Fatalf("seed %d: %s for %s", seed, f.Kind, f.For)
			}
		}
	}
	for _, op := range Operations {
		if ops[op] == 0 {
			t.Errorf("no run does %s", op)
		}
	}
	for _, k := range FaultKinds {
		if kinds[k] == 0 {
			t.Errorf("no run injects %s", k)
		}
	}
	if len(sizes) != 3 || lose == 0 || lose == 5000 {
		t.Errorf("sizes %v; %d of 5000 runs may lose quorum", sizes, lose)
	}
}

func TestSummary(t *testing.T) {
	converged := func(after time.Duration, injected ...Injected) Outcome {
		return Outcome{Injected: injected, Converged: true, ConvergedAfter: after}
	}
	outcomes := []Outcome{
		converged(10*time.Second, Injected{Fault: Fault{Kind: KillMachine}, Machine: "m1"}),
		converged(30*time.Second, Injected{Fault: Fault{Kind: CutPeerTraffic}, Skipped: "not root"}),
		converged(20 * time.Second),
		{Converged: true, ConvergedAfter: 40 * time.Second, Injected: []Injected{{Fault: Fault{Kind: KillMachine}}, {Fault: Fault{Kind: KillMachine}}}},
		{Violations: []string{"lost write k1"}},
		// A plane of 1 killed: it cannot converge, and its gap is the
		// outage; the freeze after the kill had nothing to strike, and
		// the lone machine's cut was a cut from the manager.
		{Run: Run{Seed: 7, Replicas: 1, Operation: Rollout, Desired: 1, Faults: []Fault{{Kind: KillMachine}, {Kind: FreezeMachine}, {Kind: CutPeerTraffic}}},
			Degraded: "etcd has lost quorum", Record: Record{LongestGap: 11 * time.Minute},
			Injected: []Injected{{Fault: Fault{Kind: CutPeerTraffic}, Note: "no peer"}, {Fault: Fault{Kind: KillMachine}}, {Fault: Fault{Kind: FreezeMachine}, Moot: "nothing to strike"}}},
	}
	outcomes[0].Operation, outcomes[1].Operation = Remediate, Remediate
	outcomes[0].Record = Record{Commit: "abc", Acknowledged: 100, Unknown: 2, Linearizable: "Ok", LongestGap: 300 * time.Millisecond, MaxVoters: 5, MaxLearners: 1, MaxMachines: 6, Unjudged: 3}
	outcomes[1].Record = Record{Commit: "abc", Acknowledged: 50, Linearizable: "Illegal", LongestGap: 900 * time.Millisecond, MaxVoters: 3, MaxMachines: 4}
	outcomes[2].Record = Record{Commit: "def", Acknowledged: 10, LongestGap: 100 * time.Millisecond}
	outcomes[3].Operation, outcomes[3].LostWrites = LoseMajority, 4
	outcomes[3].Record = Record{Commit: "def", Acknowledged: 40, Linearizable: "Illegal", LongestGap: time.Minute, Unjudged: 1}
	s := Summarize(outcomes)
	if s.Acknowledged != 200 || s.Unknown != 2 || s.LostWrites != 4 || s.LossRuns != 1 || s.NotLinearizable != 1 || s.Unjudged != 4 ||
		s.MaxVoters != 5 || s.MaxLearners != 1 || s.MaxMachines != 6 || !slices.Equal(s.Commits, []string{"abc", "def"}) ||
		s.GapP50 != 300*time.Millisecond || s.GapMax != 900*time.Millisecond {
		t.Errorf("the records sum up to %+v", s)
	}
	if s.Runs != 6 || s.Passed != 5 || s.Converged != 4 || len(s.ByDesign) != 1 || s.Violations != 1 || s.Faults[KillMachine] != 4 ||
		s.Skipped[CutPeerTraffic] != 1 || s.Faults[CutPeerTraffic] != 1 || s.Adapted[CutPeerTraffic] != 1 || s.Moot[FreezeMachine] != 1 ||
		s.Faults[FreezeMachine] != 0 || s.Operations[Remediate] != 2 || s.Operations[""] != 2 {
		t.Errorf("summary %+v", s)
	}
	if s.P50 != 20*time.Second || s.P99 != 40*time.Second {
		t.Errorf("p50 %s, p99 %s; want 20s and 40s", s.P50, s.P99)
	}
	if table := s.Table(); !strings.Contains(table, "runs 6, passed 5 (4 converged, 1 could not by design), violations 1") ||
		!strings.Contains(table, "could not converge by design, Degraded: seed 7 (Rollout of 1, 1 machines killed): etcd has lost quorum") ||
		!strings.Contains(table, "CutPeerTraffic                      1        1        0        1") ||
		!strings.Contains(table, "FreezeMachine                       0        0        1        0") || !strings.Contains(table, "CutPeerTraffic") ||
		!strings.Contains(table, "Remediate                           2") || !strings.Contains(table, "LoseMajority") ||
		!strings.Contains(table, "writes acknowledged 200, unknown 2; lost in loss runs' recoveries 4 (1 loss runs); not linearizable 1") ||
		!strings.Contains(table, "p50 300ms, max 900ms; unjudged sample pairs 4; at most 5 voters, 1 learners, 6 machines") ||
		!strings.Contains(table, "commits abc, def") {
		t.Errorf("table:\n%s", table)
	}
	var back Outcome
	if err := json.Unmarshal([]byte(outcomes[0].JSONLine()), &back); err != nil || !reflect.DeepEqual(back, outcomes[0]) || strings.Contains(outcomes[0].JSONLine(), "\n") {
		t.Errorf("JSON line %s reads back as %+v (%v)", outcomes[0].JSONLine(), back, err)
	}
}

// TestRegressionSeedsDrawTheirRuns: a regression seed replays the run that
// found its bug only while NewRun draws the same schedule from it.
func TestRegressionSeedsDrawTheirRuns(t *testing.T) {
	want := map[uint64]Run{
		3: {Seed: 3, Replicas: 5, Operation: Create, Desired: 5,
			Faults: []Fault{{Kind: DeleteMachine, At: 22914426520, Target: 3}}},
		629922: {Seed: 629922, Replicas: 1, Operation: EtcdScaleUp, Desired: 3,
			Faults: []Fault{{Kind: CutPeerTraffic, At: 64600242073, Target: 4, For: 27407791587}, {Kind: KillMachine, At: 70366798938, Target: 1}}},
		483954: {Seed: 483954, Replicas: 1, Operation: Rollout, Desired: 1,
			Faults: []Fault{{Kind: CutPeerTraffic, At: 52581720121, Target: 4, For: 37140205658}, {Kind: KillMachine, At: 75593808645, Target: 1}, {Kind: FreezeMachine, At: 78671579308, Target: 1, For: 17702310801}}},
	}
	for _, seed := range RegressionSeeds {
		w, ok := want[seed]
		if !ok {
			t.Errorf("regression seed %d: no pinned run; add the run it found its bug with", seed)
			continue
		}
		if got := NewRun(seed); !reflect.DeepEqual(got, w) {
			t.Errorf("seed %d now draws %+v, not the run that found its bug, %+v", seed, got, w)
		}
	}
	if got := Seeds(10, 2, false); !reflect.DeepEqual(got, append(slices.Clone(RegressionSeeds), 10, 11)) {
		t.Errorf("a campaign's seeds are %v, want the regression seeds, then 10 and 11", got)
	}
	if got := Seeds(3, 1, true); !reflect.DeepEqual(got, []uint64{3}) {
		t.Errorf("a replay's seeds are %v, want only 3", got)
	}
}

// TestMayLoseQuorum: a run may lose quorum when it kills more machines
// than etcd tolerates at its smallest membership, which a remediation
// makes one smaller while the remediated member is out, and which is one
// member while a create begins.
func TestMayLoseQuorum(t *testing.T) {
	kills := func(n int) []Fault {
		return slices.Repeat([]Fault{{Kind: KillMachine}}, n)
	}
	for _, c := range []struct {
		run  Run
		want bool
	}{
		{Run{Replicas: 3, Desired: 3, Operation: Rollout, Faults: kills(1)}, false},
		{Run{Replicas: 3, Desired: 3, Operation: Rollout, Faults: kills(2)}, true},
		{Run{Replicas: 3, Desired: 1, Operation: ScaleDown, Faults: kills(1)}, true},
		{Run{Replicas: 3, Desired: 5, Operation: EtcdScaleUp, Faults: kills(1)}, false},
		{Run{Replicas: 3, Desired: 3, Operation: Remediate, Faults: kills(1)}, true},
		{Run{Replicas: 3, Desired: 3, Operation: Remediate, Faults: []Fault{{Kind: DeleteMachine}, {Kind: FreezeMachine}}}, false},
		{Run{Replicas: 5, Desired: 5, Operation: Remediate, Faults: kills(1)}, false},
		{Run{Replicas: 5, Desired: 5, Operation: Remediate, Faults: kills(2)}, true},
		{Run{Replicas: 3, Desired: 3, Operation: LoseMajority}, false},
		{Run{Replicas: 3, Desired: 3, Operation: Create, Faults: kills(1)}, true},
		{Run{Replicas: 5, Desired: 5, Operation: EtcdCreate, Faults: kills(1)}, true},
		{Run{Replicas: 3, Desired: 3, Operation: Create, Faults: []Fault{{Kind: FreezeMachine}, {Kind: DeleteMachine}}}, false},
	} {
		if got := c.run.MayLoseQuorum(); got != c.want {
			t.Errorf("%s of %d with %d faults: MayLoseQuorum = %v, want %v", c.run.Operation, c.run.Replicas, len(c.run.Faults), got, c.want)
		}
	}
}

// TestSmokeSeedsCoverEveryFault: the smoke's seeds still draw, between
// them, every fault, a partition (CutPeerTraffic) included, on 3
// machines, during a remediation, a rollout and an EtcdCluster operation.
func TestSmokeSeedsCoverEveryFault(t *testing.T) {
	kinds, ops := map[FaultKind]bool{}, map[Operation]bool{}
	for _, seed := range SmokeSeeds {
		r := NewRun(seed)
		if r.Replicas != 3 || r.MayLoseQuorum() {
			t.Errorf("smoke seed %d draws %+v: want 3 machines, and a run that cannot lose quorum beside its operation", seed, r)
		}
		if r.Operation == LoseMajority && r.Policy != PolicyFromBackup {
			t.Errorf("the smoke's loss run is under %s: want FromBackup, which recovers on its own and is the one no other scenario runs on 3 machines", r.Policy)
		}
		ops[r.Operation] = true
		for _, f := range r.Faults {
			kinds[f.Kind] = true
		}
	}
	for _, k := range FaultKinds {
		if !kinds[k] {
			t.Errorf("no smoke seed injects %s", k)
		}
	}
	if !ops[Remediate] || !ops[Rollout] || !ops[EtcdScaleUp] || !ops[LoseMajority] {
		t.Errorf("the smoke seeds do %v; want a remediation, a rollout, an EtcdCluster scale up and a lost majority", ops)
	}
}

// TestUnjudgedShare: a run whose monitor left more than MaxUnjudgedPercent
// of its sample pairs unjudged fails; one at the limit passes.
func TestUnjudgedShare(t *testing.T) {
	for _, c := range []struct {
		judged, unjudged int
		fails            bool
	}{
		{judged: 700, unjudged: 11},
		{judged: 228, unjudged: 124},
		{judged: 50, unjudged: 50},
		{judged: 49, unjudged: 51, fails: true},
		{judged: 0, unjudged: 1, fails: true},
		{},
	} {
		err := Record{Judged: c.judged, Unjudged: c.unjudged}.UnjudgedErr()
		if (err != nil) != c.fails {
			t.Errorf("%d judged, %d unjudged: %v; want failing %v", c.judged, c.unjudged, err, c.fails)
		}
	}
}
