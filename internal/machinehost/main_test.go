package machinehost

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/hostcgroup"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// agentPath is the qcp-agent built once for the package's tests.
var agentPath string

// helperEnv makes the test binary act as a short-lived "manager" that
// starts a load balancer and exits, for the outlive-the-manager test.
const helperEnv = "QCP_MACHINEHOST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "startlb" {
		ca, err := os.ReadFile(os.Getenv("HELPER_CA"))
		if err == nil {
			h := &Host{Root: os.Getenv("HELPER_ROOT"), AgentPath: os.Getenv("HELPER_AGENT")}
			err = h.StartLB("ns", "c", os.Getenv("HELPER_ADDR"), ca)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	tmp, err := os.MkdirTemp("", "qcp-agent-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentPath = filepath.Join(tmp, "qcp-agent")
	// QCP_AGENT_RACE=1 builds the agent with the race detector; races then
	// appear in each machine's agent.log.
	if os.Getenv("QCP_AGENT_RACE") == "1" {
		build := exec.Command("go", "build", "-race", "-o", agentPath, "github.com/qcp-dev/qcp/cmd/qcp-agent")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		err = build.Run()
	} else {
		err = testkit.BuildQCP(tmp, "qcp-agent")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "building qcp-agent:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

func newHost(t testing.TB) *Host {
	t.Helper()
	binDir, err := binaries.Dir()
	if err != nil {
		t.Fatal(err)
	}
	// A short root keeps paths readable in process listings.
	root, err := os.MkdirTemp("", "qcp-machines-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	// Cgroups wherever qcp-manager would give them (as root): CI's machines
	// are frozen through their freezer cgroups.
	return &Host{Root: root, BinDir: binDir, AgentPath: agentPath, Cgroups: hostcgroup.Available() == nil}
}
