package webhooks

import (
	"fmt"
	"net"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
)

var specPath = field.NewPath("spec")

// Validate returns every rule qcp breaks, given the stored object old (nil on
// create). Each error names its field and says how to fix it.
func Validate(old, qcp *controlplanev1.QuorumControlPlane) field.ErrorList {
	if old != nil && equality.Semantic.DeepEqual(old.Spec, qcp.Spec) {
		// Metadata-only updates (owner references and labels from CAPI core,
		// finalizers) must go through even if a later release tightened a
		// rule that the stored spec breaks; otherwise deletion could hang.
		return nil
	}
	spec := &qcp.Spec
	stacked := spec.Etcd.IsStacked()
	errs := validateReplicas(specPath.Child("replicas"), replicasOf(spec), stacked)
	errs = append(errs, validateVersion(specPath.Child("version"), spec.Version, "v1.36.3")...)
	errs = append(errs, validateConfig(specPath, &spec.QuorumControlPlaneConfig)...)
	errs = append(errs, validateSurge(spec)...)
	errs = append(errs, validateRotation(old, qcp)...)
	errs = append(errs, validateBackupStacked(qcp)...)
	errs = append(errs, validateBackup(specPath.Child("backup"), spec.Backup)...)
	errs = append(errs, validateRestore(old, qcp)...)
	errs = append(errs, validateRecovery(qcp)...)
	if old != nil {
		errs = append(errs, validateVersionChange(old, qcp)...)
		errs = append(errs, validateEtcdChange(old.Spec.Etcd, spec.Etcd)...)
	}
	return errs
}

// replicasOf is the desired replica count; unset means the default, 1.
func replicasOf(spec *controlplanev1.QuorumControlPlaneSpec) int32 {
	if spec.Replicas == nil {
		return 1
	}
	return *spec.Replicas
}

// validateReplicas checks a replica count. The scale subresource shares it.
func validateReplicas(path *field.Path, replicas int32, stacked bool) field.ErrorList {
	switch {
	case replicas < 1:
		return field.ErrorList{field.Invalid(path, replicas,
			"a control plane needs at least 1 machine; use 1, 3 or 5")}
	case replicas > controlplanev1.MaxReplicas:
		return field.ErrorList{field.Invalid(path, replicas, fmt.Sprintf(
			"QCP runs at most %d control plane machines, because every etcd voter slows each write; use %d or fewer",
			controlplanev1.MaxReplicas, controlplanev1.MaxReplicas))}
	case stacked && replicas%2 == 0:
		return field.ErrorList{field.Invalid(path, replicas, fmt.Sprintf(
			"stacked etcd needs an odd number of replicas (1, 3, 5 or 7) to keep quorum; use %d or %d",
			replicas-1, replicas+1))}
	}
	return nil
}

// parseVersion accepts exactly what names a binary: "v", then a semantic
// version, with nothing around it.
func parseVersion(v string) (*utilversion.Version, error) {
	if !strings.HasPrefix(v, "v") || strings.ContainsFunc(v, unicode.IsSpace) {
		return nil, fmt.Errorf("version %q does not start with v", v)
	}
	return utilversion.ParseSemantic(v)
}

func validateVersion(path *field.Path, v, example string) field.ErrorList {
	if _, err := parseVersion(v); err != nil {
		return field.ErrorList{field.Invalid(path, v, fmt.Sprintf(
			"must be a version such as %s; write v, then MAJOR.MINOR.PATCH", example))}
	}
	return nil
}

// versionStep judges a change of spec.version from specFrom to specTo,
// where the machines' lowest running version is running (status.version,
// possibly empty). ok is false when either spec version is malformed: a
// malformed new version is reported already, a malformed old one is no
// baseline.
type versionStep struct {
	ok, downgrade, skips bool
	// base is the version the step is counted from, and baseName its
	// spelling: the old spec, or the machines still on an older version,
	// which a second upgrade before the first finished would make skip a
	// minor.
	base     *utilversion.Version
	baseName string
	// majorChange: the step changes the major version.
	majorChange bool
}

func judgeVersionStep(specFrom, running, specTo string) versionStep {
	from, errFrom := parseVersion(specFrom)
	to, errTo := parseVersion(specTo)
	if errFrom != nil || errTo != nil {
		return versionStep{}
	}
	st := versionStep{ok: true, downgrade: to.LessThan(from), base: from, baseName: specFrom}
	if r, err := parseVersion(running); err == nil && r.LessThan(from) {
		st.base, st.baseName = r, running
	}
	st.majorChange = to.Major() != st.base.Major()
	st.skips = st.majorChange || to.Minor() > st.base.Minor()+1
	return st
}

