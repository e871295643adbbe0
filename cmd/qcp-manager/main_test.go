package main

import (
	"os"
	"strings"
	"testing"

	"github.com/qcp-dev/qcp/internal/controllers/process"
)

// TestProcessFlagsOnlyWithItsControllers: the process provider's flags are
// required, and defaulted, only when its controllers run.
func TestProcessFlagsOnlyWithItsControllers(t *testing.T) {
	controlPlaneOnly := controlPlaneOptions{controllers: map[string]bool{"controlplane": true}}
	got, err := completeProcessOptions(process.Options{}, controlPlaneOnly)
	if err != nil || got.MachineRoot != "" || got.BinDir != "" || got.AgentPath != "" {
		t.Errorf("--controllers=controlplane without process flags: %+v, %v; want them left alone and no error", got, err)
	}
	if _, err := completeProcessOptions(process.Options{}, controlPlaneOptions{}); err == nil || !strings.Contains(err.Error(), "--machine-root is required") {
		t.Errorf("every controller without --machine-root: %v; want --machine-root required", err)
	}
	t.Setenv("QCP_BIN_DIR", t.TempDir())
	got, err = completeProcessOptions(process.Options{MachineRoot: "/m"}, controlPlaneOptions{})
	if err != nil || got.BinDir != os.Getenv("QCP_BIN_DIR") || !strings.HasSuffix(got.AgentPath, "/qcp-agent") {
		t.Errorf("every controller with --machine-root: %+v, %v; want the bin and agent defaults", got, err)
	}
}
