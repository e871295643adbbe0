package webhooks

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// +kubebuilder:webhook:path=/mutate-etcd-cluster-x-k8s-io-v1alpha1-etcdcluster,mutating=true,failurePolicy=fail,sideEffects=None,groups=etcd.cluster.x-k8s.io,resources=etcdclusters,verbs=create;update,versions=v1alpha1,name=default.etcdcluster.etcd.cluster.x-k8s.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-etcd-cluster-x-k8s-io-v1alpha1-etcdcluster,mutating=false,failurePolicy=fail,sideEffects=None,groups=etcd.cluster.x-k8s.io,resources=etcdclusters,verbs=create;update,versions=v1alpha1,name=validation.etcdcluster.etcd.cluster.x-k8s.io,admissionReviewVersions=v1

var etcdClusterKind = etcdv1.GroupVersion.WithKind("EtcdCluster").GroupKind()

// EtcdCluster defaults and validates EtcdClusters.
type EtcdCluster struct{}

var (
	_ admission.Defaulter[*etcdv1.EtcdCluster] = EtcdCluster{}
	_ admission.Validator[*etcdv1.EtcdCluster] = EtcdCluster{}
)

// DefaultEtcdCluster fills in what the user left out. It is idempotent, and
// it never changes a value the user set, except to add the "v" in front of
// a version.
func DefaultEtcdCluster(ec *etcdv1.EtcdCluster) {
	if ec.Spec.Replicas == nil {
		ec.Spec.Replicas = ptr.To[int32](3)
	}
	ec.Spec.Version = withV(ec.Spec.Version)
	if ec.Spec.UnhealthyMemberTimeoutSeconds == nil {
		ec.Spec.UnhealthyMemberTimeoutSeconds = ptr.To[int32](etcdv1.DefaultUnhealthyMemberTimeoutSeconds)
	}
}

// ValidateEtcdCluster returns every rule ec breaks, given the stored object
// old (nil on create). Each error names its field and says how to fix it.
func ValidateEtcdCluster(old, ec *etcdv1.EtcdCluster) field.ErrorList {
	if old != nil && equality.Semantic.DeepEqual(old.Spec, ec.Spec) {
		return nil // metadata-only updates must never hang a deletion
	}
	spec := &ec.Spec
	errs := validateMembers(specPath.Child("replicas"), ptr.Deref(spec.Replicas, 3))
	errs = append(errs, validateEtcdVersion(specPath.Child("version"), spec.Version)...)
	for i, a := range spec.ExtraArgs {
		errs = append(errs, etcdArgErrors(specPath.Child("extraArgs").Index(i), a, specPath.Child("quotaBackendBytes"))...)
	}
	errs = append(errs, validateBackup(specPath.Child("backup"), spec.Backup)...)
	if r := spec.QuorumLossRecovery; r != nil && r.Policy == controlplanev1.RecoveryFromBackup {
		errs = append(errs, field.Invalid(specPath.Child("quorumLossRecovery", "policy"), r.Policy,
			"an EtcdCluster does not recover from a backup yet: choose FromSurvivor, or restore a new EtcdCluster with spec.restore.from"))
	}
	if old != nil {
		errs = append(errs, validateRestoreSpec(true, old.Spec.Restore, spec.Restore, spec.Backup, "EtcdCluster")...)
		errs = append(errs, validateEtcdVersionChange(old, ec)...)
	} else {
		errs = append(errs, validateRestoreSpec(false, nil, spec.Restore, spec.Backup, "EtcdCluster")...)
	}
	return errs
}

// validateMembers checks an EtcdCluster's member count. The scale
// subresource shares it.
func validateMembers(path *field.Path, replicas int32) field.ErrorList {
	switch {
	case replicas < 1 || replicas > etcdv1.MaxReplicas:
		return field.ErrorList{field.Invalid(path, replicas, fmt.Sprintf(
			"an EtcdCluster has 1 to %d members; use 1, 3, 5 or 7", etcdv1.MaxReplicas))}
	case replicas%2 == 0:
		return field.ErrorList{field.Invalid(path, replicas, fmt.Sprintf(
			"etcd needs an odd number of members (1, 3, 5 or 7): an even number tolerates no more failures than one member fewer; use %d or %d",
			replicas-1, replicas+1))}
	}
	return nil
}

