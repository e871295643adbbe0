package webhooks_test

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// admissionCase is one request: a create (old is nil) or an update of old to
// new. field and fix are empty when the request must be accepted; otherwise
// the rejection must name field and contain fix.
type admissionCase struct {
	name     string
	old, new *controlplanev1.QuorumControlPlane
	field    string
	fix      string
	// pureOnly cases cannot reach the webhook through the API server: it
	// refuses them first, or they need a status that is the controller's to
	// write.
	pureOnly bool
}

// qcp is a valid QuorumControlPlane with stacked etcd, changed by edits.
func qcp(edits ...func(*controlplanev1.QuorumControlPlane)) *controlplanev1.QuorumControlPlane {
	q := &controlplanev1.QuorumControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault},
		Spec: controlplanev1.QuorumControlPlaneSpec{
			Replicas: ptr.To[int32](3),
			Version:  "v1.36.3",
			MachineTemplate: controlplanev1.QuorumControlPlaneMachineTemplate{
				Spec: controlplanev1.QuorumControlPlaneMachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "ProcessMachineTemplate", Name: "cp",
					},
				},
			},
		},
	}
	for _, edit := range edits {
		edit(q)
	}
	return q
}

func replicas(n int32) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) { q.Spec.Replicas = ptr.To(n) }
}

func version(v string) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) { q.Spec.Version = v }
}

func external(endpoints ...string) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) {
		q.Spec.Etcd = controlplanev1.EtcdSpec{External: &controlplanev1.ExternalEtcd{Endpoints: endpoints}}
	}
}

func clusterRef(name string) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) {
		q.Spec.Etcd = controlplanev1.EtcdSpec{ClusterRef: &controlplanev1.LocalObjectReference{Name: name}}
	}
}

func etcdArgs(args ...controlplanev1.Arg) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) { q.Spec.Etcd.Stacked.ExtraArgs = args }
}

func quota(bytes int64) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) { q.Spec.Etcd.Stacked.QuotaBackendBytes = ptr.To(bytes) }
}

func rotate(trigger string) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) {
		q.Spec.Certificates.Rotation = &controlplanev1.CertificateRotation{Kind: controlplanev1.CertificateAuthorityEtcdCA, Trigger: trigger}
	}
}

func backup(edits ...func(*controlplanev1.BackupSpec)) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) {
		b := &controlplanev1.BackupSpec{
			Target:   controlplanev1.BackupTarget{Endpoint: "https://s3.example.com", Bucket: "backups", CredentialsSecret: "s3-credentials"},
			Schedule: controlplanev1.BackupSchedule{IntervalSeconds: ptr.To[int32](3600)},
		}
		for _, edit := range edits {
			edit(b)
		}
		q.Spec.Backup = b
	}
}

func restore(edits ...func(*controlplanev1.RestoreSource)) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) {
		r := &controlplanev1.RestoreSpec{From: controlplanev1.RestoreSource{Cluster: "lost",
			Target: &controlplanev1.BackupTarget{Endpoint: "https://s3.example.com", Bucket: "backups", CredentialsSecret: "s3-credentials"}}}
		for _, edit := range edits {
			edit(&r.From)
		}
		q.Spec.Restore = r
	}
}

func rotating(trigger string, stage controlplanev1.CertificateRotationStage) func(*controlplanev1.QuorumControlPlane) {
	return func(q *controlplanev1.QuorumControlPlane) {
		q.Status.CertificateRotation = &controlplanev1.CertificateRotationStatus{Kind: controlplanev1.CertificateAuthorityEtcdCA, Trigger: trigger, Stage: stage}
	}
}

