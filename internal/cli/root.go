// Package cli holds qcpctl's commands.
package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/qcp-dev/qcp/internal/version"
)

// NewRoot returns the qcpctl command tree.
func NewRoot() *cobra.Command {
	var dir string
	root := &cobra.Command{
		Use:           "qcpctl",
		Short:         "Run and inspect a local QCP management cluster",
		Version:       version.Get(),
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.PersistentFlags().StringVar(&dir, "dir", defaultDir(), "directory of the local management cluster's state")
	root.AddCommand(newUpCommand(&dir), newDownCommand(&dir), newKubeconfigCommand(&dir))
	root.AddCommand(newFaultCommands(&dir)...)
	return root
}

func defaultDir() string {
	if d := os.Getenv("QCP_HOME"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ".qcp"
	}
	return filepath.Join(home, ".qcp", "local")
}

func newKubeconfigCommand(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "kubeconfig",
		Short: "Print the path of the management cluster's kubeconfig",
		RunE: func(cmd *cobra.Command, _ []string) error {
			p := filepath.Join(*dir, "kubeconfig")
			if _, err := os.Stat(p); err != nil {
				return fmt.Errorf("no management cluster at %s: run `make up` (or `qcpctl up`) first", *dir)
			}
			fmt.Fprintln(cmd.OutOrStdout(), p)
			return nil
		},
	}
}
