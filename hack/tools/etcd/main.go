// Command etcd is the pinned etcd server, built from go.etcd.io/etcd/server/v3
// so that QCP never downloads a prebuilt binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
