package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/log"
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

// LinkNodes gives the machines' Nodes (nodes, by name) what NodeLinks
// finds they lack, with patch (a merge patch of the named Node), recording
// a NodeLinked event on owner for each; it logs a Node left alone and a
// failed patch. It reports whether a machine still waits for its Node (or
// was just linked), so that the owner looks again soon (NodeLinkPoll).
func LinkNodes(ctx context.Context, machines []*clusterv1.Machine, nodes map[string]*corev1.Node,
	patch func(ctx context.Context, node string, data []byte) error, recorder record.EventRecorder, owner runtime.Object) bool {
	logger := log.FromContext(ctx)
	links, waiting, conflicts := NodeLinks(machines, nodes)
	for _, c := range conflicts {
		logger.Info("Leaving a Node alone: " + c)
	}
	for _, l := range links {
		if err := patch(ctx, l.Node, l.Patch()); err != nil {
			logger.Info("Giving a machine's Node its providerID failed; trying again", "node", l.Node, "machine", l.Machine, "error", err.Error())
			break
		}
		recorder.Eventf(owner, corev1.EventTypeNormal, NodeLinkedReason, "Node %s of machine %s has its providerID %s and zone %q", l.Node, l.Machine, l.ProviderID, l.Zone)
	}
	return waiting > 0 || len(links) > 0
}

// NodesByName indexes a Node list by name.
func NodesByName(list []corev1.Node) map[string]*corev1.Node {
	nodes := make(map[string]*corev1.Node, len(list))
	for i := range list {
		nodes[list[i].Name] = &list[i]
	}
	return nodes
}
