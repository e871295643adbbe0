package etcdcluster

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
)

var t0 = time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC)

func etcdCluster(version string) *etcdv1.EtcdCluster {
	return &etcdv1.EtcdCluster{Spec: etcdv1.EtcdClusterSpec{Version: version,
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{Kind: "ProcessMachineTemplate", Name: "etcd"}}}
}

// machineFrom is a machine created at t0 from ec, as createMachine records it.
func machineFrom(t *testing.T, ec *etcdv1.EtcdCluster) *clusterv1.Machine {
	spec, err := json.Marshal(specOf(ec))
	if err != nil {
		t.Fatal(err)
	}
	return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", CreationTimestamp: metav1.NewTime(t0),
		Annotations: map[string]string{MachineSpecAnnotation: string(spec)}}}
}

// Each change of what a member runs makes its machine out of date, with a
// reason that names it; nothing else does.
func TestOutdated(t *testing.T) {
	old := etcdCluster("v3.5.35")
	m := machineFrom(t, old)
	if why := newRollout(old, t0.Add(time.Hour)).outdated(m); len(why) != 0 {
		t.Fatalf("a machine made from the spec is outdated: %v", why)
	}
	for _, tc := range []struct {
		name string
		edit func(*etcdv1.EtcdCluster)
		want string
	}{
		{"version", func(ec *etcdv1.EtcdCluster) { ec.Spec.Version = "v3.6.16" }, "etcd v3.5.35, want v3.6.16"},
		{"extra args", func(ec *etcdv1.EtcdCluster) {
			ec.Spec.ExtraArgs = []controlplanev1.Arg{{Name: "snapshot-count", Value: "1"}}
		}, "spec.extraArgs changed"},
		{"the quota, which restarts members in place", func(ec *etcdv1.EtcdCluster) { ec.Spec.QuotaBackendBytes = ptr.To[int64](64 << 20) }, ""},
		{"template", func(ec *etcdv1.EtcdCluster) { ec.Spec.InfrastructureRef.Name = "etcd-2" }, "infrastructure template ProcessMachineTemplate/etcd, want ProcessMachineTemplate/etcd-2"},
		{"rollout.after", func(ec *etcdv1.EtcdCluster) { ec.Spec.Rollout.After = metav1.NewTime(t0.Add(time.Minute)) }, "created before spec.rollout.after (2026-11-23T01:01:00Z)"},
		{"unhealthy member timeout", func(ec *etcdv1.EtcdCluster) { ec.Spec.UnhealthyMemberTimeoutSeconds = new(int32) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ec := etcdCluster("v3.5.35")
			tc.edit(ec)
			why := newRollout(ec, t0.Add(time.Hour)).outdated(m)
			if tc.want == "" && len(why) != 0 || tc.want != "" && !slices.Contains(why, tc.want) {
				t.Errorf("outdated: %v, want %q", why, tc.want)
			}
		})
	}
	// rollout.after in the future: not yet outdated, and the controller
	// looks again then.
	future := etcdCluster("v3.5.35")
	future.Spec.Rollout.After = metav1.NewTime(t0.Add(2 * time.Hour))
	ro := newRollout(future, t0.Add(time.Hour))
	if why := ro.outdated(m); len(why) != 0 {
		t.Errorf("outdated before rollout.after: %v", why)
	}
	if next := ro.next([]*clusterv1.Machine{m}); !next.Equal(t0.Add(2 * time.Hour)) {
		t.Errorf("next = %v, want rollout.after", next)
	}
	delete(m.Annotations, MachineSpecAnnotation)
	if why := newRollout(old, t0).outdated(m); len(why) != 1 {
		t.Errorf("a machine with no spec record: %v, want one reason", why)
	}
}
