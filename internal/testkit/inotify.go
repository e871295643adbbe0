package testkit

import (
	"fmt"
	"os"
	"strconv"
)

// inotifyInstances is the per-user inotify instance limit knob. Each process
// machine's Kubernetes components hold about 14 instances, and Linux allows
// 128 per user by default: nine machines exhaust it (hack/inotify-limit.sh
// says more).
const inotifyInstances = "/proc/sys/fs/inotify/max_user_instances"

// EnsureInotifyInstances raises the host's inotify instance limit to want
// when it is lower and the knob is writable (root), and otherwise returns an
// error that names the fix.
func EnsureInotifyInstances(want int) error {
	b, err := os.ReadFile(inotifyInstances)
	if err != nil {
		return err
	}
	var have int
	if _, err := fmt.Sscan(string(b), &have); err == nil && have >= want {
		return nil
	}
	if err := os.WriteFile(inotifyInstances, []byte(strconv.Itoa(want)), 0o644); err != nil {
		return fmt.Errorf("fs.inotify.max_user_instances is %d, below the %d that side-by-side process machines need; raise it with: sudo sysctl fs.inotify.max_user_instances=%d", have, want, want)
	}
	return nil
}
