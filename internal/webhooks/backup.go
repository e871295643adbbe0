package webhooks

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/backup/s3store"
)

// validateBackup checks spec.backup beyond what the CRD's schema can: the
// schedule parses, the target is a store URL, the Secrets' names are
// names.
func validateBackup(path *field.Path, b *controlplanev1.BackupSpec) field.ErrorList {
	if b == nil {
		return nil
	}
	var errs field.ErrorList
	if _, err := backup.ParseSchedule(b.Schedule.IntervalSeconds, b.Schedule.Cron); err != nil {
		errs = append(errs, field.Invalid(path.Child("schedule"), b.Schedule, err.Error()))
	}
	// Open checks the endpoint's form and sends nothing; the placeholder
	// credentials only get it past its own checks of them.
	if _, err := s3store.Open(s3store.Target{Endpoint: b.Target.Endpoint, Bucket: b.Target.Bucket, AccessKeyID: "-", SecretAccessKey: "-"}); err != nil {
		errs = append(errs, field.Invalid(path.Child("target", "endpoint"), b.Target.Endpoint, err.Error()))
	}
	errs = append(errs, secretName(path.Child("target", "credentialsSecret"), b.Target.CredentialsSecret)...)
	if b.Encryption != nil {
		errs = append(errs, secretName(path.Child("encryption", "keySecret"), b.Encryption.KeySecret)...)
	}
	return errs
}

func secretName(path *field.Path, name string) field.ErrorList {
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(path, name, "not a Secret name: "+msgs[0]+"; name a Secret in this object's namespace")}
	}
	return nil
}

// validateBackupStacked refuses spec.backup on a control plane whose etcd
// is external.
func validateBackupStacked(qcp *controlplanev1.QuorumControlPlane) field.ErrorList {
	if qcp.Spec.Backup == nil || qcp.Spec.Etcd.IsStacked() {
		return nil
	}
	return field.ErrorList{field.Forbidden(specPath.Child("backup"),
		"this control plane's etcd is external, and its data belongs to whoever runs it: set spec.backup on its EtcdCluster, or back up the endpoints where they run; remove spec.backup here")}
}

// validateRestore checks spec.restore of a control plane: only with
// stacked etcd, and as validateRestoreSpec says.
func validateRestore(old, qcp *controlplanev1.QuorumControlPlane) field.ErrorList {
	var was *controlplanev1.RestoreSpec
	if old != nil {
		was = old.Spec.Restore
	}
	if qcp.Spec.Restore != nil && old == nil && !qcp.Spec.Etcd.IsStacked() {
		return field.ErrorList{field.Forbidden(specPath.Child("restore"),
			"this control plane's etcd is external: restore its EtcdCluster (spec.restore there), or the endpoints where they run; remove spec.restore here")}
	}
	return validateRestoreSpec(old != nil, was, qcp.Spec.Restore, qcp.Spec.Backup, "QuorumControlPlane")
}

// validateRestoreSpec checks an owner's spec.restore r (was: the stored
// one, on an update): a store to read from (its own or spec.backup's),
// and no change once the owner exists. A restore is what etcd starts
// from; added later it would mean nothing, and removed it would hide what
// the cluster was built from.
func validateRestoreSpec(update bool, was, r *controlplanev1.RestoreSpec, b *controlplanev1.BackupSpec, kind string) field.ErrorList {
	path := specPath.Child("restore")
	if update {
		if !equality.Semantic.DeepEqual(was, r) {
			return field.ErrorList{field.Forbidden(path,
				"spec.restore is fixed when the "+kind+" is created: to build a cluster from a snapshot, create a new "+kind+" with spec.restore.from")}
		}
		return nil
	}
	if r == nil {
		return nil
	}
	return validateRestoreSource(path.Child("from"), r.From, b)
}

// validateRestoreSource checks a restore's source against the owner's
// spec.backup, whose target and key it falls back to.
func validateRestoreSource(path *field.Path, from controlplanev1.RestoreSource, b *controlplanev1.BackupSpec) field.ErrorList {
	var errs field.ErrorList
	if (from.Cluster == "") == (from.Object == "") {
		errs = append(errs, field.Required(path, "set exactly one of from.cluster (the newest verified snapshot of that cluster) and from.object (one snapshot, as status.backup names it)"))
	}
	switch t := from.Target; {
	case t != nil:
		if _, err := s3store.Open(s3store.Target{Endpoint: t.Endpoint, Bucket: t.Bucket, AccessKeyID: "-", SecretAccessKey: "-"}); err != nil {
			errs = append(errs, field.Invalid(path.Child("target", "endpoint"), t.Endpoint, err.Error()))
		}
		errs = append(errs, secretName(path.Child("target", "credentialsSecret"), t.CredentialsSecret)...)
	case b == nil:
		errs = append(errs, field.Required(path.Child("target"), "name the object store to restore from, here or in spec.backup.target"))
	}
	if from.Encryption != nil {
		errs = append(errs, secretName(path.Child("encryption", "keySecret"), from.Encryption.KeySecret)...)
	}
	return errs
}

// validateRecovery refuses spec.quorumLossRecovery on a control plane
// whose etcd is external: its members run elsewhere.
func validateRecovery(qcp *controlplanev1.QuorumControlPlane) field.ErrorList {
	r := qcp.Spec.QuorumLossRecovery
	switch {
	case r == nil:
		return nil
	case !qcp.Spec.Etcd.IsStacked():
		return field.ErrorList{field.Forbidden(specPath.Child("quorumLossRecovery"),
			"this control plane's etcd is external, and its members run elsewhere: recover the EtcdCluster or the endpoints where they run; remove spec.quorumLossRecovery here")}
	}
	return validateRecoveryFromBackup(r, qcp.Spec.Backup)
}

// validateRecoveryFromBackup refuses the policy FromBackup without
// spec.backup, whose snapshots it restores.
func validateRecoveryFromBackup(r *controlplanev1.QuorumLossRecovery, b *controlplanev1.BackupSpec) field.ErrorList {
	if r.Policy != controlplanev1.RecoveryFromBackup || b != nil {
		return nil
	}
	return field.ErrorList{field.Invalid(specPath.Child("quorumLossRecovery", "policy"), r.Policy,
		"FromBackup restores the snapshots spec.backup takes, and spec.backup is not set: set spec.backup, or choose FromSurvivor")}
}
