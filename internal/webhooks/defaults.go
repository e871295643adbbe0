package webhooks

import (
	"k8s.io/utils/ptr"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// Default fills in what the user left out. It is idempotent, and it never
// changes a value the user set, except to add the "v" the CAPI contract
// requires in front of a version.
func Default(qcp *controlplanev1.QuorumControlPlane) {
	spec := &qcp.Spec
	if spec.Replicas == nil {
		spec.Replicas = ptr.To[int32](1)
	}
	spec.Version = withV(spec.Version)
	if spec.Etcd.Stacked.Version != "" {
		spec.Etcd.Stacked.Version = withV(spec.Etcd.Stacked.Version)
	}
	strategy := &spec.Rollout.Strategy
	if strategy.Type == "" {
		strategy.Type = controlplanev1.RollingUpdate
	}
	if strategy.Type == controlplanev1.RollingUpdate && strategy.RollingUpdate.MaxSurge == nil {
		// Surge first: the replacement joins as a learner before anything is
		// removed, so fault tolerance never drops during a rollout.
		strategy.RollingUpdate.MaxSurge = ptr.To[int32](1)
	}
	if spec.Remediation.Autorepair == nil {
		spec.Remediation.Autorepair = ptr.To(true)
	}
}

// withV adds the leading "v" of a version written without one ("1.36.3").
// Anything else is left for validation to reject as written.
func withV(version string) string {
	if version == "" || version[0] < '0' || version[0] > '9' {
		return version
	}
	return "v" + version
}
