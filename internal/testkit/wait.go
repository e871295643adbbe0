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
		// A complaint cut short by ctx itself says nothing about the
		// condition; keep the one before it. That includes a call begun
		// within an interval of the deadline: a client's rate limiter
		// refuses at once to wait past it, before ctx ends.
		dl, ok := ctx.Deadline()
		final := ok && time.Until(dl) < interval
		err := cond(ctx)
		if err == nil {
			return nil
		}
		if last == nil || ctx.Err() == nil && !final {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %w)", what, ctx.Err(), last)
		case <-t.C:
		}
	}
}
