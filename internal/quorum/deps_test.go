package quorum_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPlannerImportsNoClients keeps the planner pure: nothing it depends on
// may reach Kubernetes or etcd.
func TestPlannerImportsNoClients(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "k8s.io/") || strings.HasPrefix(pkg, "sigs.k8s.io/") || strings.HasPrefix(pkg, "go.etcd.io/") {
			t.Errorf("internal/quorum depends on %s", pkg)
		}
	}
	if !strings.Contains(string(out), "github.com/qcp-dev/qcp/internal/quorum") {
		t.Errorf("go list did not list the package itself:\n%s", out)
	}
}
