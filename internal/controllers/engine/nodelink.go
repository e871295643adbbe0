package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// ZoneLabel is the well-known label of a Node's zone.
const ZoneLabel = "topology.kubernetes.io/zone"

// NodeLinkedReason is the event of a Node given its machine's providerID.
const NodeLinkedReason = "NodeLinked"

// NodeLinkPoll is how soon an owner whose machine waits for its Node looks
// again: the agent registers the Node within seconds of starting, and the
// Machine is not linked until the Node has the providerID.
const NodeLinkPoll = time.Second

// NodeLink is what a machine's Node lacks to be linked to its Machine: the
// Machine's providerID, which CAPI core links them by, and its failure
// domain as the Node's zone.
type NodeLink struct {
	Machine, Node, ProviderID, Zone string
}

// Patch is the merge patch that gives the Node both.
func (l NodeLink) Patch() []byte {
	patch := map[string]any{"spec": map[string]any{"providerID": l.ProviderID}}
	if l.Zone != "" {
		patch["metadata"] = map[string]any{"labels": map[string]string{ZoneLabel: l.Zone}}
	}
	data, _ := json.Marshal(patch) // maps of strings always marshal
	return data
}

// NodeLinks finds, for each machine that has a providerID but no nodeRef,
// its Node among nodes (by name): one named after the Machine's host name
// or DNS name, or after the Machine, that has no providerID and, if it
// reports an internal address, one of the Machine's. QCP's agents register
// their Nodes without a providerID: kubelet takes it from a cloud
// provider, and qcp-agent runs no kubelet and cannot know any
// infrastructure provider's format, while the Machine has it from its
// infrastructure machine on every provider. waiting counts the machines
// whose Node is not registered yet, so the caller looks again soon; a Node
// whose providerID is another one is not touched, and conflicts names it.
func NodeLinks(machines []*clusterv1.Machine, nodes map[string]*corev1.Node) (links []NodeLink, waiting int, conflicts []string) {
	for _, m := range machines {
		if m.Spec.ProviderID == "" || m.Status.NodeRef.IsDefined() || !m.DeletionTimestamp.IsZero() {
			continue
		}
		node := machineNode(m, nodes)
		switch {
		case node == nil:
			waiting++
		case node.Spec.ProviderID == "":
			links = append(links, NodeLink{Machine: m.Name, Node: node.Name, ProviderID: m.Spec.ProviderID, Zone: m.Spec.FailureDomain})
		case node.Spec.ProviderID != m.Spec.ProviderID:
			conflicts = append(conflicts, fmt.Sprintf("Node %s has providerID %q, not machine %s's %q", node.Name, node.Spec.ProviderID, m.Name, m.Spec.ProviderID))
		}
	}
	return links, waiting, conflicts
}

func machineNode(m *clusterv1.Machine, nodes map[string]*corev1.Node) *corev1.Node {
	names := []string{}
	var ips []string
	for _, a := range m.Status.Addresses {
		switch a.Type {
		case clusterv1.MachineHostName, clusterv1.MachineInternalDNS:
			names = append(names, a.Address)
		case clusterv1.MachineInternalIP:
			ips = append(ips, a.Address)
		}
	}
	names = append(names, m.Name)
	for _, name := range names {
		node := nodes[name]
		if node == nil {
			continue
		}
		if nodeIPs := internalIPs(node); len(nodeIPs) > 0 && !slices.ContainsFunc(nodeIPs, func(ip string) bool { return slices.Contains(ips, ip) }) {
			continue
		}
		return node
	}
	return nil
}

func internalIPs(n *corev1.Node) []string {
	var out []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			out = append(out, a.Address)
		}
	}
	return out
}

// LinkNodes applies the links with patch (a merge patch of the named
// Node), reporting each to event; it returns the first error.
func LinkNodes(ctx context.Context, links []NodeLink, patch func(ctx context.Context, node string, data []byte) error, event func(NodeLink)) error {
	for _, l := range links {
		if err := patch(ctx, l.Node, l.Patch()); err != nil {
			return fmt.Errorf("giving Node %s machine %s's providerID: %w", l.Node, l.Machine, err)
		}
		event(l)
	}
	return nil
}
