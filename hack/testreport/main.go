// Command testreport reads `go test -json` on stdin and prints what plain
// `go test` would: each package's result and the output of every failed
// test. It ends with the tests that were skipped and why, because `go test`
// without -v hides skips and a skipped test must never pass unseen, and
// then with each failed test and the lines its t.Error and t.Fatal calls
// wrote: a failed test's output can run to thousands of lines of component
// logs, and whoever reads only the end of the report must still see why. It
// exits non-zero when a test or a build failed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
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
	// failures are the failed tests, each with its t.Error and t.Fatal
	// lines.
	failures []string
	failed   bool
}

// maxFailureLines bounds the lines a failed test contributes to the
// summary.
const maxFailureLines = 10

// testingLine matches what t.Error, t.Fatal and t.Log write: "file.go:12: ".
// Component logs (klog's "file.go:12]") do not match.
var testingLine = regexp.MustCompile(`^\s*[\w.-]+\.go:\d+: `)

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
		if e.Test != "" {
			r.failures = append(r.failures, failure(e.Package, e.Test, r.outputs[key]))
		}
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

// failure is a failed test's name and the lines its testing calls wrote,
// at most maxFailureLines of them.
func failure(pkg, test string, output []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", pkg, test)
	n := 0
	for _, o := range output {
		if !testingLine.MatchString(o) {
			continue
		}
		if n++; n > maxFailureLines {
			fmt.Fprintf(&b, "\n    ... and more")
			break
		}
		fmt.Fprintf(&b, "\n    %s", strings.TrimSpace(o))
	}
	return b.String()
}

func (r *report) summary() {
	fmt.Fprintf(r.out, "\n%d tests skipped\n", len(r.skipped))
	for _, s := range r.skipped {
		fmt.Fprintln(r.out, "  "+s)
	}
	if len(r.failures) > 0 {
		fmt.Fprintf(r.out, "\n%d tests failed\n", len(r.failures))
		for _, f := range r.failures {
			fmt.Fprintln(r.out, "  "+f)
		}
	}
}
