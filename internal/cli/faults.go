package cli

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/qcp-dev/qcp/internal/machinehost"
)

// newFaultCommands returns kill, freeze and thaw: fault injection on a
// process machine of the local management cluster.
func newFaultCommands(dir *string) []*cobra.Command {
	var namespace string
	faults := []struct {
		use, short string
		act        func(h *machinehost.Host, ns, name string) error
		done       string
	}{
		{"kill MACHINE", "Kill a machine: SIGKILL to its whole process group, as a power cut",
			(*machinehost.Host).Kill, "killed"},
		{"freeze MACHINE", "Freeze a machine: SIGSTOP to its process group, as a hung host",
			(*machinehost.Host).Freeze, "frozen"},
		{"thaw MACHINE", "Thaw a frozen machine: SIGCONT to its process group",
			(*machinehost.Host).Thaw, "thawed"},
	}
	var cmds []*cobra.Command
	for _, f := range faults {
		cmd := &cobra.Command{
			Use:   f.use,
			Short: f.short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				h := &machinehost.Host{Root: filepath.Join(*dir, "machines")}
				if err := f.act(h, namespace, args[0]); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "machine %s/%s %s\n", namespace, args[0], f.done)
				return nil
			},
		}
		cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the machine")
		cmds = append(cmds, cmd)
	}
	return cmds
}
