package cli

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qcp-dev/qcp/internal/hostnet"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// fromManager is the name --from gives the management host: the manager,
// the tests' clients and the user's tools, all on the machines' bridge.
const fromManager = "manager"

// newPartitionCommands returns the machine levers that cut a process
// machine's network and heal it; namespace is the machine command's flag.
func newPartitionCommands(g *globals, namespace *string) []*cobra.Command {
	var from []string
	var oneWay bool
	isolate := &cobra.Command{
		Use:   "isolate MACHINE",
		Short: "Cut a machine off from its peers (or from --from only) as a network partition does; it needs a qcp-manager with --machine-network=namespaces",
		Long: `Cut a machine off from the other machines of its cluster, both ways, as a network partition
does; the manager still reaches it. --from names whom to cut it from instead: Machines of the cluster,
or "manager" for the management host. With --one-way only what the machine sends is dropped; TCP
then fails both ways, since the machine's acknowledgements no longer leave it, so a one-way cut
shows what a member does when it cannot answer. The cut holds until 'qcpctl machine heal'.`,
		Example: "  qcpctl machine isolate demo-control-plane-abcde\n" +
			"  qcpctl machine isolate demo-control-plane-abcde --from manager\n" +
			"  qcpctl machine isolate demo-control-plane-abcde --from demo-control-plane-fghij --one-way",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, m, err := processMachine(cmd.Context(), g, *namespace, args[0])
			if err != nil {
				return err
			}
			peers, names, err := partitionPeers(cmd.Context(), c, m, from)
			if err != nil {
				return err
			}
			d := hostnet.Both
			if oneWay {
				d = hostnet.Outgoing
			}
			if err := machinehost.Isolate(m.Namespace, m.Spec.InfrastructureRef.Name, peers, d); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "machine %s/%s cut off from %s (%s)\n", m.Namespace, m.Name, strings.Join(names, ", "), d)
			return nil
		},
	}
	isolate.Flags().StringSliceVar(&from, "from", nil, `Machines of the same cluster to cut it from, or "manager" (default: every other Machine of its cluster)`)
	isolate.Flags().BoolVar(&oneWay, "one-way", false, "drop only what the machine sends")
	heal := &cobra.Command{
		Use:     "heal MACHINE",
		Short:   "Remove every cut 'qcpctl machine isolate' made on a machine",
		Example: "  qcpctl machine heal demo-control-plane-abcde",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, m, err := processMachine(cmd.Context(), g, *namespace, args[0])
			if err != nil {
				return err
			}
			if err := machinehost.Heal(m.Namespace, m.Spec.InfrastructureRef.Name); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "machine %s/%s healed\n", m.Namespace, m.Name)
			return nil
		},
	}
	return []*cobra.Command{isolate, heal}
}

// processMachine connects to the management cluster and reads Machine
// namespace/name, which must be a process machine's.
func processMachine(ctx context.Context, g *globals, namespace, name string) (client.Client, *clusterv1.Machine, error) {
	c, err := g.connect()
	if err != nil {
		return nil, nil, err
	}
	m, err := getMachine(ctx, c, namespace, name)
	if err != nil {
		return nil, nil, err
	}
	if m.Spec.InfrastructureRef.Kind != "ProcessMachine" {
		return nil, nil, fmt.Errorf("machine %s/%s is a %s, not a process machine: qcpctl can only cut a process machine's network", m.Namespace, m.Name, m.Spec.InfrastructureRef.Kind)
	}
	return c, m, nil
}

// partitionPeers is the addresses (and names) m is cut from: those from
// names, or every other Machine of m's cluster.
func partitionPeers(ctx context.Context, c client.Client, m *clusterv1.Machine, from []string) ([]netip.Addr, []string, error) {
	var list clusterv1.MachineList
	if err := c.List(ctx, &list, client.InNamespace(m.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: m.Spec.ClusterName}); err != nil {
		return nil, nil, fmt.Errorf("listing the machines of cluster %s/%s: %w", m.Namespace, m.Spec.ClusterName, err)
	}
	if len(from) == 0 {
		for _, p := range list.Items {
			if p.Name != m.Name {
				from = append(from, p.Name)
			}
		}
		if len(from) == 0 {
			return nil, nil, fmt.Errorf("machine %s/%s has no peer in cluster %s to be cut from; name one with --from", m.Namespace, m.Name, m.Spec.ClusterName)
		}
	}
	var addrs []netip.Addr
	for _, name := range from {
		if name == fromManager {
			a, err := machinehost.NetworkHostAddr(m.Namespace, m.Spec.InfrastructureRef.Name)
			if err != nil {
				return nil, nil, err
			}
			addrs = append(addrs, a)
			continue
		}
		i := slices.IndexFunc(list.Items, func(p clusterv1.Machine) bool { return p.Name == name })
		if i < 0 || name == m.Name {
			return nil, nil, fmt.Errorf("--from %s: not another Machine of cluster %s/%s; name its Machines or %q", name, m.Namespace, m.Spec.ClusterName, fromManager)
		}
		a, err := machineAddr(&list.Items[i])
		if err != nil {
			return nil, nil, err
		}
		addrs = append(addrs, a)
	}
	return addrs, from, nil
}

// machineAddr is m's internal address, which its infrastructure reported.
func machineAddr(m *clusterv1.Machine) (netip.Addr, error) {
	for _, a := range m.Status.Addresses {
		if a.Type == clusterv1.MachineInternalIP {
			return netip.ParseAddr(a.Address)
		}
	}
	return netip.Addr{}, fmt.Errorf("machine %s/%s has no internal address yet", m.Namespace, m.Name)
}
