package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/qcp-dev/qcp/internal/localenv"
)

const pidFile = "qcpctl.pid"

func newUpCommand(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "up",
		Short: "Start a local management cluster: etcd, kube-apiserver, CAPI core and qcp-manager",
		Long: "up starts the management cluster in the foreground and keeps it running until " +
			"interrupted (Ctrl-C) or until `qcpctl down` is run from another terminal.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return up(ctx, cmd, *dir)
		},
	}
}

func up(ctx context.Context, cmd *cobra.Command, dir string) error {
	if pid, ok := runningPID(dir); ok {
		return fmt.Errorf("a management cluster already runs from %s (qcpctl pid %d): run `qcpctl down` first", dir, pid)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clearing %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	start := time.Now()
	fmt.Fprintln(out, "starting etcd, kube-apiserver and CAPI core ...")
	env, err := localenv.Start(ctx, localenv.Options{Dir: dir})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "stopping the management cluster ...")
		if err := env.Stop(); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), err)
		}
		_ = os.Remove(filepath.Join(dir, pidFile))
	}()
	fmt.Fprintln(out, "starting qcp-manager ...")
	if _, err := env.StartManager(ctx, localenv.ManagerOptions{}); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(out, `
QCP management cluster is up (%s).
  kubeconfig:  %s
  API server:  %s
  logs:        %s/*.log
Reach it with:  export KUBECONFIG=%s
Stop it with Ctrl-C, or run `+"`make down`"+` from another terminal.
`, time.Since(start).Round(100*time.Millisecond), env.Kubeconfig, env.Config.Host, dir, env.Kubeconfig)
	<-ctx.Done()
	return nil
}

func newDownCommand(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop the local management cluster started by `qcpctl up`",
		RunE: func(cmd *cobra.Command, _ []string) error {
			pid, ok := runningPID(*dir)
			if !ok {
				fmt.Fprintf(cmd.OutOrStdout(), "no management cluster runs from %s\n", *dir)
				return nil
			}
			if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
				return fmt.Errorf("signalling qcpctl up (pid %d): %w", pid, err)
			}
			deadline := time.Now().Add(2 * time.Minute)
			for time.Now().Before(deadline) {
				if syscall.Kill(pid, 0) != nil {
					fmt.Fprintln(cmd.OutOrStdout(), "management cluster stopped")
					return nil
				}
				time.Sleep(200 * time.Millisecond)
			}
			return errors.New("qcpctl up did not stop within 2 minutes; see its terminal")
		},
	}
}

func runningPID(dir string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || syscall.Kill(pid, 0) != nil {
		return 0, false
	}
	return pid, true
}
