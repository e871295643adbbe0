// Command release writes QCP's clusterctl provider repository (`make
// release`); see internal/release.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/qcp-dev/qcp/internal/release"
)

func main() {
	out := flag.String("out", "out", "directory the repository is written to")
	version := flag.String("version", "v0.1.0", "the release's version, vMAJOR.MINOR.PATCH")
	flag.Parse()
	config, err := release.Write(".", *out, *version)
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	fmt.Println("wrote the provider repository; use it with clusterctl --config", config)
}
