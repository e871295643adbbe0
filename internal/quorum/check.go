package quorum

import "errors"

// Check reports every invariant (I1–I7) that taking decision d in state
// before, ending in state after, breaks; nil if none. "after" is the state
// right after the step (faults and progress of the world may also show in
// it; Check only blames d for what d can cause).
func Check(before State, d Decision, after State) error {
	return errors.New("not implemented")
}

// CheckMembers checks the invariants that a bare member list must satisfy at
// all times (I2: voters ≤ desired+1 and at most one learner). Runtime
// monitors call it on every sample. During a scale down pass the largest
// desired seen recently: the user lowering desired is not a violation.
func CheckMembers(desired int, members []Member) error {
	return errors.New("not implemented")
}

// CheckMembershipChange checks I1 and I3 between two consecutive samples of
// a member list: a voter may only disappear if the voters left that were
// healthy before are a majority of the voters left, and a member may only
// appear as a learner (except the first member, which bootstraps).
func CheckMembershipChange(before, after []Member) error {
	return errors.New("not implemented")
}
