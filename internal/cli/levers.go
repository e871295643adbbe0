package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/kubeconfig"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/quorum"
)

func newKubeconfigCommand(g *globals) *cobra.Command {
	var namespace, file string
	var management bool
	cmd := &cobra.Command{
		Use:   "kubeconfig [CLUSTER]",
		Short: "Print a workload cluster's kubeconfig (default: the sample cluster demo)",
		Example: `  qcpctl kubeconfig > demo.kubeconfig
  qcpctl kubeconfig demo -o demo.kubeconfig && KUBECONFIG=demo.kubeconfig kubectl get nodes
  qcpctl kubeconfig --management          # the path of the management cluster's kubeconfig`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if management {
				p, err := g.managementKubeconfig()
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), p)
				return nil
			}
			name := sampleCluster
			if len(args) == 1 {
				name = args[0]
			}
			c, err := g.connect()
			if err != nil {
				return err
			}
			data, err := kubeconfig.FromSecret(cmd.Context(), c, client.ObjectKey{Namespace: namespace, Name: name})
			if err != nil {
				return fmt.Errorf("no kubeconfig for cluster %s/%s yet (%w): its control plane writes it once the first API server answers; check 'qcpctl describe cluster %s'", namespace, name, err, name)
			}
			if file == "" {
				_, err = cmd.OutOrStdout().Write(data)
				return err
			}
			// It holds the workload cluster's admin credentials.
			if err := os.WriteFile(file, data, 0o600); err != nil {
				return fmt.Errorf("writing the kubeconfig of %s/%s: %w", namespace, name, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the cluster")
	cmd.Flags().StringVarP(&file, "output", "o", "", "write the kubeconfig to this file (mode 0600) instead of printing it")
	cmd.Flags().BoolVar(&management, "management", false, "print the path of the management cluster's kubeconfig instead")
	return cmd
}

func newScaleCommand(g *globals) *cobra.Command {
	var namespace string
	var replicas int32
	cmd := &cobra.Command{
		Use:     "scale CLUSTER --replicas N",
		Short:   "Set the number of control plane machines of a cluster",
		Example: "  qcpctl scale demo --replicas 5",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("replicas") {
				return fmt.Errorf("--replicas is required: for example 'qcpctl scale %s --replicas 5'", args[0])
			}
			c, err := g.connect()
			if err != nil {
				return err
			}
			cp, err := controlPlaneOf(cmd.Context(), c, namespace, args[0])
			if err != nil {
				return err
			}
			from := ptr.Deref(cp.Spec.Replicas, 0)
			patch := client.MergeFrom(cp.DeepCopy())
			cp.Spec.Replicas = ptr.To(replicas)
			// The webhook's refusal names the field and the fix; pass it on whole.
			if err := c.Patch(cmd.Context(), cp, patch); err != nil {
				return fmt.Errorf("scaling %s/%s: %w", namespace, cp.Name, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "control plane %s/%s: replicas %d -> %d\n", namespace, cp.Name, from, replicas)
			return nil
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the cluster")
	cmd.Flags().Int32Var(&replicas, "replicas", 0, "the number of control plane machines (odd, at least 1)")
	return cmd
}

// controlPlaneOf returns the QuorumControlPlane of the cluster name.
func controlPlaneOf(ctx context.Context, c client.Client, namespace, name string) (*controlplanev1.QuorumControlPlane, error) {
	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("cluster %s/%s not found: list clusters with 'kubectl get clusters -A'", namespace, name)
		}
		return nil, fmt.Errorf("reading cluster %s/%s: %w", namespace, name, err)
	}
	ref := cluster.Spec.ControlPlaneRef
	if ref.Kind != "QuorumControlPlane" {
		return nil, fmt.Errorf("cluster %s/%s has no QuorumControlPlane (its control plane is %q)", namespace, name, ref.Kind)
	}
	cp := &controlplanev1.QuorumControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, cp); err != nil {
		return nil, fmt.Errorf("reading the control plane %s/%s of cluster %s: %w", namespace, ref.Name, name, err)
	}
	return cp, nil
}

