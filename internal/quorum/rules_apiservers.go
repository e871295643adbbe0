package quorum

import "fmt"

// The rules of the APIServersOnly topology: a control plane whose etcd runs
// elsewhere (an EtcdCluster, or endpoints QCP does not run). Its machines
// host no member, so there is no membership to change and no quorum to
// keep; what remains is the control plane's availability. A machine
// "serves" once its infrastructure is ready and its Node and components are
// healthy. The rules keep the same shape and limits as the member rules:
// one machine starting at a time (I4), at most desired + 1 machines
// (desired with RemoveFirst), a replacement serving before the machine it
// replaces goes, and a serving machine deleted only while every other kept
// machine serves.

// apiServerRules are tried in order, like planWith's.
var apiServerRules = []rule{
	planner.releaseMachinesWithoutMembers,
	planner.deleteUnusableMachines,
	planner.waitForExternalEtcd,
	planner.remediateMarkedMachine,
	planner.cancelSurplusMachines,
	planner.createMachine,
	planner.scaleDown,
	planner.renewCertificates,
	planner.waitForStartingMachines,
}

// serves reports whether mc, in the APIServersOnly topology, serves: its
// infrastructure is ready and its Node and components are healthy.
func (v view) serves(mc Machine) bool {
	return mc.PeerURL != "" && v.componentsOK(mc)
}

// apiServerPhase is phase for the APIServersOnly topology: a kept machine
// is pending until its infrastructure is ready, then unjoined until it
// serves, and then counts as a voter does.
func (v view) apiServerPhase(mc Machine) phase {
	switch {
	case mc.Deleting:
		return phaseDeleting
	case mc.CreationFailed:
		return phaseFailed
	case mc.PeerURL == "":
		return phasePending
	case !v.serves(mc):
		return phaseUnjoined
	}
	return phaseVoter
}

// releaseMachinesWithoutMembers removes the pre-drain hook from a machine
// that carries it: no machine of this topology hosts a voter, so the hook
// (left by hand, or from an earlier topology) would only hold a drain
// forever.
func (p planner) releaseMachinesWithoutMembers() (Decision, bool) {
	for _, mc := range p.machines {
		if mc.HasHook {
			return Decision{Kind: RemoveHook, Machine: mc.Name,
				Reason: "machine " + mc.Name + " hosts no etcd member (etcd is external); releasing its drain"}, true
		}
	}
	return Decision{}, false
}

// waitForExternalEtcd takes no step while the external etcd cannot be
// used (ExternalEtcdProblem).
func (p planner) waitForExternalEtcd() (Decision, bool) {
	if p.ExternalEtcdProblem == "" {
		return Decision{}, false
	}
	return waitf("waiting for the external etcd before changing any machine: %s", p.ExternalEtcdProblem), true
}

// remediateMarkedMachine deletes a machine a health check marked, first,
// as KCP does with external etcd: it holds no member, and it is already
// not serving, so nothing waits on a replacement. One at a time: not while
// another machine is being deleted. A marked machine that serves (a stale
// mark: CAPI's health check never clears one) is not deleted first: it may
// be the last API server. It is outdated, so it is replaced like a
// rollout, and deleteServingMachine's "only while the others serve" holds.
func (p planner) remediateMarkedMachine() (Decision, bool) {
	for _, mc := range p.keep() {
		if !mc.Remediate || (p.serves(mc) && !p.opts.deleteServingMarked) {
			continue
		}
		for _, o := range p.machines {
			if o.Deleting {
				return waitf("waiting for machine %s to be deleted before remediating machine %s", o.Name, mc.Name), true
			}
		}
		return Decision{Kind: DeleteMachine, Machine: mc.Name,
			Reason: "remediating: a health check marked machine " + mc.Name + "; deleting it, then creating its replacement"}, true
	}
	return Decision{}, false
}

// waitForStartingMachines is the last rule: a kept machine that does not
// serve yet is waited for by name, never reported as "nothing to do".
func (p planner) waitForStartingMachines() (Decision, bool) {
	if s := p.provisioning(); len(s) > 0 {
		return waitf("waiting for machine %s to serve: its infrastructure ready, its Node Ready and its components healthy", s[0].Name), true
	}
	return Decision{}, false
}

// waitForServingMachines is the preflight of the APIServersOnly topology:
// before what, every kept machine but except must serve.
func (p planner) waitForServingMachines(what, except string) (Decision, bool) {
	for _, mc := range p.keep() {
		if mc.Name != except && !p.serves(mc) {
			return waitf("waiting for machine %s to serve before %s (preflight)", mc.Name, what), true
		}
	}
	return Decision{}, false
}

// apiServersSteady is the APIServersOnly topology's "nothing to do".
func (p planner) apiServersSteady() Decision {
	return waitf("nothing to do: %d serving, up-to-date machines as desired", len(p.keep()))
}

// deleteServingMachine deletes a machine that serves, in the APIServersOnly
// topology: one at a time, none while another starts, and only while every
// other kept machine serves.
func (p planner) deleteServingMachine(victim Machine, reason string) (Decision, bool) {
	for _, mc := range p.machines {
		if mc.Deleting {
			return waitf("waiting for machine %s to be deleted before deleting %s", mc.Name, victim.Name), true
		}
	}
	if d, ok := p.waitForServingMachines(fmt.Sprintf("deleting machine %s", victim.Name), victim.Name); ok {
		return d, true
	}
	return Decision{Kind: DeleteMachine, Machine: victim.Name, Reason: reason}, true
}

// joinVerb is what a new machine does before it counts: join etcd, or, in
// the APIServersOnly topology, serve.
func (p planner) joinVerb() string { return why(p.Topology == APIServersOnly, "serve", "join") }
