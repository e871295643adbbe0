package backup

import (
	"errors"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
)

// Schedule says when the next snapshot is due.
type Schedule struct {
	interval time.Duration
	cron     cron.Schedule
}

// ParseSchedule reads spec.backup.schedule: an interval in seconds, or a
// standard five-field cron expression (or a descriptor such as @hourly),
// evaluated in UTC. Exactly one must be given.
func ParseSchedule(intervalSeconds *int32, expr string) (Schedule, error) {
	switch {
	case intervalSeconds != nil && expr != "":
		return Schedule{}, errors.New("give intervalSeconds or cron, not both")
	case intervalSeconds != nil:
		if *intervalSeconds <= 0 {
			return Schedule{}, fmt.Errorf("intervalSeconds must be positive, not %d", *intervalSeconds)
		}
		return Schedule{interval: time.Duration(*intervalSeconds) * time.Second}, nil
	case expr != "":
		s, err := cron.ParseStandard(expr)
		if err != nil {
			return Schedule{}, fmt.Errorf("cron %q: %v; give five fields (minute hour day-of-month month day-of-week), e.g. \"0 */6 * * *\", or a descriptor such as @hourly", expr, err)
		}
		return Schedule{cron: s}, nil
	}
	return Schedule{}, errors.New("give intervalSeconds or cron")
}

// Next is when the snapshot after one taken at last is due; a cluster
// with no snapshot yet is due at once (the zero last).
func (s Schedule) Next(last time.Time) time.Time {
	if last.IsZero() {
		return last
	}
	if s.cron != nil {
		return s.cron.Next(last.UTC())
	}
	return last.Add(s.interval)
}
