package e2e

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/qcp-dev/qcp/internal/cli"
)

// qcpctl runs qcpctl with args against mgmt, as a user does, and fails t
// if it fails.
func qcpctl(ctx context.Context, t testing.TB, mgmt *management, args ...string) {
	t.Helper()
	out, err := runQcpctl(ctx, mgmt, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("qcpctl %v: %s", args, out)
}

// runQcpctl runs qcpctl with args against mgmt and returns what it printed,
// or an error with its output; it does not touch any test, so a fault's
// goroutine may call it.
func runQcpctl(ctx context.Context, mgmt *management, args ...string) (string, error) {
	root := cli.NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--kubeconfig", mgmt.env.Kubeconfig}, args...))
	if err := root.ExecuteContext(ctx); err != nil {
		return "", fmt.Errorf("qcpctl %v: %w\n%s", args, err, out.String())
	}
	return string(bytes.TrimSpace(out.Bytes())), nil
}
