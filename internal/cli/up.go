package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// sampleTimeout bounds the wait for the sample control plane.
const sampleTimeout = 10 * time.Minute

func newUpCommand(dir *string) *cobra.Command {
	sample := true
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a local management cluster (etcd, kube-apiserver, CAPI core, qcp-manager) with a sample 3-machine control plane",
		Long: "up starts the management cluster in the foreground, creates the sample cluster demo " +
			"(config/samples/demo.yaml: 3 control plane machines over 3 failure domains) and waits until it is " +
			"Available, then keeps running until interrupted (Ctrl-C) or until `qcpctl down` is run from another terminal.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return up(ctx, cmd, *dir, sample)
		},
	}
	cmd.Flags().BoolVar(&sample, "sample", true, "create the sample cluster demo and wait until its control plane is Available")
	return cmd
}

func up(ctx context.Context, cmd *cobra.Command, dir string, sample bool) error {
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
	if sample {
		createSample(ctx, out, env, start)
	}
	<-ctx.Done()
	return nil
}

// createSample creates the demo cluster and waits for its control plane,
// showing progress. A sample that does not come up is reported, and the
// management cluster stays up so that it can be inspected.
func createSample(ctx context.Context, out io.Writer, env *localenv.Env, start time.Time) {
	fmt.Fprintf(out, "creating the sample cluster %s (%s): %d control plane machines over 3 failure domains ...\n",
		sampleCluster, "config/"+sampleFile, sampleReplicas)
	if err := applySample(ctx, env.Client); err != nil {
		fmt.Fprintf(out, "the sample cluster was not created: %v\n", err)
		return
	}
	wctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	if err := waitForSample(wctx, out, env.Client, start); err != nil {
		fmt.Fprintf(out, "the sample control plane is not Available after %s (%v); inspect it with kubectl (see below)\n", sampleTimeout, err)
		return
	}
	fmt.Fprintf(out, `
The sample control plane is Available: 3 etcd voters, one machine per failure domain.
With the management cluster's KUBECONFIG above:
  Its kubeconfig:  kubectl get secret %s-kubeconfig -o jsonpath='{.data.value}' | base64 -d > %s.kubeconfig
  Then try:        KUBECONFIG=%s.kubeconfig kubectl get nodes
                   kubectl get quorumcontrolplane,machines -o wide
                   kubectl scale quorumcontrolplane %s --replicas 5
`, sampleCluster, sampleCluster, sampleCluster, sampleControlPlane)
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
