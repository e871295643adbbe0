// Command benchjson reads `go test -json -bench` output on stdin and prints
// one JSON object per benchmark result: its package, name and metrics.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
)

type event struct {
	Action  string
	Package string
	Output  string
}

type result struct {
	Package string             `json:"package"`
	Name    string             `json:"name"`
	Runs    int                `json:"runs"`
	Metrics map[string]float64 `json:"metrics"`
}

func main() {
	var results []result
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	failed := false
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		if e.Action == "fail" {
			failed = true
		}
		if r, ok := parse(e.Package, e.Output); ok {
			results = append(results, r)
		}
	}
	out, _ := json.MarshalIndent(results, "", "  ")
	fmt.Println(string(out))
	if failed {
		fmt.Fprintln(os.Stderr, "some benchmarks failed; see bin/bench.json")
		os.Exit(1)
	}
}

// parse reads a result line: "BenchmarkX-2   1   123 ns/op   4.5 unit ...".
func parse(pkg, line string) (result, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
		return result{}, false
	}
	runs, err := strconv.Atoi(f[1])
	if err != nil {
		return result{}, false
	}
	r := result{Package: pkg, Name: f[0], Runs: runs, Metrics: map[string]float64{}}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return result{}, false
		}
		r.Metrics[f[i+1]] = v
	}
	return r, true
}
