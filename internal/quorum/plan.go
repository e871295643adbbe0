package quorum

import "strconv"

// Plan returns the one next step for s. It is pure and deterministic: the
// same State (in any order) always yields the same Decision.
func Plan(s State) Decision {
	return planWith(s, options{})
}

// options lets tests swap in deliberately broken planners, to prove that the
// exploration catches them. Production code always uses the zero value.
type options struct {
	// skipQuorumChecks removes the I1 and I7 guards.
	skipQuorumChecks bool
}

func planWith(s State, o options) Decision {
	return waitf("not implemented")
}

func idString(id uint64) string { return strconv.FormatUint(id, 16) }
