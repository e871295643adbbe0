// Command chaossummary reads chaos outcomes, one JSON line each (as
// `make chaos` appends them to bin/chaos.jsonl), on stdin and prints the
// campaign's summary table, so that a campaign carried out in parts, or
// stopped early, can be summed up from its lines.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"github.com/qcp-dev/qcp/test/chaos"
)

func main() {
	var outcomes []chaos.Outcome
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for line := 1; sc.Scan(); line++ {
		var o chaos.Outcome
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			fmt.Fprintf(os.Stderr, "line %d: %v\n", line, err)
			os.Exit(1)
		}
		outcomes = append(outcomes, o)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(chaos.Summarize(outcomes).Table())
}
