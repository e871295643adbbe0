// Package cli holds qcpctl's commands.
package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qcp-dev/qcp/internal/scheme"
	"github.com/qcp-dev/qcp/internal/version"
)

// StateDirEnv overrides the default state directory.
const StateDirEnv = "QCP_STATE_DIR"

// globals are the flags every subcommand honours.
type globals struct {
	stateDir   string
	kubeconfig string
}

// NewRoot returns the qcpctl command tree.
func NewRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "qcpctl",
		Short: "Run and inspect a local QCP management cluster",
		Long: "qcpctl runs a local QCP management cluster (etcd, kube-apiserver, CAPI core and qcp-manager, " +
			"all as processes on this machine) with a sample highly available control plane, and inspects " +
			"and breaks it.",
		Example: `  qcpctl up                              # management cluster + the sample cluster demo
  qcpctl describe cluster demo --watch   # what each machine and etcd member does
  qcpctl scale demo --replicas 5
  qcpctl machine kill demo-control-plane-abcde
  qcpctl down`,
		Version:       version.Get(),
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", defaultStateDir(),
		"directory that holds the local management cluster's state (env "+StateDirEnv+")")
	root.PersistentFlags().StringVar(&g.kubeconfig, "kubeconfig", "",
		"kubeconfig of the management cluster (default $KUBECONFIG, else the one in --state-dir)")
	root.AddCommand(newUpCommand(g), newServeCommand(g), newDownCommand(g), newKubeconfigCommand(g),
		newScaleCommand(g), newMachineCommand(g), newRecoverCommand(g), newDescribeRoot(g))
	return root
}

func defaultStateDir() string {
	if d := os.Getenv(StateDirEnv); d != "" {
		return d
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return ".qcp"
	}
	return filepath.Join(cache, "qcp")
}

// managementKubeconfig is the kubeconfig qcpctl uses: the flag, then
// $KUBECONFIG, then the one qcpctl up wrote.
func (g *globals) managementKubeconfig() (string, error) {
	for _, p := range []string{g.kubeconfig, os.Getenv("KUBECONFIG")} {
		if p != "" {
			return p, nil
		}
	}
	p := filepath.Join(g.stateDir, "kubeconfig")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("no management cluster at %s: run 'qcpctl up'", g.stateDir)
	}
	return p, nil
}

// connect returns a client for the management cluster.
func (g *globals) connect() (client.Client, error) {
	p, err := g.managementKubeconfig()
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", p)
	if err != nil {
		return nil, fmt.Errorf("reading the management cluster's kubeconfig %s: %w", p, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return nil, fmt.Errorf("reaching the management cluster of %s: %w", p, err)
	}
	return c, nil
}

func newDescribeRoot(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe",
		Short: "Describe a cluster: its control plane, machines and etcd members",
	}
	cmd.AddCommand(newDescribeCommand(g.connect))
	return cmd
}
