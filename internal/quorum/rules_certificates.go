package quorum

import (
	"fmt"
	"slices"
)

// renewCertificates is maintenance like defragment: it runs only once no
// membership, scaling, rollout or remediation rule found a step, and
// before the defragmentations and restarts, since a certificate that
// expires takes a machine out of the cluster and a fragmented database
// does not. It renews, in place, the certificates of the machine whose
// earliest leaf certificate passed its renewal point first.
//
// A renewal disrupts no etcd member (etcd reloads its certificate files at
// each handshake, the API server reloads them too, and the controller
// manager and scheduler restart on that machine only), so it needs no
// fault tolerance: a one-machine control plane renews too. It still goes
// one machine at a time and never beside a member's disruption, and only
// on a machine that is well: its member a healthy, started voter, or in
// the APIServersOnly topology, serving. A renewal is not stacked on a
// machine already in trouble; that machine waits until it recovers, or is
// replaced with fresh certificates. It runs before waitForUnhealthyVoters:
// a voter that is down but not yet due for remediation (or held from it)
// does not hold up the renewal of the others, which does not touch it.
func (p planner) renewCertificates() (Decision, bool) {
	due := filter(p.machines, p.renewable)
	if len(due) == 0 {
		return Decision{}, false
	}
	slices.SortStableFunc(due, func(a, b Machine) int { return a.CertificatesRenewAt.Compare(b.CertificatesRenewAt) })
	mc := due[0]
	what := "renewing the certificates of machine " + mc.Name
	if d, ok := p.waitForRenewal(what); ok && !p.opts.renewUnchecked {
		return d, true
	}
	if d, ok := p.waitForDisrupted(what); ok && !p.opts.renewUnchecked {
		return d, true
	}
	d := Decision{Kind: RenewCertificates, Machine: mc.Name,
		Reason: fmt.Sprintf("machine %s: its certificates are due for renewal since %s; renewing in place, no machine is replaced",
			mc.Name, stamp(mc.CertificatesRenewAt))}
	if m, ok := p.memberOn(mc.Name); ok {
		d.MemberID = m.ID
	}
	return d, true
}

// certificatesDue reports whether mc's certificates passed their renewal
// point. An unknown time (zero) is never due.
func (v view) certificatesDue(mc Machine) bool {
	return !mc.CertificatesRenewAt.IsZero() && !mc.CertificatesRenewAt.After(v.Now)
}

// renewable reports whether mc is due a renewal and well enough to take
// one: it stays, and its member is a healthy, started voter (in the
// APIServersOnly topology, where no machine hosts a member, it serves).
func (v view) renewable(mc Machine) bool {
	if mc.Deleting || !v.certificatesDue(mc) || v.phase(mc) != phaseVoter {
		return false
	}
	if v.Topology == APIServersOnly {
		return true // phaseVoter: it serves
	}
	m, ok := v.memberOn(mc.Name)
	return ok && m.Voter() && m.Started() && m.Healthy
}

// renewing returns a machine whose certificate renewal is in flight: an
// open record younger than RenewTimeout. Deleting machines count: their
// agent may still be at work.
func (v view) renewing() (Machine, bool) {
	for _, mc := range v.machines {
		if !mc.RenewStartedAt.IsZero() && v.since(mc.RenewStartedAt) < v.tun.RenewTimeout {
			return mc, true
		}
	}
	return Machine{}, false
}

// waitForRenewal waits while a machine's certificate renewal is in flight,
// naming it.
func (p planner) waitForRenewal(what string) (Decision, bool) {
	if mc, ok := p.renewing(); ok {
		return waitf("waiting for machine %s to finish renewing its certificates (started at %s; counted as finished %s) before %s",
			mc.Name, stamp(mc.RenewStartedAt), due(mc.RenewStartedAt, p.tun.RenewTimeout), what), true
	}
	return Decision{}, false
}

// verifyRenewal is RenewCertificates' part of Decision.Verify: the machine
// is still there, staying and due, and no renewal started since the plan
// (another manager's, during a leader-election hand-over).
func (v view) verifyRenewal(machine string) error {
	mc, ok := v.machine(machine)
	switch {
	case !ok || mc.Deleting:
		return fmt.Errorf("machine %s is gone or being deleted since the plan", machine)
	case !v.certificatesDue(mc):
		return fmt.Errorf("machine %s's certificates are no longer due for renewal", machine)
	}
	if r, ok := v.renewing(); ok {
		return fmt.Errorf("machine %s started renewing its certificates since the plan", r.Name)
	}
	return nil
}
