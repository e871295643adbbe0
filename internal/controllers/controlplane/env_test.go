package controlplane

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/localenv"
)

// TestAgainstRealParts runs the package's tests against a real management
// cluster (kube-apiserver and CAPI core), all on one: starting one costs
// more than most of what runs on it. Each test makes clusters of its own.
func TestAgainstRealParts(t *testing.T) {
	env := localenv.StartForTest(t, localenv.Options{})
	t.Run("remediation", func(t *testing.T) { testRemediationAgainstRealParts(t, env) })
	t.Run("adopting a machine whose etcd cannot be read", func(t *testing.T) { testAdoptedMachineWithUnreadableEtcdIsKept(t, env) })
	t.Run("the health check's name", func(t *testing.T) { testHealthCheckNames(t, env) })
	t.Run("old workers during a cluster CA rotation", func(t *testing.T) { testOldWorkers(t, env) })
}

// createPausedControlPlane creates Cluster name in namespace default,
// paused so that CAPI core leaves it and its Machines to the test, with its
// infrastructure provisioned and its endpoint on host, and the
// QuorumControlPlane name of replicas that it owns.
func createPausedControlPlane(ctx context.Context, t *testing.T, c client.Client, name, host string, replicas int32) {
	t.Helper()
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: clusterv1.ClusterSpec{Paused: ptr.To(true), ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: host, Port: 6443},
			ControlPlaneRef: clusterv1.ContractVersionedObjectReference{APIGroup: controlplanev1.GroupVersion.Group, Kind: "QuorumControlPlane", Name: name}}}
	if err := c.Create(ctx, cluster); err != nil {
		t.Fatalf("creating Cluster %s: %v", name, err)
	}
	// CAPI core writes the Cluster's status meanwhile.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); err != nil {
			return err
		}
		cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
		return c.Status().Update(ctx, cluster)
	}); err != nil {
		t.Fatalf("marking Cluster %s's infrastructure provisioned: %v", name, err)
	}
	cp := &controlplanev1.QuorumControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cluster, clusterv1.GroupVersion.WithKind("Cluster"))}},
		Spec: controlplanev1.QuorumControlPlaneSpec{Replicas: ptr.To(replicas), Version: "v1.36.3",
			MachineTemplate: controlplanev1.QuorumControlPlaneMachineTemplate{Spec: controlplanev1.QuorumControlPlaneMachineTemplateSpec{
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachineTemplate", Name: name}}}},
	}
	if err := c.Create(ctx, cp); err != nil {
		t.Fatalf("creating QuorumControlPlane %s: %v", name, err)
	}
}
