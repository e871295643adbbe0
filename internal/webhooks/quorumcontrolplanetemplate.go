package webhooks

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// +kubebuilder:webhook:path=/validate-controlplane-cluster-x-k8s-io-v1alpha1-quorumcontrolplanetemplate,mutating=false,failurePolicy=fail,sideEffects=None,groups=controlplane.cluster.x-k8s.io,resources=quorumcontrolplanetemplates,verbs=create;update,versions=v1alpha1,name=validation.quorumcontrolplanetemplate.controlplane.cluster.x-k8s.io,admissionReviewVersions=v1

// QuorumControlPlaneTemplate validates QuorumControlPlaneTemplates. It
// defaults nothing: the QuorumControlPlane webhook defaults each control
// plane made from a template, so a template and the objects made from it
// never disagree about a default.
type QuorumControlPlaneTemplate struct{}

var _ admission.Validator[*controlplanev1.QuorumControlPlaneTemplate] = QuorumControlPlaneTemplate{}

var (
	templateSpecPath = field.NewPath("spec", "template", "spec")
	templateKind     = controlplanev1.GroupVersion.WithKind("QuorumControlPlaneTemplate").GroupKind()
)

// ValidateTemplate returns every rule tmpl breaks, given the stored
// template old (nil on create), with the QuorumControlPlane's messages for
// the fields they share.
func ValidateTemplate(old, tmpl *controlplanev1.QuorumControlPlaneTemplate) field.ErrorList {
	if old != nil {
		if equality.Semantic.DeepEqual(old.Spec, tmpl.Spec) {
			return nil
		}
		return field.ErrorList{field.Forbidden(field.NewPath("spec"),
			"a QuorumControlPlaneTemplate's spec cannot change, because the control planes made from it would not follow; create a new template and point the ClusterClass's spec.controlPlane.templateRef at it")}
	}
	spec := &tmpl.Spec.Template.Spec
	var errs field.ErrorList
	if spec.Replicas != nil {
		errs = append(errs, field.Forbidden(templateSpecPath.Child("replicas"),
			"the replica count comes from the Cluster's spec.topology.controlPlane.replicas; remove it from the template"))
	}
	if spec.Version != "" {
		errs = append(errs, field.Forbidden(templateSpecPath.Child("version"),
			"the Kubernetes version comes from the Cluster's spec.topology.version; remove it from the template"))
	}
	if spec.MachineTemplate.Spec.InfrastructureRef != nil {
		errs = append(errs, field.Forbidden(templateSpecPath.Child("machineTemplate", "spec", "infrastructureRef"),
			"the machines' infrastructure template comes from the ClusterClass's spec.controlPlane.machineInfrastructure.templateRef, which CAPI clones for each Cluster; remove it from the template"))
	}
	// A maxSurge of 0 needs 3 replicas, which only the Cluster knows: the
	// QuorumControlPlane webhook judges it once the topology sets them.
	return append(errs, validateConfig(templateSpecPath, &spec.QuorumControlPlaneConfig)...)
}

// ValidateCreate rejects an invalid new template.
func (QuorumControlPlaneTemplate) ValidateCreate(_ context.Context, tmpl *controlplanev1.QuorumControlPlaneTemplate) (admission.Warnings, error) {
	return nil, invalid(templateKind, tmpl.Name, ValidateTemplate(nil, tmpl))
}

// ValidateUpdate allows metadata changes only.
func (QuorumControlPlaneTemplate) ValidateUpdate(_ context.Context, old, tmpl *controlplanev1.QuorumControlPlaneTemplate) (admission.Warnings, error) {
	return nil, invalid(templateKind, tmpl.Name, ValidateTemplate(old, tmpl))
}

// ValidateDelete allows every deletion; CAPI keeps a template a
// ClusterClass uses.
func (QuorumControlPlaneTemplate) ValidateDelete(context.Context, *controlplanev1.QuorumControlPlaneTemplate) (admission.Warnings, error) {
	return nil, nil
}
