package webhooks

import (
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
