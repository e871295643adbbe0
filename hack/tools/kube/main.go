// Command kube is one multi-call binary for kube-apiserver,
// kube-controller-manager, kube-scheduler and kubeadm, chosen by its first argument or,
// when invoked through a link named after a component, by its own name (so
// tools such as envtest that exec "kube-apiserver" can use it). One binary
// links the shared Kubernetes code once instead of three times.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeadm "k8s.io/kubernetes/cmd/kubeadm/app/cmd"
	kubeadmerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
)

func main() {
	commands := map[string]func() *cobra.Command{
		"kube-apiserver":          apiserver.NewAPIServerCommand,
		"kube-controller-manager": controllermanager.NewControllerManagerCommand,
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
		// The tests run kubeadm's join discovery against QCP's cluster-info.
		"kubeadm": func() *cobra.Command { return kubeadm.NewKubeadmCommand(os.Stdin, os.Stdout, os.Stderr) },
	}
	args := os.Args[1:]
	name := filepath.Base(os.Args[0])
	if commands[name] == nil && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	if commands[name] == nil {
		fmt.Fprintln(os.Stderr, "usage: kube {kube-apiserver|kube-controller-manager|kube-scheduler|kubeadm} [flags]")
		os.Exit(2)
	}
	cmd := commands[name]()
	cmd.SetArgs(args)
	if name == "kubeadm" {
		// As kubeadm's own main: it prints its errors itself and exits.
		kubeadmerrors.HandleError(cmd.Execute())
		return
	}
	os.Exit(cli.Run(cmd))
}
