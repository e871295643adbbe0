package localenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"
)

// helperEnv makes the test binary a child that serves /readyz on the
// address it is given, standing in for a manager.
const helperEnv = "QCP_LOCALENV_HELPER_ADDR"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		http.HandleFunc("/readyz", func(http.ResponseWriter, *http.Request) {})
		fmt.Fprintln(os.Stderr, http.ListenAndServe(addr, nil))
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// TestChildRestartedWhenItsPortWasTaken takes the port a child was given
// before the child binds it, as another package's test may: the child must
// be started again on new ports rather than fail the environment.
func TestChildRestartedWhenItsPortWasTaken(t *testing.T) {
	e := &Env{Dir: t.TempDir()}
	var given [][]string
	start := func(addrs []string) (*Process, error) {
		given = append(given, addrs)
		if len(given) == 1 {
			// The first child finds its port taken.
			return StartProcess("helper", "/bin/sh", []string{"-c", "echo 'listen tcp " + addrs[0] + ": bind: address already in use' >&2; exit 1"}, nil, e.Dir)
		}
		return StartProcess("helper", os.Args[0], []string{"-test.run=^$"}, []string{helperEnv + "=" + addrs[0]}, e.Dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, addrs, err := e.startOnFreePorts(ctx, "helper", 1, start, func(addrs []string) string { return "http://" + addrs[0] + "/readyz" })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	if len(given) != 2 || addrs[0] != given[1][0] {
		t.Errorf("started %d times with %v, returned %v; want a second start on the returned ports", len(given), given, addrs)
	}
}

// TestChildNotRestartedForOtherFailures checks that a child failing for any
// other reason is reported at once, not retried.
func TestChildNotRestartedForOtherFailures(t *testing.T) {
	e := &Env{Dir: t.TempDir()}
	starts := 0
	start := func([]string) (*Process, error) {
		starts++
		return StartProcess("helper", "/bin/sh", []string{"-c", "echo 'bad flag' >&2; exit 2"}, nil, e.Dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := e.startOnFreePorts(ctx, "helper", 1, start, func(addrs []string) string { return "http://" + addrs[0] + "/readyz" }); err == nil || starts != 1 {
		t.Errorf("err %v after %d starts; want the failure after one start", err, starts)
	}
}
