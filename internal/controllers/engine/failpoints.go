package engine

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// The points where a crash test may stop qcp-manager, each between two
// writes that a crash must never leave half-done. They are armed by
// listing them, comma-separated, in the QCP_FAILPOINTS environment
// variable (as etcd's robustness tests arm gofail failpoints); the process
// then SIGKILLs itself on reaching one, with no chance to clean up.
const (
	FailpointAfterBootstrapData = "create.afterBootstrapData"
	FailpointAfterInfraMachine  = "create.afterInfraMachine"
	FailpointAfterMachine       = "create.afterMachine"
	FailpointBeforeMemberAdd    = "join.beforeMemberAdd"
	FailpointAfterMemberAdd     = "join.afterMemberAdd"
	FailpointAfterHook          = "hook.afterAdd"
	FailpointAfterPromote       = "promote.after"
	// FailpointRotationRecorded, followed by a stage's name, is reached
	// once a CA rotation's stage is recorded on the control plane,
	// before anything of it is done; FailpointAfterSignerSwitch once the
	// authority's Secret holds the new authority, before the next stage is
	// recorded.
	FailpointRotationRecorded  = "rotation.recorded."
	FailpointAfterSignerSwitch = "rotation.afterSignerSwitch"
)

// FailpointsEnv names the environment variable that arms failpoints.
const FailpointsEnv = "QCP_FAILPOINTS"

// Failpoints are the armed failpoints; the zero value arms none.
type Failpoints map[string]bool

// FailpointsFromEnv reads the armed failpoints from QCP_FAILPOINTS.
func FailpointsFromEnv() Failpoints {
	f := Failpoints{}
	for _, name := range strings.Split(os.Getenv(FailpointsEnv), ",") {
		if name = strings.TrimSpace(name); name != "" {
			f[name] = true
		}
	}
	return f
}

// Hit kills the process if failpoint name is armed.
func (f Failpoints) Hit(name string) {
	if !f[name] {
		return
	}
	fmt.Fprintf(os.Stderr, "failpoint %s reached: killing qcp-manager\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not delivered synchronously; never return.
}
