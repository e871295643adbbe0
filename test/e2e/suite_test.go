// Package e2e runs the QuorumControlPlane provider end to end: a local
// management cluster (etcd, kube-apiserver, CAPI core, qcp-manager) creates,
// scales, replaces and deletes real control planes on process machines,
// while a client writes to each workload etcd and a monitor checks the
// quorum invariants.
//
// One management cluster serves the whole package; scenarios that share it
// run side by side (t.Parallel), each with its own Cluster. Scenarios that
// restart qcp-manager start their own.
package e2e

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/hostcpu"
	"github.com/qcp-dev/qcp/internal/hostnet"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/release"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// addressRange keeps this package's machines apart from other packages'
// tests running at the same time. QCP_E2E_ADDRESS_RANGE moves it, so that
// a second checkout's end-to-end tests can run beside these.
var addressRange = cmp.Or(os.Getenv("QCP_E2E_ADDRESS_RANGE"), "127.23.0.0/16")

// shared is the package's management cluster; nil with -short.
var shared *management

// management is a local management cluster with qcp-manager running.
type management struct {
	env     *localenv.Env
	binDir  string
	manager *localenv.Process
	// addressRange is the prefix of this manager's machines: on loopback,
	// or on network's bridge.
	addressRange string
	// network is the machines' network when each machine is a network
	// host of its own (ownNetworkedManagement); nil on loopback addresses.
	network *hostnet.Network
	// managerArgs are extra qcp-manager flags.
	managerArgs []string
	// machineRoot is where its qcp-manager keeps the process machines:
	// the environment's own unless set (a management cluster that took
	// over another's machines with clusterctl move).
	machineRoot string
	// outages are the chaos faults holding its processes down.
	outages outages
	// reads is the cache its scenarios' waits read from (reads_test.go).
	reads readCache
}

// ScenariosEnv sets how many scenarios run side by side (default
// defaultScenarios) when go test is given no -parallel: most of a
// scenario's time goes to waiting on timers and health checks, and four
// scenarios' machines (about 600 MB each) fit in 24 GiB. An explicit
// -parallel wins, as `make chaos` gives.
const ScenariosEnv = "QCP_E2E_SCENARIOS"

const defaultScenarios = 4

// repository is the clusterctl configuration of the release TestMain
// writes, which every management cluster installs from.
var repository string

func TestMain(m *testing.M) {
	flag.Parse()
	if err := scenariosAtOnce(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// The test's own clients log nothing worth reading; the managers log
	// to their files in the environment's directory.
	ctrl.SetLogger(logr.Discard())
	if testing.Short() {
		os.Exit(m.Run())
	}
	binDir, err := os.MkdirTemp("", "qcp-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Scenarios with management clusters of their own start beside the
	// others' machines.
	if err := testkit.EnsureInotifyInstances(1024); err != nil {
		fmt.Fprintln(os.Stderr, "warning:", err)
	}
	code := func() int {
		defer os.RemoveAll(binDir)
		if err := testkit.BuildQCP(binDir, "qcp-manager", "qcp-agent"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// Every management cluster of the suite is what `clusterctl init`
		// makes of this tree's release, as `qcpctl up`'s is.
		if repository, err = release.Write("../..", filepath.Join(binDir, "out"), "v0.1.0"); err != nil {
			fmt.Fprintln(os.Stderr, "writing the release:", err)
			return 1
		}
		mgmt, err := startManagement(binDir, addressRange, nil, localenv.Options{WithKubeadmBootstrap: true})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer mgmt.stop()
		shared = mgmt
		code := m.Run()
		// Least privilege: across the whole run, the shared qcp-manager
		// needed no permission the release does not grant.
		if err := mgmt.refused(); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			code = 1
		}
		return code
	}()
	os.Exit(code)
}

// scenariosAtOnce sets how many scenarios the queue runs at once: -parallel
// if given, else ScenariosEnv, else defaultScenarios. Then it lifts go
// test's own limit, which the queue replaces (see scenarios).
func scenariosAtOnce() error {
	p := flag.Lookup("test.parallel")
	n := defaultScenarios
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if given {
		n, _ = strconv.Atoi(p.Value.String())
	} else if v := os.Getenv(ScenariosEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			return fmt.Errorf("%s=%q: want a positive number of scenarios", ScenariosEnv, v)
		}
	}
	scenarios.slots = max(n, 1)
	if !given && !testing.Short() {
		// Beyond the first, a scenario starts only while the host has CPU
		// to spare (scenarioQueue); -parallel, as `make chaos` gives it,
		// asks for that many at once whatever the load. A build beside
		// the tests yields its CPU, so that CPU is spare.
		load := hostcpu.NewLoad(2*time.Second, 20*time.Second, testkit.BuildTicks)
		scenarios.busy, scenarios.maxBusy, scenarios.spacing, scenarios.aloneAfter = load.Busy, 0.75, 30*time.Second, 2*time.Minute
	}
	return p.Value.Set("1000")
}

// managerEtcdClientLifetime is the life of the etcd client certificates
// every scenario's qcp-manager issues itself: short, so that a manager
// renews them while the scenarios run (after two thirds, 2 minutes), and
// reaches members that restart or join late with a renewed certificate.
// A manager that did not renew them would be refused on every connection
// it opens after 3 minutes: to a member that restarted or joined, to a
// member's pinned status client, and to the agents' settings endpoint.
const managerEtcdClientLifetime = 3 * time.Minute

// startManagement starts a management cluster with opts and qcp-manager on
// it, with extra flags for the manager. The shared one also runs CABPK, for
// the workers scenario.
func startManagement(binDir, addrs string, args []string, opts localenv.Options) (*management, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts.Repository = repository
	e, err := localenv.Start(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("starting the local management cluster: %w", err)
	}
	m := &management{env: e, binDir: binDir, addressRange: addrs, managerArgs: args}
	if err := m.startManager(ctx, ""); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return m, nil
}

// managerArgsEnv holds extra qcp-manager flags, space-separated, for every
// manager the scenarios start.
const managerArgsEnv = "QCP_E2E_MANAGER_ARGS"

// startManager starts qcp-manager with failpoint armed ("" for none). An
// armed manager may reach its failpoint, and kill itself, while starting.
func (m *management) startManager(ctx context.Context, failpoint string) error {
	args := []string{"--address-range=" + m.addressRange, "--etcd-client-certificate-lifetime=" + managerEtcdClientLifetime.String(),
		"--service-account-token-lifetime=" + serviceAccountTokenLifetime.String()}
	// For a look inside a run, for example --profiler-address.
	args = append(args, strings.Fields(os.Getenv(managerArgsEnv))...)
	opts := localenv.ManagerOptions{
		Path:        filepath.Join(m.binDir, "qcp-manager"),
		ExtraArgs:   append(args, m.managerArgs...),
		MachineRoot: m.machineRoot,
	}
	if failpoint != "" {
		opts.Env = []string{engine.FailpointsEnv + "=" + failpoint}
		opts.MayKillItself = true
	}
	p, err := m.env.StartManager(ctx, opts)
	if err != nil {
		return err
	}
	m.manager = p
	return nil
}

// machines is the root of its qcp-manager's process machines.
func (m *management) machines() string {
	if m.machineRoot != "" {
		return m.machineRoot
	}
	return m.env.MachineRoot()
}

func (m *management) stop() {
	m.stopReads()
	if err := m.env.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the management cluster:", err)
	}
}

