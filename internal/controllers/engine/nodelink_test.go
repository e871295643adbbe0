package engine

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// TestNodeLinks: a machine with a providerID and no nodeRef is linked to
// the Node named after its host name (or after the Machine) that has no
// providerID and shares its address; a Node not there yet is waited for,
// and a Node with another providerID, or another machine's address, is
// left alone.
func TestNodeLinks(t *testing.T) {
	machine := func(name, id, fd, hostname, ip string) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: clusterv1.MachineSpec{ProviderID: id, FailureDomain: fd}}
		if hostname != "" {
			m.Status.Addresses = append(m.Status.Addresses, clusterv1.MachineAddress{Type: clusterv1.MachineHostName, Address: hostname})
		}
		if ip != "" {
			m.Status.Addresses = append(m.Status.Addresses, clusterv1.MachineAddress{Type: clusterv1.MachineInternalIP, Address: ip})
		}
		return m
	}
	node := func(name, id, ip string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{ProviderID: id}}
		if ip != "" {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		}
		return n
	}
	linked := machine("linked", "p://linked", "fd-a", "linked", "10.0.0.1")
	linked.Status.NodeRef = clusterv1.MachineNodeReference{Name: "linked"}
	machines := []*clusterv1.Machine{
		machine("by-hostname", "p://1", "fd-a", "ip-10-0-0-2", "10.0.0.2"),
		machine("by-name", "p://2", "", "", "10.0.0.3"),
		machine("not-yet", "p://3", "fd-b", "not-yet", "10.0.0.4"),
		machine("no-provider-id", "", "fd-b", "no-provider-id", "10.0.0.5"),
		machine("taken", "p://5", "fd-c", "taken", "10.0.0.6"),
		machine("elsewhere", "p://6", "fd-c", "elsewhere", "10.0.0.7"),
		linked,
	}
	nodes := map[string]*corev1.Node{}
	for _, n := range []*corev1.Node{
		node("ip-10-0-0-2", "", "10.0.0.2"), node("by-name", "", ""), node("no-provider-id", "", "10.0.0.5"),
		node("taken", "p://other", "10.0.0.6"), node("elsewhere", "", "10.9.9.9"), node("linked", "p://linked", "10.0.0.1"),
	} {
		nodes[n.Name] = n
	}
	links, waiting, conflicts := NodeLinks(machines, nodes)
	want := []NodeLink{
		{Machine: "by-hostname", Node: "ip-10-0-0-2", ProviderID: "p://1", Zone: "fd-a"},
		{Machine: "by-name", Node: "by-name", ProviderID: "p://2"},
	}
	if !reflect.DeepEqual(links, want) {
		t.Errorf("links %+v, want %+v", links, want)
	}
	// not-yet has no Node; elsewhere's Node has another address.
	if waiting != 2 {
		t.Errorf("%d machines wait for their Node, want 2 (not-yet, elsewhere)", waiting)
	}
	if len(conflicts) != 1 || !strings.Contains(conflicts[0], "p://other") {
		t.Errorf("conflicts %v, want the Node taken by p://other", conflicts)
	}
	var patch map[string]any
	if err := json.Unmarshal(want[0].Patch(), &patch); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(patch, map[string]any{"spec": map[string]any{"providerID": "p://1"}, "metadata": map[string]any{"labels": map[string]any{ZoneLabel: "fd-a"}}}) {
		t.Errorf("patch %v", patch)
	}
	if got := string(want[1].Patch()); got != `{"spec":{"providerID":"p://2"}}` {
		t.Errorf("patch without a zone %s", got)
	}
}