// newMachineCommand returns the demo levers that act on one control plane
// Machine, named as CAPI names it.
func newMachineCommand(g *globals) *cobra.Command {
	var namespace string
	machine := &cobra.Command{
		Use:   "machine",
		Short: "Delete, kill, freeze, thaw, isolate, heal or confirm lost a machine, by its CAPI Machine name",
	}
	machine.PersistentFlags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the machine")
	// signal acts on the process machine behind m.
	signal := func(act func(h *machinehost.Host, ns, name string) error) func(context.Context, client.Client, *clusterv1.Machine) error {
		return func(_ context.Context, _ client.Client, m *clusterv1.Machine) error {
			if m.Spec.InfrastructureRef.Kind != "ProcessMachine" {
				return fmt.Errorf("machine %s/%s is a %s, not a process machine: qcpctl can only break process machines", m.Namespace, m.Name, m.Spec.InfrastructureRef.Kind)
			}
			return act(&machinehost.Host{Root: filepath.Join(g.stateDir, "machines")}, m.Namespace, m.Spec.InfrastructureRef.Name)
		}
	}
	// process narrows freeze and thaw to one process of the machine.
	var process string
	oneOrAll := func(one func(h *machinehost.Host, ns, name, process string) error, all func(h *machinehost.Host, ns, name string) error) func(context.Context, client.Client, *clusterv1.Machine) error {
		return signal(func(h *machinehost.Host, ns, name string) error {
			if process != "" {
				return one(h, ns, name, process)
			}
			return all(h, ns, name)
		})
	}
	levers := []struct {
		verb, short, done string
		act               func(context.Context, client.Client, *clusterv1.Machine) error
		oneProcess        bool
	}{
		{"delete", "Delete a Machine the way a user does; its control plane replaces it", "deleted",
			func(ctx context.Context, c client.Client, m *clusterv1.Machine) error { return c.Delete(ctx, m) }, false},
		{"kill", "Kill a machine: SIGKILL to its whole process group, as a power cut", "killed",
			signal((*machinehost.Host).Kill), false},
		{"freeze", "Freeze a machine, as a hung host: all of it at once through its freezer cgroup (SIGSTOP to its process group where it has none), or with --process one process (SIGSTOP)", "frozen",
			oneOrAll((*machinehost.Host).FreezeProcess, (*machinehost.Host).Freeze), true},
		{"thaw", "Thaw a frozen machine: its freezer cgroup and SIGCONT to its process group, or with --process to one process", "thawed",
			oneOrAll((*machinehost.Host).ThawProcess, (*machinehost.Host).Thaw), true},
		{"confirm-lost", "Confirm that a machine does not run and never will again, so that a quorum-loss recovery may count its member as fenced (any provider)", "confirmed lost",
			func(ctx context.Context, c client.Client, m *clusterv1.Machine) error {
				return setAnnotation(ctx, c, m, quorum.ConfirmedLostAnnotation, "")
			}, false},
	}
	for _, l := range levers {
		cmd := &cobra.Command{
			Use:     l.verb + " MACHINE",
			Short:   l.short,
			Example: "  qcpctl machine " + l.verb + " demo-control-plane-abcde",
			Args:    cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := g.connect()
				if err != nil {
					return err
				}
				m, err := getMachine(cmd.Context(), c, namespace, args[0])
				if err != nil {
					return err
				}
				if err := l.act(cmd.Context(), c, m); err != nil {
					return fmt.Errorf("machine %s/%s: %w", namespace, m.Name, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "machine %s/%s %s\n", namespace, m.Name, l.done)
				return nil
			},
		}
		if l.oneProcess {
			cmd.Flags().StringVar(&process, "process", "", "only this process of the machine: etcd, kube-apiserver, kube-controller-manager, kube-scheduler or "+machinehost.AgentProcess)
		}
		machine.AddCommand(cmd)
	}
	machine.AddCommand(newPartitionCommands(g, &namespace)...)
	return machine
}

func getMachine(ctx context.Context, c client.Client, namespace, name string) (*clusterv1.Machine, error) {
	m := &clusterv1.Machine{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("machine %s/%s not found: list them with 'qcpctl describe cluster %s'", namespace, name, sampleCluster)
		}
		return nil, fmt.Errorf("reading machine %s/%s: %w", namespace, name, err)
	}
	return m, nil
}
