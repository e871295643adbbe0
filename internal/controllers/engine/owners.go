package engine

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// OwnTemplate makes cluster an owner of the infrastructure template ref
// names (in cluster's namespace), as KCP does with its machine template:
// clusterctl move finds what to move through owner references, and would
// leave an unowned template behind, and with it the only description of
// the machines a control plane creates next. A template not there yet is
// left for the step that clones it to report.
func OwnTemplate(ctx context.Context, c client.Client, live client.Reader, cluster *clusterv1.Cluster, ref clusterv1.ContractVersionedObjectReference) error {
	tmpl, err := GetTemplate(ctx, c, live, ref, cluster.Namespace)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading infrastructure template %s %s: %w", ref.Kind, ref.Name, err)
	}
	owner := metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID}
	if util.HasExactOwnerRef(tmpl.GetOwnerReferences(), owner) {
		return nil
	}
	before := tmpl.DeepCopy()
	tmpl.SetOwnerReferences(util.EnsureOwnerRef(tmpl.GetOwnerReferences(), owner))
	if err := c.Patch(ctx, tmpl, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("making Cluster %s an owner of infrastructure template %s %s: %w", cluster.Name, ref.Kind, ref.Name, err)
	}
	return nil
}

// GetTemplate reads the infrastructure template ref names (in namespace)
// from cached, and from live only if cached does not have it. qcp-manager's
// client caches unstructured objects, as CAPI's controllers' do: every round
// of every control plane reads its template (to own it, and to judge its
// machines up to date), and read live those were two GETs a round on the
// management API server, each decoding the object from etcd. A template is
// immutable by CAPI's convention; one just created (a ClusterClass's
// rotation) may not have reached the cache yet, and is read live then.
func GetTemplate(ctx context.Context, cached, live client.Reader, ref clusterv1.ContractVersionedObjectReference, namespace string) (*unstructured.Unstructured, error) {
	tmpl, err := external.GetObjectFromContractVersionedRef(ctx, cached, ref, namespace)
	if apierrors.IsNotFound(err) && live != nil {
		return external.GetObjectFromContractVersionedRef(ctx, live, ref, namespace)
	}
	return tmpl, err
}
