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
		err := cond(ctx)
		if err == nil {
			return nil
		}
		// A complaint cut short by ctx itself says nothing about the
		// condition; keep the one before it.
		if last == nil || ctx.Err() == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %w)", what, ctx.Err(), last)
		case <-t.C:
		}
	}
}
