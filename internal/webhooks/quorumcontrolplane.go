// Package webhooks holds QCP's admission webhooks: defaulting and validation
// of QuorumControlPlanes, and validation of their scale subresource. The rules
// are pure functions of the old and new objects, so that they can be fuzzed
// without an API server; the webhook types only adapt them to
// controller-runtime.
package webhooks

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
)

// The paths follow controller-runtime's generated names, so that the
// markers below and the builder agree.
// +kubebuilder:webhook:path=/mutate-controlplane-cluster-x-k8s-io-v1alpha1-quorumcontrolplane,mutating=true,failurePolicy=fail,sideEffects=None,groups=controlplane.cluster.x-k8s.io,resources=quorumcontrolplanes,verbs=create;update,versions=v1alpha1,name=default.quorumcontrolplane.controlplane.cluster.x-k8s.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-controlplane-cluster-x-k8s-io-v1alpha1-quorumcontrolplane,mutating=false,failurePolicy=fail,sideEffects=None,groups=controlplane.cluster.x-k8s.io,resources=quorumcontrolplanes,verbs=create;update,versions=v1alpha1,name=validation.quorumcontrolplane.controlplane.cluster.x-k8s.io,admissionReviewVersions=v1

// Setup registers QCP's webhooks with mgr's webhook server.
func Setup(mgr ctrl.Manager) error {
	if err := ctrl.NewWebhookManagedBy(mgr, &controlplanev1.QuorumControlPlane{}).
		WithDefaulter(QuorumControlPlane{}).
		WithValidator(QuorumControlPlane{}).
		Complete(); err != nil {
		return fmt.Errorf("setting up the QuorumControlPlane webhooks: %w", err)
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &controlplanev1.QuorumControlPlaneTemplate{}).
		WithValidator(QuorumControlPlaneTemplate{}).
		Complete(); err != nil {
		return fmt.Errorf("setting up the QuorumControlPlaneTemplate webhook: %w", err)
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &etcdv1.EtcdCluster{}).
		WithDefaulter(EtcdCluster{}).
		WithValidator(EtcdCluster{}).
		Complete(); err != nil {
		return fmt.Errorf("setting up the EtcdCluster webhooks: %w", err)
	}
	server := mgr.GetWebhookServer()
	server.Register(scaleValidationPath, admission.WithValidator(mgr.GetScheme(), ScaleValidatorForControlPlane(mgr.GetAPIReader())))
	server.Register(etcdScaleValidationPath, admission.WithValidator(mgr.GetScheme(), ScaleValidatorForEtcdCluster(mgr.GetAPIReader())))
	return nil
}

var controlPlaneKind = controlplanev1.GroupVersion.WithKind("QuorumControlPlane").GroupKind()

// QuorumControlPlane defaults and validates QuorumControlPlanes.
type QuorumControlPlane struct{}

var (
	_ admission.Defaulter[*controlplanev1.QuorumControlPlane] = QuorumControlPlane{}
	_ admission.Validator[*controlplanev1.QuorumControlPlane] = QuorumControlPlane{}
)

// Default fills in what the user left out.
func (QuorumControlPlane) Default(_ context.Context, qcp *controlplanev1.QuorumControlPlane) error {
	Default(qcp)
	return nil
}

// ValidateCreate rejects an invalid new QuorumControlPlane.
func (QuorumControlPlane) ValidateCreate(_ context.Context, qcp *controlplanev1.QuorumControlPlane) (admission.Warnings, error) {
	return nil, invalid(controlPlaneKind, qcp.Name, Validate(nil, qcp))
}

// ValidateUpdate rejects an invalid change. The API server applies nothing of
// a rejected request, so an invalid update never half-applies.
func (QuorumControlPlane) ValidateUpdate(_ context.Context, old, qcp *controlplanev1.QuorumControlPlane) (admission.Warnings, error) {
	return nil, invalid(controlPlaneKind, qcp.Name, Validate(old, qcp))
}

// ValidateDelete allows every deletion; the controller's finalizer orders it.
func (QuorumControlPlane) ValidateDelete(context.Context, *controlplanev1.QuorumControlPlane) (admission.Warnings, error) {
	return nil, nil
}

// invalid turns field errors on the object name, of kind gk, into the
// Invalid status the API server shows with its field paths, or nil.
func invalid(gk schema.GroupKind, name string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(gk, name, errs)
}
