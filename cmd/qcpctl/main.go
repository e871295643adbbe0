// Command qcpctl runs a local QCP management cluster and inspects it.
package main

import (
	"os"

	"github.com/qcp-dev/qcp/internal/cli"
)

func main() {
	if err := cli.NewRoot().Execute(); err != nil {
		os.Exit(1)
	}
}
