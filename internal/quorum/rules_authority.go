package quorum

import (
	"cmp"
	"fmt"
	"slices"
)

// rotateAuthority brings the machines, one at a time, to the current
// stage of a CA rotation, of the etcd CA or the cluster CA (the caller
// runs the stages and says what each machine lacks:
// Machine.AuthorityUpdate). It is maintenance, after
// the certificate renewals and before the waits for unhealthy voters and
// the other maintenance: a rotation that stalls leaves old and new
// authorities trusted side by side, which works, but each stage should
// finish soon.
//
// A change of the etcd trust restarts the member (etcd reads its trusted
// authorities once, at start): a disruption like a restart for a new
// quota, so it waits for the same preflight (every voter healthy, no
// learner, nothing else disrupted or renewing, and the cluster able to
// lose the member, unless its desired size never could), takes followers
// first, and moves leadership off a leader first. Every other change
// restarts no member (etcd reads its certificates at every handshake; a
// cluster CA rotation does not touch etcd): like a renewal, one machine at a time and never beside a
// disruption. Only a machine whose member is a healthy, started voter is
// changed; the others wait, since a member that cannot take the change now
// would only fail it, and one replaced gets the stage's authorities in its
// bootstrap data.
func (p planner) rotateAuthority() (Decision, bool) {
	var due []Member
	for _, mc := range p.machines {
		m, ok := p.memberOn(mc.Name)
		if mc.AuthorityUpdate != AuthorityCurrent && !mc.Deleting && ok && m.Voter() && m.Started() && m.Healthy {
			due = append(due, m)
		}
	}
	if len(due) == 0 {
		return Decision{}, false
	}
	// Followers first; trust changes (restarts) before leaf moves never
	// mix, since one stage asks for one of them.
	slices.SortStableFunc(due, func(a, b Member) int { return cmp.Compare(boolInt(a.Leader), boolInt(b.Leader)) })
	m := due[0]
	mc, _ := p.machineOf(m)
	if mc.AuthorityUpdate == AuthorityTrust {
		what := fmt.Sprintf("restarting member %s to trust the etcd authorities of the rotation's stage", p.memberName(m))
		if d, ok := p.waitToDisrupt(what, min(1, tolerance(p.Desired))); ok && !p.opts.restartUnchecked {
			return d, true
		}
		return p.disruptMember(m, Decision{Kind: SetAuthority, RestartsMember: true}, "restarting",
			"an etcd CA rotation changes the authorities it trusts, which etcd reads at its start; the machine stays")
	}
	what := "bringing machine " + mc.Name + " to the CA rotation's stage"
	if d, ok := p.waitForRenewal(what); ok && !p.opts.renewUnchecked {
		return d, true
	}
	if d, ok := p.waitForDisrupted(what); ok && !p.opts.renewUnchecked {
		return d, true
	}
	return Decision{Kind: SetAuthority, Machine: mc.Name, MemberID: m.ID,
		Reason: fmt.Sprintf("machine %s: %s; no etcd member restarts", mc.Name, what)}, true
}

// verifyAuthority is SetAuthority's part of Decision.Verify: the
// machine is still there, staying, and lacks what the plan gives it, and
// no renewal or authority change started since the plan.
func (v view) verifyAuthority(d Decision) error {
	mc, ok := v.machine(d.Machine)
	want := d.authorityUpdate()
	switch {
	case !ok || mc.Deleting:
		return fmt.Errorf("machine %s is gone or being deleted since the plan", d.Machine)
	case mc.AuthorityUpdate != want:
		return fmt.Errorf("machine %s no longer lacks the authority change planned (%q; now %q)", d.Machine, want, mc.AuthorityUpdate)
	}
	if r, ok := v.renewing(); ok {
		return fmt.Errorf("machine %s started renewing its certificates since the plan", r.Name)
	}
	return nil
}
