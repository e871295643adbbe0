package controlplane

import (
	"testing"

	"github.com/qcp-dev/qcp/internal/localenv"
)

// TestAgainstRealParts runs the package's tests against a real management
// cluster (kube-apiserver and CAPI core), all on one: starting one costs
// more than most of what runs on it. Each test makes clusters of its own.
func TestAgainstRealParts(t *testing.T) {
	env := localenv.StartForTest(t, localenv.Options{})
	t.Run("remediation", func(t *testing.T) { testRemediationAgainstRealParts(t, env) })
	t.Run("adopting a machine whose etcd cannot be read", func(t *testing.T) { testAdoptedMachineWithUnreadableEtcdIsKept(t, env) })
}
