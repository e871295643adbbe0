package testkit

import (
	"context"
	"fmt"
	"time"
)

// Eventually calls cond every interval until it returns nil or ctx ends; the
// error then names what was waited for and the condition's last complaint.
func Eventually(ctx context.Context, interval time.Duration, what string, cond func(context.Context) error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last error
	for {
		if last = cond(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %w)", what, ctx.Err(), last)
		case <-t.C:
		}
	}
}
