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
	"github.com/qcp-dev/qcp/internal/hostnet"
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
		// A machine in a UTS namespace of its own is named for itself.
		PersistentPreRunE: func(*cobra.Command, []string) error { return hostnet.SetHostname() },
	}
	root.AddCommand(newRun(), newLB())
	return root
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
}

func newRun() *cobra.Command {
	var opts agent.Options
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the machine: from --bootstrap-file as a cloud-config wrote it, or from <dir>/machine.json and <dir>/bootstrap-data (the old qcp format)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.BinDir == "" {
				d, err := binaries.Dir()
				if err != nil {
					return fmt.Errorf("--bin-dir not set: %w", err)
				}
				opts.BinDir = d
			}
			if opts.BootstrapFile != "" && opts.NodeName == "" {
				return fmt.Errorf("--node-name is required with --bootstrap-file: the unit passes the host name")
			}
			ctx, cancel := signalContext()
			defer cancel()
			opts.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
			return agent.Run(ctx, opts)
		},
	}
	cmd.Flags().StringVar(&opts.Dir, "dir", "", "the agent's data directory (certificates, etcd data, logs, status.json)")
	cmd.Flags().StringVar(&opts.BinDir, "bin-dir", "", "directory holding etcd-<version> and kube-<version> (default: the repository's bin/ or $QCP_BIN_DIR)")
	cmd.Flags().StringVar(&opts.BootstrapFile, "bootstrap-file", "", "the bootstrap document a cloud-config wrote; without it, <dir>/bootstrap-data and <dir>/machine.json")
	cmd.Flags().StringVar(&opts.NodeName, "node-name", "", "the machine's name: its Node's and its etcd member's (the host name)")
	cmd.Flags().StringVar(&opts.Address, "address", "", "the machine's IPv4 address (default: the instance data's local IPv4 address, else the first address of an interface that is up)")
	cmd.Flags().StringVar(&opts.InstanceData, "instance-data", "/run/cloud-init/instance-data.json", "cloud-init's instance data")
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
