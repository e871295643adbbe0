package etcdcluster

import (
	"slices"
	"testing"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// The planner sees the alarms of members since removed, and the quota etcd
// runs with: the spec's, or etcd's own default when the spec sets none.
func TestBuildCarriesDepartedAlarmsAndQuota(t *testing.T) {
	departed := []quorum.Alarm{{MemberID: 0xc3, Type: "CORRUPT"}}
	ec := etcdCluster("v3.6.16")
	obs := &observation{Observation: engine.Observation{Members: []quorum.Member{{ID: 0xa1, Name: "m", Healthy: true}}, DepartedAlarms: departed},
		rollout: newRollout(ec, t0)}
	obs.build(ec, &clusterv1.Cluster{}, t0, quorum.Tunables{})
	if !slices.Equal(obs.State.DepartedAlarms, departed) || obs.State.QuotaBackendBytes != engine.DefaultQuotaBackendBytes {
		t.Errorf("State: departed alarms %v, quota %d; want %v and etcd's default %d",
			obs.State.DepartedAlarms, obs.State.QuotaBackendBytes, departed, engine.DefaultQuotaBackendBytes)
	}
	quota := int64(4294967296)
	ec.Spec.QuotaBackendBytes = &quota
	obs.build(ec, &clusterv1.Cluster{}, t0, quorum.Tunables{})
	if obs.State.QuotaBackendBytes != 4294967296 {
		t.Errorf("quota %d, want the spec's 4294967296", obs.State.QuotaBackendBytes)
	}
}
