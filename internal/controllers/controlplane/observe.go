package controlplane

import (
	"net"

	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// plannerMachine is what machine, and its Node (nil until it registers),
// tell the planner. upToDate is the caller's rollout verdict on the machine.
func plannerMachine(machine *clusterv1.Machine, node *corev1.Node, upToDate bool) quorum.Machine {
	_, hook := machine.Annotations[quorum.HookAnnotation]
	_, deleteMe := machine.Annotations[quorum.DeleteAnnotation]
	m := quorum.Machine{
		Name:            machine.Name,
		FailureDomain:   machine.Spec.FailureDomain,
		PeerURL:         peerURL(machine),
		UpToDate:        upToDate,
		CreatedAt:       machine.CreationTimestamp.Time,
		ResourceVersion: machine.ResourceVersion,
		Deleting:        !machine.DeletionTimestamp.IsZero(),
		DeleteAnnotated: deleteMe,
		HasHook:         hook,
		// A MachineHealthCheck asks the machine's owner to remediate it by
		// setting OwnerRemediated to False.
		Remediate: conditions.IsFalse(machine, clusterv1.MachineOwnerRemediatedCondition),
	}
	m.NodeReady, m.ComponentsHealthy = nodeHealth(node)
	readRecords(machine).apply(&m)
	return m
}

// peerURL is the etcd peer URL of machine: its first internal IP on the
// standard peer port. Empty while the infrastructure has published no
// address, which the planner reads as "still provisioning".
func peerURL(machine *clusterv1.Machine) string {
	for _, a := range machine.Status.Addresses {
		if a.Type == clusterv1.MachineInternalIP && net.ParseIP(a.Address) != nil {
			return "https://" + net.JoinHostPort(a.Address, "2380")
		}
	}
	return ""
}

// nodeHealth reads the Node's Ready condition and the agent's component
// conditions; every component condition present must be True, and there
// must be at least one (a Node the agent has not reported on yet is not
// known to be healthy).
func nodeHealth(node *corev1.Node) (ready, components bool) {
	if node == nil {
		return false, false
	}
	seen := 0
	components = true
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
			continue
		}
		if agent.IsComponentCondition(c.Type) {
			seen++
			components = components && c.Status == corev1.ConditionTrue
		}
	}
	return ready, components && seen > 0
}

// plannerMembers adds the caller's records to the observed members: when
// each learner was added and since when each member has been unhealthy, as
// recorded on the machine hosting it (found by member ID, then by name).
func plannerMembers(members []quorum.Member, machines []*clusterv1.Machine) []quorum.Member {
	out := make([]quorum.Member, len(members))
	for i, m := range members {
		out[i] = m
		for _, machine := range machines {
			r := readRecords(machine)
			if r.memberID == m.ID || (r.memberID == 0 && m.Name != "" && m.Name == machine.Name) {
				out[i].AddedAt = r.learnerAdded
				if !m.Healthy {
					out[i].UnhealthySince = r.unhealthySince
				}
				break
			}
		}
	}
	return out
}