// validateVersionChange refuses downgrades and skipped minor versions, which
// neither the API server nor etcd's storage format supports.
func validateVersionChange(old, qcp *controlplanev1.QuorumControlPlane) field.ErrorList {
	path := specPath.Child("version")
	st := judgeVersionStep(old.Spec.Version, old.Status.Version, qcp.Spec.Version)
	switch {
	case !st.ok:
		return nil
	case st.downgrade:
		return field.ErrorList{field.Invalid(path, qcp.Spec.Version, fmt.Sprintf(
			"cannot downgrade from %s, because Kubernetes and etcd do not support downgrades; use %s or later",
			old.Spec.Version, old.Spec.Version))}
	case st.skips:
		what := "skips a minor version"
		if st.majorChange {
			what = "changes the major version"
		}
		return field.ErrorList{field.Invalid(path, qcp.Spec.Version, fmt.Sprintf(
			"%s: the control plane is at %s and upgrades go one minor version at a time; set a v%d.%d.x version first",
			what, st.baseName, st.base.Major(), st.base.Minor()+1))}
	}
	return nil
}

// etcdMode is how a control plane reaches etcd, with the way back to it.
type etcdMode struct{ name, restore string }

func modeOf(e controlplanev1.EtcdSpec) etcdMode {
	switch {
	case e.External != nil:
		return etcdMode{"external etcd endpoints", "set spec.etcd.external back"}
	case e.ClusterRef != nil:
		return etcdMode{"an EtcdCluster", fmt.Sprintf("set spec.etcd.clusterRef back to %q", e.ClusterRef.Name)}
	default:
		return etcdMode{"stacked etcd", "remove spec.etcd.external and spec.etcd.clusterRef"}
	}
}

// validateEtcdChange keeps the etcd a control plane was created with: the
// cluster's data lives there, and pointing the API servers elsewhere would
// silently swap it.
func validateEtcdChange(old, etcd controlplanev1.EtcdSpec) field.ErrorList {
	from, to := modeOf(old), modeOf(etcd)
	if from.name != to.name {
		return field.ErrorList{field.Forbidden(specPath.Child("etcd"), fmt.Sprintf(
			"cannot switch from %s to %s after creation, because the cluster's data lives in the etcd it started with; %s, or create a new QuorumControlPlane for the other etcd",
			from.name, to.name, from.restore))}
	}
	if old.ClusterRef != nil && etcd.ClusterRef != nil && old.ClusterRef.Name != etcd.ClusterRef.Name {
		return field.ErrorList{field.Forbidden(specPath.Child("etcd", "clusterRef", "name"), fmt.Sprintf(
			"cannot point at another EtcdCluster after creation, because the cluster's data lives in %q; %s",
			old.ClusterRef.Name, from.restore))}
	}
	return nil
}

func validateCertSANs(path *field.Path, sans []string) field.ErrorList {
	var errs field.ErrorList
	for i, san := range sans {
		if net.ParseIP(san) != nil || len(validation.IsDNS1123Subdomain(strings.TrimPrefix(san, "*."))) == 0 {
			continue
		}
		errs = append(errs, field.Invalid(path.Index(i), san,
			"must be a DNS name or an IP address, e.g. api.example.com or 10.0.0.1"))
	}
	return errs
}

// validateConfig checks what a QuorumControlPlane shares with its template,
// the config at path.
func validateConfig(path *field.Path, cfg *controlplanev1.QuorumControlPlaneConfig) field.ErrorList {
	var errs field.ErrorList
	if v := cfg.Etcd.Stacked.Version; v != "" {
		errs = append(errs, validateVersion(path.Child("etcd", "stacked", "version"), v, "v3.6.16")...)
	}
	errs = append(errs, validateCertSANs(path.Child("apiServer", "certSANs"), cfg.APIServer.CertSANs)...)
	errs = append(errs, validateExtraArgs(path, cfg)...)
	return append(errs, validateCertificatesExpiry(path, cfg)...)
}

