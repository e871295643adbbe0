package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestReportEndsWithWhyTestsFailed feeds the report a failed subtest whose
// error line is followed by component logs, and checks that the report's
// end names the test and its error line, but not the logs.
func TestReportEndsWithWhyTestsFailed(t *testing.T) {
	pkg := "example.com/p"
	events := []event{
		{Action: "run", Package: pkg, Test: "TestA"},
		{Action: "run", Package: pkg, Test: "TestA/step"},
		{Action: "output", Package: pkg, Test: "TestA/step", Output: "=== RUN   TestA/step\n"},
		{Action: "output", Package: pkg, Test: "TestA/step", Output: "    a_test.go:12: machine m1 not running\n"},
		{Action: "output", Package: pkg, Test: "TestA/step", Output: "I1124 08:30:30.732395   29727 controller.go:494] \"Reconciler error\"\n"},
		{Action: "output", Package: pkg, Test: "TestA/step", Output: "    --- FAIL: TestA/step (1.00s)\n"},
		{Action: "fail", Package: pkg, Test: "TestA/step"},
		{Action: "run", Package: pkg, Test: "TestB"},
		{Action: "pass", Package: pkg, Test: "TestB"},
		{Action: "output", Package: pkg, Test: "TestA", Output: "--- FAIL: TestA (1.00s)\n"},
		{Action: "fail", Package: pkg, Test: "TestA"},
		{Action: "fail", Package: pkg},
	}
	var out strings.Builder
	r := &report{out: &out, outputs: map[string][]string{}}
	for _, e := range events {
		line, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		r.line(string(line))
	}
	r.summary()
	if !r.failed {
		t.Error("the report does not count the run as failed")
	}
	_, end, ok := strings.Cut(out.String(), "0 tests skipped\n")
	if !ok {
		t.Fatalf("no skip summary in:\n%s", out.String())
	}
	want := "\n2 tests failed\n  example.com/p TestA/step\n    a_test.go:12: machine m1 not running\n  example.com/p TestA\n"
	if end != want {
		t.Errorf("the report ends with\n%q\nwant\n%q", end, want)
	}
}
