package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	capiyaml "sigs.k8s.io/cluster-api/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/release"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestGenerateExternalEtcd: the release's external-etcd flavor, rendered by
// the real clusterctl (`clusterctl generate cluster … --flavor
// external-etcd --kubernetes-version v1.36.3
// --control-plane-machine-count 3 --config out/clusterctl.yaml`) and
// applied as it is, reaches Available with 3 etcd machines and 3 control
// plane machines, with a writer on the EtcdCluster and the invariant
// monitor running. (clusterctl is told the infrastructure provider and its
// version, which it would read from the provider inventory of a management
// cluster made by clusterctl init.)
func TestGenerateExternalEtcd(t *testing.T) {
	mgmt := requireShared(t)
	testkit.RequireBinaries(t, "clusterctl")
	parallel(t, 3*time.Minute)
	const name = "generated"
	config, err := release.Write("../..", t.TempDir(), "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	rendered := testkit.Clusterctl(t, nil, "generate", "cluster", name, "--infrastructure", "process:v0.1.0", "--flavor", "external-etcd",
		"--kubernetes-version", version, "--control-plane-machine-count", "3", "--target-namespace", ns, "--config", config)
	objs, err := capiyaml.ToUnstructured(rendered)
	if err != nil {
		t.Fatal(err)
	}

	etcdName, cpName := name+"-etcd", name+"-control-plane"
	s := &scenario{t: t, mgmt: mgmt, c: mgmt.fenced(mgmt.env.Client), name: name,
		selector: client.MatchingLabels{clusterv1.ClusterNameLabel: name, etcdv1.EtcdClusterNameLabel: etcdName}}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	for i := range objs {
		s.create(ctx, &objs[i])
	}
	s.bound = startMachineBound(s, 3, 1)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.c.Delete(ctx, &etcdv1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: etcdName, Namespace: ns}}); err != nil && !isNotFound(err) {
			t.Errorf("releasing EtcdCluster %s: %v", etcdName, err)
		}
	})
	t.Cleanup(s.release)
	t.Cleanup(s.dumpOnFailure)
	s.startTraffic(3)

	ec := &etcdv1.EtcdCluster{}
	s.eventually(convergeTimeout, "EtcdCluster "+etcdName+" ready with 3 healthy voters", func(ctx context.Context) error {
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: etcdName}, ec); err != nil {
			return err
		}
		return etcdReadyWith(ec, 3)
	})
	s.checkOwnedByCluster(ctx, ec)
	s.eventually(convergeTimeout, "control plane "+cpName+" Available with 3 machines on the EtcdCluster", func(ctx context.Context) error {
		cp := &controlplanev1.QuorumControlPlane{}
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: cpName}, cp); err != nil {
			return err
		}
		return externalAvailable(cp, 3)
	})
	s.finish()
}
