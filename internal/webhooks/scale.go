package webhooks

import (
	"context"
	"fmt"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// `kubectl scale` writes the scale subresource, which the main webhook never
// sees; without this one it would bypass the odd-replica rule.
// +kubebuilder:webhook:path=/validate-scale-controlplane-cluster-x-k8s-io-v1alpha1-quorumcontrolplane,mutating=false,failurePolicy=fail,sideEffects=None,groups=controlplane.cluster.x-k8s.io,resources=quorumcontrolplanes/scale,verbs=update,versions=v1alpha1,name=validation-scale.quorumcontrolplane.controlplane.cluster.x-k8s.io,admissionReviewVersions=v1
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=quorumcontrolplanes,verbs=get

const scaleValidationPath = "/validate-scale-controlplane-cluster-x-k8s-io-v1alpha1-quorumcontrolplane"

// ScaleValidator validates replica changes made through the scale
// subresource.
type ScaleValidator struct {
	// Reader reads the QuorumControlPlane live: the Scale object does not say
	// whether etcd is stacked.
	Reader client.Reader
}

var _ admission.Validator[*autoscalingv1.Scale] = &ScaleValidator{}

// ValidateCreate is never called: the scale subresource only updates.
func (v *ScaleValidator) ValidateCreate(ctx context.Context, scale *autoscalingv1.Scale) (admission.Warnings, error) {
	return v.validate(ctx, scale)
}

// ValidateUpdate applies the replica rules of the QuorumControlPlane.
func (v *ScaleValidator) ValidateUpdate(ctx context.Context, _, scale *autoscalingv1.Scale) (admission.Warnings, error) {
	return v.validate(ctx, scale)
}

// ValidateDelete is never called: a scale cannot be deleted.
func (v *ScaleValidator) ValidateDelete(context.Context, *autoscalingv1.Scale) (admission.Warnings, error) {
	return nil, nil
}

func (v *ScaleValidator) validate(ctx context.Context, scale *autoscalingv1.Scale) (admission.Warnings, error) {
	qcp := &controlplanev1.QuorumControlPlane{}
	if err := v.Reader.Get(ctx, client.ObjectKeyFromObject(scale), qcp); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf(
			"reading QuorumControlPlane %s/%s to check its new replica count: %w", scale.Namespace, scale.Name, err))
	}
	// The same rules as an edit of spec.replicas, so that the two ways of
	// scaling cannot disagree.
	scaled := qcp.DeepCopy()
	scaled.Spec.Replicas = &scale.Spec.Replicas
	return nil, invalid(qcp, Validate(qcp, scaled))
}
