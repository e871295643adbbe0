// Command etcd is the pinned etcd server, built from go.etcd.io/etcd/server/v3
// so that QCP never downloads a prebuilt binary. Its first argument
// "etcdutl" makes it etcd's offline tool of the same version instead
// (`etcd etcdutl snapshot restore …`), which a machine needs to restore a
// snapshot and to check one: a restore must run the version that wrote the
// data.
package main

import (
	"os"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "etcdutl" {
		root := &cobra.Command{Use: "etcdutl", Short: "etcd's offline tool", SilenceUsage: true}
		root.PersistentFlags().StringVarP(&etcdutl.OutputFormat, "write-out", "w", "simple", "output format (fields, json, simple, table)")
		root.AddCommand(etcdutl.NewSnapshotCommand(), etcdutl.NewVersionCommand())
		root.SetArgs(os.Args[2:])
		if err := root.Execute(); err != nil {
			os.Exit(1)
		}
		return
	}
	etcdmain.Main(os.Args)
}
