// Command testreport reads `go test -json` on stdin and prints what plain
// `go test` would: each package's result and the output of every failed
// test. It ends with the tests that were skipped and why, because `go test`
// without -v hides skips and a skipped test must never pass unseen. It exits
// non-zero when a test or a build failed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json), including the build
// events go test emits since Go 1.24.
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Output     string
}

type report struct {
	out     io.Writer
	outputs map[string][]string // by package and test
	skipped []string
	failed  bool
}

func main() {
	r := &report{out: os.Stdout, outputs: map[string][]string{}}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		r.line(sc.Text())
	}
	r.summary()
	if r.failed {
		os.Exit(1)
	}
}

func (r *report) line(text string) {
	var e event
	if !strings.HasPrefix(text, "{") || json.Unmarshal([]byte(text), &e) != nil {
		// go vet and build errors arrive as plain text.
		fmt.Fprintln(r.out, text)
		return
	}
	key := e.Package + " " + e.Test
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.out, e.Output)
	case "build-fail":
		r.failed = true
	case "output":
		r.outputs[key] = append(r.outputs[key], e.Output)
	case "fail":
		r.failed = true
		r.print(key, e.Test == "")
	case "skip":
		if e.Test == "" {
			r.print(key, true)
			break
		}
		r.skipped = append(r.skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(r.outputs[key])))
	case "pass":
		if e.Test == "" {
			r.print(key, true)
		}
	}
	if e.Action == "fail" || e.Action == "skip" || e.Action == "pass" {
		delete(r.outputs, key)
	}
}

// print writes a test's output, or a package's result lines, leaving out
// the progress lines `go test -v` would add.
func (r *report) print(key string, pkg bool) {
	for _, o := range r.outputs[key] {
		trimmed := strings.TrimSpace(o)
		if strings.HasPrefix(trimmed, "=== ") || (pkg && trimmed == "PASS") {
			continue
		}
		fmt.Fprint(r.out, o)
	}
}

// reason is what a skipped test logged, without the "--- SKIP" line.
func reason(output []string) string {
	var parts []string
	for _, o := range output {
		o = strings.TrimSpace(o)
		if o == "" || strings.HasPrefix(o, "=== ") || strings.HasPrefix(o, "--- SKIP") {
			continue
		}
		parts = append(parts, o)
	}
	return strings.Join(parts, " ")
}

func (r *report) summary() {
	fmt.Fprintf(r.out, "\n%d tests skipped\n", len(r.skipped))
	for _, s := range r.skipped {
		fmt.Fprintln(r.out, "  "+s)
	}
}
