package cli

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/qcp-dev/qcp/internal/scheme"
)

// TestPartitionPeers: isolate cuts a machine off from every other Machine
// of its own cluster by default, or from those --from names; it refuses a
// name that is not another Machine of the cluster, and "manager" for a
// machine that has no network namespace, saying how to get one.
func TestPartitionPeers(t *testing.T) {
	machine := func(name, cluster, addr string) *clusterv1.Machine {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{clusterv1.ClusterNameLabel: cluster}},
			Spec:       clusterv1.MachineSpec{ClusterName: cluster, InfrastructureRef: clusterv1.ContractVersionedObjectReference{Kind: "ProcessMachine", Name: name}},
		}
		m.Status.Addresses = []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: addr}}
		return m
	}
	a, b, c := machine("a", "demo", "198.18.0.2"), machine("b", "demo", "198.18.0.3"), machine("c", "demo", "198.18.0.4")
	other := machine("x", "other", "198.18.0.9")
	cl := fake.NewClientBuilder().WithScheme(scheme.New()).WithObjects(a, b, c, other).Build()
	ctx := context.Background()

	addrs, names, err := partitionPeers(ctx, cl, a, nil)
	want := []netip.Addr{netip.MustParseAddr("198.18.0.3"), netip.MustParseAddr("198.18.0.4")}
	if err != nil || !slices.Equal(addrs, want) || !slices.Equal(names, []string{"b", "c"}) {
		t.Errorf("default peers of a: %v %v, %v; want b and c at %v", addrs, names, err, want)
	}
	addrs, _, err = partitionPeers(ctx, cl, a, []string{"c"})
	if err != nil || !slices.Equal(addrs, want[1:]) {
		t.Errorf("--from c: %v, %v; want %v", addrs, err, want[1:])
	}
	for _, c := range []struct {
		from []string
		want string
	}{
		{[]string{"x"}, "not another Machine of cluster default/demo"},
		{[]string{"a"}, "not another Machine of cluster default/demo"},
		{[]string{"manager"}, "--machine-network=namespaces"},
	} {
		if _, _, err := partitionPeers(ctx, cl, a, c.from); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--from %v: %v; want an error saying %q", c.from, err, c.want)
		}
	}
	lonely := machine("solo", "alone", "198.18.0.5")
	if _, _, err := partitionPeers(ctx, cl, lonely, nil); err == nil || !strings.Contains(err.Error(), "no peer") {
		t.Errorf("a machine alone in its cluster: %v; want an error saying it has no peer", err)
	}
}
