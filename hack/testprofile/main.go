// Command testprofile records where a run of `make test` spends its time
// and CPU, and reports it as a timeline.
//
//	testprofile record -o bin/profile.jsonl -- make test
//	testprofile report -profile bin/profile.jsonl -tests bin/test.json
//
// record samples the host's CPU (/proc/stat) and every process's once a
// second while the command runs, and attributes each process's CPU to a
// group: its owner (the test package whose binary started it, a build step,
// a go command), its component (etcd, kube-apiserver, qcp-agent, the Go
// toolchain, ...) and, for a process machine, the cluster it belongs to.
// report joins that with `go test -json` output: the build and test phases,
// each package and scenario with its wall time and CPU-seconds, the CPU by
// component, and the time in which a core stood idle.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "record":
		fs := flag.NewFlagSet("record", flag.ExitOnError)
		out := fs.String("o", "profile.jsonl", "where to write the samples")
		every := fs.Duration("interval", time.Second, "time between samples")
		_ = fs.Parse(os.Args[2:])
		if fs.NArg() == 0 {
			usage()
		}
		os.Exit(record(*out, *every, fs.Args()))
	case "report":
		fs := flag.NewFlagSet("report", flag.ExitOnError)
		prof := fs.String("profile", "bin/profile.jsonl", "samples from testprofile record")
		tests := fs.String("tests", "bin/test.json", "go test -json output of the same run")
		startFile := fs.String("test-start", "bin/test-start", "a file holding the Unix time in milliseconds at which go test started; ignored when missing")
		_ = fs.Parse(os.Args[2:])
		var start time.Time
		if b, err := os.ReadFile(*startFile); err == nil {
			ms, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				fmt.Fprintln(os.Stderr, "testprofile:", *startFile, err)
				os.Exit(1)
			}
			start = time.UnixMilli(ms)
		}
		if err := report(os.Stdout, *prof, *tests, start); err != nil {
			fmt.Fprintln(os.Stderr, "testprofile:", err)
			os.Exit(1)
		}
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: testprofile record [-o FILE] -- COMMAND...\n       testprofile report [-profile FILE] [-tests FILE]")
	os.Exit(2)
}