func admissionCases() []admissionCase {
	return []admissionCase{
		// Rejected creates.
		{name: "even replicas with stacked etcd", new: qcp(replicas(4)),
			field: "spec.replicas", fix: "stacked etcd needs an odd number of replicas (1, 3, 5 or 7) to keep quorum; use 3 or 5"},
		{name: "two replicas with stacked etcd", new: qcp(replicas(2)), field: "spec.replicas", fix: "use 1 or 3"},
		{name: "zero replicas", new: qcp(replicas(0)), field: "spec.replicas", fix: "needs at least 1 machine; use 1, 3 or 5"},
		// The API server refuses a negative scale spec path itself, before
		// validating webhooks run; TestAdmissionThroughAPIServer checks that.
		{name: "negative replicas", new: qcp(replicas(-1)), field: "spec.replicas", fix: "needs at least 1 machine; use 1, 3 or 5", pureOnly: true},
		{name: "zero replicas with external etcd", new: qcp(external("https://10.0.0.1:2379"), replicas(0)),
			field: "spec.replicas", fix: "use 1, 3 or 5"},
		{name: "more than seven replicas", new: qcp(replicas(9)), field: "spec.replicas", fix: "use 7 or fewer"},
		{name: "version without patch", new: qcp(version("v1.36")),
			field: "spec.version", fix: "must be a version such as v1.36.3; write v, then MAJOR.MINOR.PATCH"},
		{name: "version that is a word", new: qcp(version("latest")), field: "spec.version", fix: "write v, then MAJOR.MINOR.PATCH"},
		{name: "version with a space", new: qcp(version("v1.36.3 ")), field: "spec.version", fix: "write v, then MAJOR.MINOR.PATCH"},
		{name: "malformed stacked etcd version", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Etcd.Stacked.Version = "3.6"
		}), field: "spec.etcd.stacked.version", fix: "must be a version such as v3.6.16"},
		{name: "cert SAN that is neither a name nor an address", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.APIServer.CertSANs = []string{"api.example.com", "not a name!"}
		}), field: "spec.apiServer.certSANs[1]", fix: "must be a DNS name or an IP address"},
		{name: "maxSurge 0 with one replica", new: qcp(replicas(1), func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Rollout.Strategy.RollingUpdate.MaxSurge = ptr.To[int32](0)
		}), field: "spec.rollout.strategy.rollingUpdate.maxSurge", fix: "use maxSurge 1, or 3 or more replicas"},
		{name: "certificate expiry threshold past the validity", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.CertificateValidityPeriodDays = ptr.To[int32](30)
			q.Spec.Rollout.Before.CertificatesExpiryDays = ptr.To[int32](30)
		}), field: "spec.rollout.before.certificatesExpiryDays", fix: "use fewer days than that, or raise certificateValidityPeriodDays"},
		{name: "certificate expiry threshold past the default validity", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Rollout.Before.CertificatesExpiryDays = ptr.To[int32](400)
		}), field: "spec.rollout.before.certificatesExpiryDays", fix: "valid for 365 days"},

		// Rejected updates.
		{name: "downgrade", old: qcp(), new: qcp(version("v1.35.4")),
			field: "spec.version", fix: "cannot downgrade from v1.36.3, because Kubernetes and etcd do not support downgrades; use v1.36.3 or later"},
		{name: "patch downgrade", old: qcp(), new: qcp(version("v1.36.2")), field: "spec.version", fix: "use v1.36.3 or later"},
		{name: "skipped minor version", old: qcp(version("v1.35.4")), new: qcp(version("v1.37.0")),
			field: "spec.version", fix: "the control plane is at v1.35.4 and upgrades go one minor version at a time; set a v1.36.x version first"},
		{name: "major version jump", old: qcp(), new: qcp(version("v2.0.0")), field: "spec.version", fix: "set a v1.37.x version first"},
		{name: "second upgrade before the machines finished the first", pureOnly: true,
			old: qcp(func(q *controlplanev1.QuorumControlPlane) { q.Status.Version = "v1.35.4" }),
			new: qcp(version("v1.37.0")), field: "spec.version", fix: "the control plane is at v1.35.4"},
		{name: "etcd CA rotation on external etcd", new: qcp(external("https://10.0.0.1:2379"), rotate("1")),
			field: "spec.certificates.rotation.kind", fix: "its CA belongs to whoever runs it"},
		{name: "a rotation requested while another is in progress", pureOnly: true,
			old: qcp(rotate("1"), rotating("1", controlplanev1.RotationReissue)), new: qcp(rotate("2")),
			field: "spec.certificates.rotation", fix: `a rotation of the EtcdCA (trigger "1") is at stage Reissue; wait until status.certificateRotation.stage is Completed`},
		{name: "a rotation withdrawn while in progress", pureOnly: true,
			old: qcp(rotate("1"), rotating("1", controlplanev1.RotationTrustBoth)), new: qcp(),
			field: "spec.certificates.rotation", fix: "is at stage TrustBoth"},
		{name: "a new rotation once the last completed", old: qcp(rotate("1"), rotating("1", controlplanev1.RotationCompleted)), new: qcp(rotate("2"))},
		{name: "a first rotation", old: qcp(), new: qcp(rotate("1"))},
		{name: "a cluster CA rotation on external etcd", new: qcp(external("https://10.0.0.1:2379"), func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Certificates.Rotation = &controlplanev1.CertificateRotation{Kind: controlplanev1.CertificateAuthorityClusterCA, Trigger: "1"}
		}), field: "spec.certificates.rotation.kind", fix: "stacked etcd only, so far"},
		{name: "a cluster CA rotation on stacked etcd", old: qcp(), new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Certificates.Rotation = &controlplanev1.CertificateRotation{Kind: controlplanev1.CertificateAuthorityClusterCA, Trigger: "1"}
		})},
		{name: "a front-proxy CA rotation on external etcd", new: qcp(external("https://10.0.0.1:2379"), func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Certificates.Rotation = &controlplanev1.CertificateRotation{Kind: controlplanev1.CertificateAuthorityFrontProxyCA, Trigger: "1"}
		}), field: "spec.certificates.rotation.kind", fix: "QCP rotates the FrontProxyCA of a control plane with stacked etcd only, so far"},
		{name: "a front-proxy CA rotation on stacked etcd", old: qcp(), new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Certificates.Rotation = &controlplanev1.CertificateRotation{Kind: controlplanev1.CertificateAuthorityFrontProxyCA, Trigger: "1"}
		})},
		{name: "stacked to external etcd", old: qcp(), new: qcp(external("https://10.0.0.1:2379")),
			field: "spec.etcd", fix: "cannot switch from stacked etcd to external etcd endpoints after creation, because the cluster's data lives in the etcd it started with; remove spec.etcd.external and spec.etcd.clusterRef"},
		{name: "stacked to EtcdCluster", old: qcp(), new: qcp(clusterRef("etcd-a")),
			field: "spec.etcd", fix: "remove spec.etcd.external and spec.etcd.clusterRef"},
		{name: "external to stacked etcd", old: qcp(external("https://10.0.0.1:2379")), new: qcp(),
			field: "spec.etcd", fix: "cannot switch from external etcd endpoints to stacked etcd after creation"},
		{name: "external endpoints to EtcdCluster", old: qcp(external("https://10.0.0.1:2379")), new: qcp(clusterRef("etcd-a")),
			field: "spec.etcd", fix: "set spec.etcd.external back"},
		{name: "EtcdCluster to external endpoints", old: qcp(clusterRef("etcd-a")), new: qcp(external("https://10.0.0.1:2379")),
			field: "spec.etcd", fix: `set spec.etcd.clusterRef back to "etcd-a"`},
		{name: "EtcdCluster to another EtcdCluster", old: qcp(clusterRef("etcd-a")), new: qcp(clusterRef("etcd-b")),
			field: "spec.etcd.clusterRef.name", fix: `set spec.etcd.clusterRef back to "etcd-a"`},
		{name: "an etcd flag qcp-agent owns", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Etcd.Stacked.ExtraArgs = []controlplanev1.Arg{{Name: "data-dir", Value: "/tmp"}}
		}), field: "spec.etcd.stacked.extraArgs[0].name", fix: "flag --data-dir of etcd is owned by qcp-agent"},
		{name: "an API server flag qcp-agent owns", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.APIServer.ExtraArgs = []controlplanev1.Arg{{Name: "v", Value: "2"}, {Name: "etcd-servers", Value: "https://10.0.0.9:2379"}}
		}), field: "spec.apiServer.extraArgs[1].name", fix: "remove it and set etcd.external.endpoints instead"},
		{name: "the backend quota as an etcd flag", new: qcp(etcdArgs(
			controlplanev1.Arg{Name: "log-level", Value: "debug"}, controlplanev1.Arg{Name: "quota-backend-bytes", Value: "8589934592"})),
			field: "spec.etcd.stacked.extraArgs[1].name", fix: "remove it and set spec.etcd.stacked.quotaBackendBytes instead"},
		{name: "the backend quota flag added by an update", old: qcp(quota(4 << 30)),
			new:   qcp(quota(4<<30), etcdArgs(controlplanev1.Arg{Name: "quota-backend-bytes", Value: "8589934592"})),
			field: "spec.etcd.stacked.extraArgs[0].name", fix: "set spec.etcd.stacked.quotaBackendBytes instead"},
		{name: "a restore of external etcd", new: qcp(external("https://10.0.0.1:2379"), restore()),
			field: "spec.restore", fix: "restore its EtcdCluster (spec.restore there)"},
		{name: "a restore of both a cluster and an object", pureOnly: true, new: qcp(restore(func(r *controlplanev1.RestoreSource) { r.Object = "x.db" })),
			field: "spec.restore.from", fix: "set exactly one of from.cluster"},
		{name: "a restore without a store", new: qcp(restore(func(r *controlplanev1.RestoreSource) { r.Target = nil })),
			field: "spec.restore.from.target", fix: "here or in spec.backup.target"},
		{name: "a restore key Secret that is no name", new: qcp(restore(func(r *controlplanev1.RestoreSource) {
			r.Encryption = &controlplanev1.BackupEncryption{KeySecret: "Key!"}
		})), field: "spec.restore.from.encryption.keySecret", fix: "name a Secret in this object's namespace"},
		{name: "a restore added to a control plane that exists", old: qcp(), new: qcp(restore()),
			field: "spec.restore", fix: "create a new QuorumControlPlane with spec.restore.from"},
		{name: "a restore removed", old: qcp(restore()), new: qcp(),
			field: "spec.restore", fix: "spec.restore is fixed when the QuorumControlPlane is created"},
		{name: "valid upgrade together with even replicas", old: qcp(), new: qcp(version("v1.37.0"), replicas(4)),
			field: "spec.replicas", fix: "use 3 or 5"},

		{name: "a quorum-loss recovery policy on external etcd", new: qcp(external("https://10.0.0.1:2379"), func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.QuorumLossRecovery = &controlplanev1.QuorumLossRecovery{Policy: controlplanev1.RecoveryFromSurvivor}
		}), field: "spec.quorumLossRecovery", fix: "remove spec.quorumLossRecovery here"},
		{name: "recovery from a backup without backups", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.QuorumLossRecovery = &controlplanev1.QuorumLossRecovery{Policy: controlplanev1.RecoveryFromBackup}
		}), field: "spec.quorumLossRecovery.policy", fix: "set spec.backup, or choose FromSurvivor"},
		{name: "recovery from a backup, with backups", new: qcp(backup(), func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.QuorumLossRecovery = &controlplanev1.QuorumLossRecovery{Policy: controlplanev1.RecoveryFromBackup}
		})},
		{name: "backups of external etcd", new: qcp(external("https://10.0.0.1:2379"), backup()),
			field: "spec.backup", fix: "set spec.backup on its EtcdCluster"},
		{name: "backups of an EtcdCluster's etcd", new: qcp(clusterRef("etcd-a"), backup()),
			field: "spec.backup", fix: "remove spec.backup here"},
		{name: "a backup schedule that is no cron expression", new: qcp(backup(func(b *controlplanev1.BackupSpec) {
			b.Schedule = controlplanev1.BackupSchedule{Cron: "every six hours"}
		})), field: "spec.backup.schedule", fix: `give five fields (minute hour day-of-month month day-of-week), e.g. "0 */6 * * *"`},
		{name: "a backup schedule with both an interval and cron", pureOnly: true, new: qcp(backup(func(b *controlplanev1.BackupSpec) {
			b.Schedule.Cron = "@hourly"
		})), field: "spec.backup.schedule", fix: "give intervalSeconds or cron, not both"},
		{name: "a backup endpoint with a path", pureOnly: true, new: qcp(backup(func(b *controlplanev1.BackupSpec) {
			b.Target.Endpoint = "https://s3.example.com/backups"
		})), field: "spec.backup.target.endpoint", fix: "give https://host[:port], without a path"},
		{name: "a backup credentials Secret that is no name", new: qcp(backup(func(b *controlplanev1.BackupSpec) {
			b.Target.CredentialsSecret = "S3 Credentials"
		})), field: "spec.backup.target.credentialsSecret", fix: "name a Secret in this object's namespace"},
		{name: "a backup key Secret that is no name", new: qcp(backup(func(b *controlplanev1.BackupSpec) {
			b.Encryption = &controlplanev1.BackupEncryption{KeySecret: "-key-"}
		})), field: "spec.backup.encryption.keySecret", fix: "name a Secret in this object's namespace"},

		// Accepted.
		{name: "backups of stacked etcd, encrypted, on a cron schedule", new: qcp(backup(func(b *controlplanev1.BackupSpec) {
			b.Schedule = controlplanev1.BackupSchedule{Cron: "0 */6 * * *"}
			b.Retention = controlplanev1.BackupRetention{KeepLast: ptr.To[int32](5), MaxAgeSeconds: ptr.To[int64](7 * 86400)}
			b.Encryption = &controlplanev1.BackupEncryption{KeySecret: "backup-key"}
		}))},
		{name: "a restore from the store spec.backup names", new: qcp(backup(), restore(func(r *controlplanev1.RestoreSource) {
			r.Target, r.Cluster, r.Object = nil, "", "default/quorumcontrolplane/lost/20261130T000000.000Z.db"
		}))},
		{name: "one replica by default", new: qcp(func(q *controlplanev1.QuorumControlPlane) { q.Spec.Replicas = nil })},
		{name: "version without its v", new: qcp(version("1.36.3"))},
		{name: "five replicas", new: qcp(replicas(5))},
		{name: "even replicas with external etcd", new: qcp(external("https://10.0.0.1:2379"), replicas(2))},
		{name: "even replicas with an EtcdCluster", new: qcp(clusterRef("etcd-a"), replicas(4))},
		{name: "tuned stacked etcd and components", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Etcd.Stacked = controlplanev1.StackedEtcd{Version: "v3.6.16", QuotaBackendBytes: ptr.To[int64](8 << 30),
				ExtraArgs: []controlplanev1.Arg{{Name: "snapshot-count", Value: "50000"}}}
			q.Spec.APIServer = controlplanev1.APIServerSpec{CertSANs: []string{"api.example.com", "*.example.com", "10.0.0.1"},
				ExtraArgs: []controlplanev1.Arg{{Name: "audit-log-path", Value: "-"}}}
			q.Spec.Scheduler.ExtraArgs = []controlplanev1.Arg{{Name: "v", Value: "2"}}
		})},
		{name: "certificate expiry threshold within the validity", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.CertificateValidityPeriodDays = ptr.To[int32](30)
			q.Spec.Rollout.Before.CertificatesExpiryDays = ptr.To[int32](7)
		})},
		{name: "maxSurge 0 with three replicas", new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Rollout.Strategy.RollingUpdate.MaxSurge = ptr.To[int32](0)
		})},
		{name: "one minor upgrade", old: qcp(version("v1.35.4")), new: qcp(version("v1.36.3"))},
		{name: "patch upgrade", old: qcp(version("v1.36.2")), new: qcp(version("v1.36.3"))},
		{name: "scale up", old: qcp(), new: qcp(replicas(5))},
		{name: "new external endpoints", old: qcp(external("https://10.0.0.1:2379")),
			new: qcp(external("https://10.0.0.1:2379", "https://10.0.0.2:2379"))},
		{name: "labels only", old: qcp(), new: qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Labels = map[string]string{"team": "a"}
		})},
		{name: "the smallest backend quota", new: qcp(quota(16 << 20))},
		{name: "backend quota raised", old: qcp(), new: qcp(quota(8 << 30))},
		// An object stored before quotaBackendBytes existed may still carry
		// the flag; it must stay labelable and deletable.
		{name: "labels only on a spec with the backend quota flag", pureOnly: true,
			old: qcp(etcdArgs(controlplanev1.Arg{Name: "quota-backend-bytes", Value: "8589934592"})),
			new: qcp(etcdArgs(controlplanev1.Arg{Name: "quota-backend-bytes", Value: "8589934592"}), func(q *controlplanev1.QuorumControlPlane) {
				q.Labels = map[string]string{"team": "a"}
			})},
	}
}
