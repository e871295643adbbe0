// Command qcp-agent runs a QCP process machine (`run`) or a cluster's
// control plane load balancer (`lb`).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/lb"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "qcp-agent:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "qcp-agent",
		Short:         "The QCP machine agent: runs a process machine's components, or a cluster's load balancer",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRun(), newLB())
	return root
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

func newRun() *cobra.Command {
	var dir, binDir string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the machine described by <dir>/machine.json and <dir>/bootstrap-data",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if binDir == "" {
				d, err := binaries.Dir()
				if err != nil {
					return fmt.Errorf("--bin-dir not set: %w", err)
				}
				binDir = d
			}
			ctx, cancel := signalContext()
			defer cancel()
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			return agent.Run(ctx, agent.Options{Dir: dir, BinDir: binDir, Log: log})
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "machine directory")
	cmd.Flags().StringVar(&binDir, "bin-dir", "", "directory holding etcd-<version> and kube-<version> (default: the repository's bin/ or $QCP_BIN_DIR)")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

func newLB() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "lb",
		Short: "Run the control plane load balancer described by <dir>/lb.json, <dir>/backends.json and <dir>/ca.crt",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			b, err := lb.New(dir, log)
			if err != nil {
				return err
			}
			return b.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "load balancer directory")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}
