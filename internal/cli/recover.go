package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// newRecoverCommand sets the one-shot trigger of a recovery from a quorum
// loss on a cluster's control plane.
func newRecoverCommand(g *globals) *cobra.Command {
	var namespace, from string
	cmd := &cobra.Command{
		Use:   "recover CLUSTER --from survivor|backup",
		Short: "Recover, once, a control plane's etcd that lost quorum for good",
		Long: `Asks QCP for one recovery of the cluster's etcd, whatever spec.quorumLossRecovery says
and without its wait (it sets the annotation ` + controlplanev1.RecoverAnnotation + `):
  --from survivor: from the surviving member with the highest applied index;
  --from backup:   the same while a member survives (it holds newer data than any
                   snapshot); once none answers, from the newest verified snapshot of
                   spec.backup, onto a new machine.
QCP still recovers only once every member that does not answer runs on a machine
confirmed lost (its infrastructure reports it stopped or gone, or 'qcpctl machine
confirm-lost'), and drops the request once done, or at once if etcd has quorum.
The writes the survivor had not applied, or written after the snapshot, are lost;
status.recovery says which revision was kept.`,
		Example: "  qcpctl recover demo --from survivor\n  qcpctl recover demo --from backup",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from != controlplanev1.RecoverFromSurvivorValue && from != controlplanev1.RecoverFromBackupValue {
				return fmt.Errorf("--from %q: say where the data comes from, --from %s or --from %s",
					from, controlplanev1.RecoverFromSurvivorValue, controlplanev1.RecoverFromBackupValue)
			}
			c, err := g.connect()
			if err != nil {
				return err
			}
			cp, err := controlPlaneOf(cmd.Context(), c, namespace, args[0])
			if err != nil {
				return err
			}
			if err := setAnnotation(cmd.Context(), c, cp, controlplanev1.RecoverAnnotation, from); err != nil {
				return fmt.Errorf("asking %s/%s for a recovery: %w", namespace, cp.Name, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "control plane %s/%s: one recovery from a %s asked for; 'qcpctl describe cluster %s' shows what it waits for\n",
				namespace, cp.Name, from, args[0])
			return nil
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the cluster")
	cmd.Flags().StringVar(&from, "from", "", "where the data comes from: survivor or backup")
	return cmd
}

// setAnnotation sets one annotation on obj with a merge patch.
func setAnnotation(ctx context.Context, c client.Client, obj client.Object, key, value string) error {
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[key] = value
	obj.SetAnnotations(a)
	return c.Patch(ctx, obj, patch)
}
