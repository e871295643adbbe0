package localenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary a child that serves /readyz on the
// address it is given, standing in for a manager.
const helperEnv = "QCP_LOCALENV_HELPER_ADDR"

// StandInManagerEnv makes the test binary stand in for a qcp-manager that
// ends while starting; its value says how (one of the StandIn constants).
// Such a stand-in serves /readyz on its --health-probe-bind-address, and
// never the webhooks.
const StandInManagerEnv = "QCP_LOCALENV_STAND_IN_MANAGER"

// How a stand-in manager ends.
const (
	// StandInKilledAtStart kills itself with SIGKILL before it is ready.
	StandInKilledAtStart = "killed-at-start"
	// StandInKilledWhenReady kills itself with SIGKILL once /readyz has
	// answered, as a manager that reaches an armed failpoint does.
	StandInKilledWhenReady = "killed-when-ready"
	// StandInFailsWhenReady exits with status 1 once /readyz has answered.
	StandInFailsWhenReady = "fails-when-ready"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		http.HandleFunc("/readyz", func(http.ResponseWriter, *http.Request) {})
		fmt.Fprintln(os.Stderr, http.ListenAndServe(addr, nil))
		os.Exit(1)
	}
	if how := os.Getenv(StandInManagerEnv); how != "" {
		standInManager(how)
	}
	os.Exit(m.Run())
}

// standInManager is the test binary standing in for a qcp-manager that ends
// while starting, the way how says.
func standInManager(how string) {
	if how == StandInKilledAtStart {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	var probe string
	for _, arg := range os.Args[1:] {
		if v, ok := strings.CutPrefix(arg, "--health-probe-bind-address="); ok {
			probe = v
		}
	}
	var once sync.Once
	http.HandleFunc("/readyz", func(http.ResponseWriter, *http.Request) {
		once.Do(func() {
			go func() {
				time.Sleep(time.Second) // the reply goes out first
				if how == StandInKilledWhenReady {
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				}
				os.Exit(1)
			}()
		})
	})
	fmt.Fprintln(os.Stderr, http.ListenAndServe(probe, nil))
	os.Exit(1)
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
