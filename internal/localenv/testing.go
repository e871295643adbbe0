package localenv

import (
	"context"
	"testing"
	"time"
)

// StartForTest starts a local management cluster for t and stops it when t
// ends, whether it passed or not.
func StartForTest(t testing.TB, opts Options) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a management cluster; not run with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting the local management cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the local management cluster: %v", err)
		}
	})
	return env
}
