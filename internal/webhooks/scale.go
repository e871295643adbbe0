package webhooks

import (
	"context"
	"fmt"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
)

// `kubectl scale` writes the scale subresource, which the main webhooks never
// see; without these it would bypass the odd-replica rules.
// +kubebuilder:webhook:path=/validate-scale-controlplane-cluster-x-k8s-io-v1alpha1-quorumcontrolplane,mutating=false,failurePolicy=fail,sideEffects=None,groups=controlplane.cluster.x-k8s.io,resources=quorumcontrolplanes/scale,verbs=update,versions=v1alpha1,name=validation-scale.quorumcontrolplane.controlplane.cluster.x-k8s.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-scale-etcd-cluster-x-k8s-io-v1alpha1-etcdcluster,mutating=false,failurePolicy=fail,sideEffects=None,groups=etcd.cluster.x-k8s.io,resources=etcdclusters/scale,verbs=update,versions=v1alpha1,name=validation-scale.etcdcluster.etcd.cluster.x-k8s.io,admissionReviewVersions=v1
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=quorumcontrolplanes,verbs=get
// +kubebuilder:rbac:groups=etcd.cluster.x-k8s.io,resources=etcdclusters,verbs=get

const (
	scaleValidationPath     = "/validate-scale-controlplane-cluster-x-k8s-io-v1alpha1-quorumcontrolplane"
	etcdScaleValidationPath = "/validate-scale-etcd-cluster-x-k8s-io-v1alpha1-etcdcluster"
)

// ScaleValidator validates replica changes made through the scale
// subresource of T, with the same rules as an edit of spec.replicas, so
// that the two ways of scaling cannot disagree.
type ScaleValidator[T client.Object] struct {
	// Reader reads the object live: the Scale object does not carry what
	// the rules depend on (whether etcd is stacked, say).
	Reader client.Reader
	// New returns an empty T to read into.
	New func() T
	// Scaled checks stored with its replicas set to replicas.
	Scaled func(stored T, replicas int32) error
}

// ScaleValidatorForControlPlane validates `kubectl scale` of a
// QuorumControlPlane.
func ScaleValidatorForControlPlane(r client.Reader) *ScaleValidator[*controlplanev1.QuorumControlPlane] {
	return &ScaleValidator[*controlplanev1.QuorumControlPlane]{Reader: r,
		New: func() *controlplanev1.QuorumControlPlane { return &controlplanev1.QuorumControlPlane{} },
		Scaled: func(qcp *controlplanev1.QuorumControlPlane, replicas int32) error {
			scaled := qcp.DeepCopy()
			scaled.Spec.Replicas = &replicas
			return invalid(controlPlaneKind, qcp.Name, Validate(qcp, scaled))
		}}
}

// ScaleValidatorForEtcdCluster validates `kubectl scale` of an EtcdCluster.
func ScaleValidatorForEtcdCluster(r client.Reader) *ScaleValidator[*etcdv1.EtcdCluster] {
	return &ScaleValidator[*etcdv1.EtcdCluster]{Reader: r,
		New: func() *etcdv1.EtcdCluster { return &etcdv1.EtcdCluster{} },
		Scaled: func(ec *etcdv1.EtcdCluster, replicas int32) error {
			scaled := ec.DeepCopy()
			scaled.Spec.Replicas = &replicas
			return invalid(etcdClusterKind, ec.Name, ValidateEtcdCluster(ec, scaled))
		}}
}

// ValidateCreate is never called: the scale subresource only updates.
func (v *ScaleValidator[T]) ValidateCreate(ctx context.Context, scale *autoscalingv1.Scale) (admission.Warnings, error) {
	return v.validate(ctx, scale)
}

// ValidateUpdate applies T's replica rules.
func (v *ScaleValidator[T]) ValidateUpdate(ctx context.Context, _, scale *autoscalingv1.Scale) (admission.Warnings, error) {
	return v.validate(ctx, scale)
}

// ValidateDelete is never called: a scale cannot be deleted.
func (v *ScaleValidator[T]) ValidateDelete(context.Context, *autoscalingv1.Scale) (admission.Warnings, error) {
	return nil, nil
}

func (v *ScaleValidator[T]) validate(ctx context.Context, scale *autoscalingv1.Scale) (admission.Warnings, error) {
	obj := v.New()
	if err := v.Reader.Get(ctx, client.ObjectKeyFromObject(scale), obj); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf(
			"reading %s/%s to check its new replica count: %w", scale.Namespace, scale.Name, err))
	}
	return nil, v.Scaled(obj, scale.Spec.Replicas)
}