// validateExtraArgs refuses flags qcp-agent owns on the machines (their
// addresses, certificates, data directories): a machine created with one
// would never start. It refuses etcd's backend quota too, which has a
// field of its own.
func validateExtraArgs(path *field.Path, spec *controlplanev1.QuorumControlPlaneConfig) field.ErrorList {
	var errs field.ErrorList
	for _, c := range []struct {
		path      *field.Path
		component bootstrap.Component
		args      []controlplanev1.Arg
	}{
		{path.Child("etcd", "stacked", "extraArgs"), bootstrap.Etcd, spec.Etcd.Stacked.ExtraArgs},
		{path.Child("apiServer", "extraArgs"), bootstrap.KubeAPIServer, spec.APIServer.ExtraArgs},
		{path.Child("controllerManager", "extraArgs"), bootstrap.KubeControllerManager, spec.ControllerManager.ExtraArgs},
		{path.Child("scheduler", "extraArgs"), bootstrap.KubeScheduler, spec.Scheduler.ExtraArgs},
	} {
		for i, a := range c.args {
			if c.component == bootstrap.Etcd {
				errs = append(errs, etcdArgErrors(c.path.Index(i), a, path.Child("etcd", "stacked", "quotaBackendBytes"))...)
				continue
			}
			errs = append(errs, argErrors(c.path.Index(i), c.component, a)...)
		}
	}
	return errs
}

// validateCertificatesExpiry: a machine due for replacement as soon as it
// exists would be replaced forever.
func validateCertificatesExpiry(path *field.Path, cfg *controlplanev1.QuorumControlPlaneConfig) field.ErrorList {
	expiry := cfg.Rollout.Before.CertificatesExpiryDays
	if expiry == nil {
		return nil
	}
	validity := ptr.Deref(cfg.CertificateValidityPeriodDays, controlplanev1.DefaultCertificateValidityPeriodDays)
	if *expiry < validity {
		return nil
	}
	return field.ErrorList{field.Invalid(path.Child("rollout", "before", "certificatesExpiryDays"), *expiry, fmt.Sprintf(
		"machines' certificates are valid for %d days (certificateValidityPeriodDays), so every new machine would be rolled out again at once; use fewer days than that, or raise certificateValidityPeriodDays",
		validity))}
}

// validateSurge: removing before replacing leaves 2 of 3 voters at worst;
// with fewer machines it would leave none.
func validateSurge(spec *controlplanev1.QuorumControlPlaneSpec) field.ErrorList {
	strategy := spec.Rollout.Strategy
	surge := strategy.RollingUpdate.MaxSurge
	if strategy.Type == controlplanev1.OnDelete || surge == nil || *surge != 0 || replicasOf(spec) >= 3 {
		return nil
	}
	return field.ErrorList{field.Invalid(specPath.Child("rollout", "strategy", "rollingUpdate", "maxSurge"), *surge,
		"maxSurge 0 removes a machine before its replacement exists, which needs at least 3 replicas; use maxSurge 1, or 3 or more replicas")}
}

// validateRotation refuses an etcd CA rotation of an etcd QCP does not run,
// another rotation on external etcd (not built yet: the planner's
// rule for machines without a member does not take the step), and any
// change of the rotation asked for while one is in progress: an
// interrupted rotation can always be finished, and a second one started
// over it would leave machines trusting three authorities.
func validateRotation(old, qcp *controlplanev1.QuorumControlPlane) field.ErrorList {
	path := specPath.Child("certificates", "rotation")
	rot := qcp.Spec.Certificates.Rotation
	var errs field.ErrorList
	switch {
	case rot == nil || qcp.Spec.Etcd.IsStacked():
	case rot.Kind == controlplanev1.CertificateAuthorityEtcdCA:
		errs = append(errs, field.Invalid(path.Child("kind"), rot.Kind,
			"EtcdCA rotates the CA of the etcd QCP runs on the control plane machines; this control plane's etcd is external, and its CA belongs to whoever runs it (an EtcdCluster, or the endpoints' owner): remove spec.certificates.rotation"))
	default:
		errs = append(errs, field.Invalid(path.Child("kind"), rot.Kind,
			fmt.Sprintf("QCP rotates the %s of a control plane with stacked etcd only, so far; on external etcd, remove spec.certificates.rotation", rot.Kind)))
	}
	if old == nil || equality.Semantic.DeepEqual(old.Spec.Certificates.Rotation, rot) {
		return errs
	}
	if st := old.Status.CertificateRotation; st != nil && st.Stage != controlplanev1.RotationCompleted {
		errs = append(errs, field.Forbidden(path, fmt.Sprintf(
			"a rotation of the %s (trigger %q) is at stage %s; wait until status.certificateRotation.stage is Completed, then change spec.certificates.rotation (an interrupted rotation always finishes)",
			st.Kind, st.Trigger, st.Stage)))
	}
	return errs
}