// refused reports every request of its managers (qcp-manager, CAPI core,
// CABPK) that RBAC refused, in their logs so far: they run as their
// ServiceAccounts with the release's roles, so each is a permission a
// release lacks.
func (m *management) refused() error {
	found, err := m.env.ManagerForbidden()
	if err != nil {
		return fmt.Errorf("reading the managers' logs in %s: %w", m.env.Dir, err)
	}
	if len(found) > 0 {
		return fmt.Errorf("the managers were refused %d requests, so a release's roles lack a permission they use; the first: %s", len(found), found[0])
	}
	return nil
}

// ownManagement starts a management cluster of the calling scenario's
// own, on addrs, with extra qcp-manager flags, and stops it when the
// scenario ends. A second management cluster starting beside the shared
// one has been seen to fail once (CAPI core exiting before it was ready,
// its log gone with the directory); that is the test environment, not
// QCP, so it gets a second attempt.
func ownManagement(t *testing.T, addrs string, args []string) *management {
	t.Helper()
	return ownManagementWith(t, addrs, args, localenv.Options{})
}

// ownManagementWith is ownManagement with options for the management
// cluster.
func ownManagementWith(t *testing.T, addrs string, args []string, opts localenv.Options) *management {
	t.Helper()
	mgmt, err := startManagement(shared.binDir, addrs, args, opts)
	if err != nil {
		t.Logf("starting this scenario's management cluster, attempt 1: %v", err)
		mgmt, err = startManagement(shared.binDir, addrs, args, opts)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mgmt.refused(); err != nil {
			t.Error(err)
		}
		mgmt.stop()
	})
	return mgmt
}

// ownNetworkedManagement is ownManagement with each machine a network host
// of its own (qcp-manager --machine-network=namespaces) on addrs, a range
// off loopback, so that partitions can be made between machines
// (`qcpctl machine isolate`); its bridge is removed after the machines.
func ownNetworkedManagement(t *testing.T, addrs string, args []string) *management {
	t.Helper()
	if err := hostnet.Available(); err != nil {
		t.Fatalf("network namespaces cannot be made here, and this scenario needs them: %v", err)
	}
	network := hostnet.ForRange(netip.MustParsePrefix(addrs))
	// Registered before the management cluster, so that it runs after its
	// machines and their namespaces are gone.
	t.Cleanup(func() {
		if err := network.Remove(); err != nil {
			t.Error(err)
		}
	})
	mgmt := ownManagement(t, addrs, append([]string{"--machine-network=namespaces"}, args...))
	mgmt.network = network
	return mgmt
}

// hostAddress is the host's address the machines of m reach it at: its
// network's bridge's, or "" (127.0.0.1) on loopback addresses.
func (m *management) hostAddress() string {
	if m.network == nil {
		return ""
	}
	return m.network.HostAddr().String()
}

// requirePreviousKube fails t without the kube version upgrades start from
// (skips it outside make test), and puts it into mgmt's machine image:
// `make test` builds it beside the tests, so it can be newer than the image
// the manager installed at its start. Call it after parallel, which waits
// for that build.
func requirePreviousKube(t *testing.T, mgmt *management) {
	t.Helper()
	testkit.RequireBinaries(t, "kube-previous")
	if err := mgmt.env.UpdateMachineImage(); err != nil {
		t.Fatal(err)
	}
}

// requireShared skips with -short and fails if the suite did not start.
func requireShared(t *testing.T) *management {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real control planes; not run with -short")
	}
	if shared == nil {
		t.Fatal("the shared management cluster did not start")
	}
	return shared
}