// validateEtcdVersion accepts v3.5.0 and later: learners and the member
// promotion QCP relies on are stable from v3.5.
func validateEtcdVersion(path *field.Path, v string) field.ErrorList {
	parsed, err := parseVersion(v)
	if err != nil {
		return validateVersion(path, v, "v3.6.16")
	}
	if parsed.Major() != 3 || parsed.Minor() < 5 {
		return field.ErrorList{field.Invalid(path, v,
			"QCP runs etcd v3.5.0 or later (it adds members as learners); use a v3.5.x or v3.6.x version such as v3.6.16")}
	}
	return nil
}

// validateEtcdVersionChange refuses downgrades and skipped minor versions,
// which etcd's storage format does not support.
func validateEtcdVersionChange(old, ec *etcdv1.EtcdCluster) field.ErrorList {
	path := specPath.Child("version")
	st := judgeVersionStep(old.Spec.Version, old.Status.Version, ec.Spec.Version)
	switch {
	case !st.ok:
		return nil
	case st.downgrade:
		return field.ErrorList{field.Invalid(path, ec.Spec.Version, fmt.Sprintf(
			"cannot downgrade from %s: etcd members do not move back to an older storage version; use %s or later",
			old.Spec.Version, old.Spec.Version))}
	case st.skips:
		return field.ErrorList{field.Invalid(path, ec.Spec.Version, fmt.Sprintf(
			"the members run %s and etcd upgrades go one minor version at a time; set a v%d.%d.x version first",
			st.baseName, st.base.Major(), st.base.Minor()+1))}
	}
	return nil
}

// argErrors checks one extra flag of component: qcp-agent owns a member's
// addresses, certificates and data directory.
func argErrors(path *field.Path, component bootstrap.Component, a controlplanev1.Arg) field.ErrorList {
	var errs field.ErrorList
	for _, e := range bootstrap.CheckArg(component, bootstrap.Arg{Name: a.Name, Value: a.Value}) {
		value := a.Name
		if e.Field == "value" {
			value = a.Value
		}
		errs = append(errs, field.Invalid(path.Child(e.Field), value, e.Problem+"; "+e.Fix))
	}
	return errs
}

// quotaFlag is etcd's backend quota flag, which has a field of its own.
const quotaFlag = "quota-backend-bytes"

// etcdArgErrors checks one extra etcd flag. The backend quota is refused
// in favour of quotaField: a change of the field restarts each member in
// place, where a change of extraArgs replaces every machine, and two
// places to set it would disagree.
func etcdArgErrors(path *field.Path, a controlplanev1.Arg, quotaField *field.Path) field.ErrorList {
	errs := argErrors(path, bootstrap.Etcd, a)
	if a.Name != quotaFlag { // the schema allows no other spelling
		return errs
	}
	name := path.Child("name")
	// This message says more than any other about the same name would.
	errs = slices.DeleteFunc(errs, func(e *field.Error) bool { return e.Field == name.String() })
	return append(field.ErrorList{field.Invalid(name, a.Name, fmt.Sprintf(
		"flag --%s of etcd has its own field, whose change restarts each member in place instead of replacing every machine; remove it and set %s instead",
		a.Name, quotaField))}, errs...)
}

// Default fills in what the user left out.
func (EtcdCluster) Default(_ context.Context, ec *etcdv1.EtcdCluster) error {
	DefaultEtcdCluster(ec)
	return nil
}

// ValidateCreate rejects an invalid new EtcdCluster.
func (EtcdCluster) ValidateCreate(_ context.Context, ec *etcdv1.EtcdCluster) (admission.Warnings, error) {
	return nil, invalid(etcdClusterKind, ec.Name, ValidateEtcdCluster(nil, ec))
}

// ValidateUpdate rejects an invalid change; the API server then applies
// nothing of it.
func (EtcdCluster) ValidateUpdate(_ context.Context, old, ec *etcdv1.EtcdCluster) (admission.Warnings, error) {
	return nil, invalid(etcdClusterKind, ec.Name, ValidateEtcdCluster(old, ec))
}

// ValidateDelete allows every deletion; the controller's finalizer orders it.
func (EtcdCluster) ValidateDelete(context.Context, *etcdv1.EtcdCluster) (admission.Warnings, error) {
	return nil, nil
}
