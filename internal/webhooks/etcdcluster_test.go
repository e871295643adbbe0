package webhooks_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/webhooks"
)

const (
	etcdValidatingWebhook = `admission webhook "validation.etcdcluster.etcd.cluster.x-k8s.io" denied the request`
	etcdScaleWebhook      = `admission webhook "validation-scale.etcdcluster.etcd.cluster.x-k8s.io" denied the request`
)

// etcdCluster is a valid EtcdCluster, changed by edits.
func etcdCluster(edits ...func(*etcdv1.EtcdCluster)) *etcdv1.EtcdCluster {
	ec := &etcdv1.EtcdCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault},
		Spec: etcdv1.EtcdClusterSpec{
			Version: "v3.6.16",
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "ProcessMachineTemplate", Name: "etcd",
			},
		},
	}
	for _, edit := range edits {
		edit(ec)
	}
	return ec
}

func members(n int32) func(*etcdv1.EtcdCluster) {
	return func(ec *etcdv1.EtcdCluster) { ec.Spec.Replicas = ptr.To(n) }
}

func etcdVersion(v string) func(*etcdv1.EtcdCluster) {
	return func(ec *etcdv1.EtcdCluster) { ec.Spec.Version = v }
}

func etcdExtraArgs(args ...controlplanev1.Arg) func(*etcdv1.EtcdCluster) {
	return func(ec *etcdv1.EtcdCluster) { ec.Spec.ExtraArgs = args }
}

func etcdQuota(bytes int64) func(*etcdv1.EtcdCluster) {
	return func(ec *etcdv1.EtcdCluster) { ec.Spec.QuotaBackendBytes = ptr.To(bytes) }
}

// etcdCase is one request, as admissionCase is for control planes.
type etcdCase struct {
	name       string
	old, new   *etcdv1.EtcdCluster
	field, fix string
	// pureOnly cases never reach the webhook: the schema or the webhook
	// itself refuses their starting point first.
	pureOnly bool
}

func etcdClusterCases() []etcdCase {
	return []etcdCase{
		{name: "defaults: 3 members, a version without v", new: etcdCluster(etcdVersion("3.6.16"))},
		{name: "5 members", new: etcdCluster(members(5))},
		{name: "backups every hour", new: etcdCluster(func(ec *etcdv1.EtcdCluster) {
			ec.Spec.Backup = &controlplanev1.BackupSpec{
				Target:   controlplanev1.BackupTarget{Endpoint: "https://s3.example.com:9000", Bucket: "etcd", CredentialsSecret: "s3"},
				Schedule: controlplanev1.BackupSchedule{Cron: "@hourly"},
			}
		})},
		{name: "backups on a bad cron schedule", new: etcdCluster(func(ec *etcdv1.EtcdCluster) {
			ec.Spec.Backup = &controlplanev1.BackupSpec{
				Target:   controlplanev1.BackupTarget{Endpoint: "https://s3.example.com:9000", Bucket: "etcd", CredentialsSecret: "s3"},
				Schedule: controlplanev1.BackupSchedule{Cron: "* * *"},
			}
		}), field: "spec.backup.schedule", fix: "give five fields"},
		{name: "a restore from the newest snapshot of another EtcdCluster", new: etcdCluster(etcdRestore(nil))},
		{name: "a recovery from a backup, not built for an EtcdCluster", new: etcdCluster(func(ec *etcdv1.EtcdCluster) {
			ec.Spec.QuorumLossRecovery = &controlplanev1.QuorumLossRecovery{Policy: controlplanev1.RecoveryFromBackup}
		}), field: "spec.quorumLossRecovery.policy", fix: "choose FromSurvivor"},
		{name: "a restore without a store", new: etcdCluster(etcdRestore(func(r *controlplanev1.RestoreSource) { r.Target = nil })),
			field: "spec.restore.from.target", fix: "here or in spec.backup.target"},
		{name: "a restore added to an EtcdCluster that exists", old: etcdCluster(), new: etcdCluster(etcdRestore(nil)),
			field: "spec.restore", fix: "create a new EtcdCluster with spec.restore.from"},
		{name: "an even member count", new: etcdCluster(members(4)),
			field: "spec.replicas", fix: "etcd needs an odd number of members (1, 3, 5 or 7): an even number tolerates no more failures than one member fewer; use 3 or 5"},
		{name: "2 members", new: etcdCluster(members(2)), field: "spec.replicas", fix: "use 1 or 3"},
		{name: "9 members", new: etcdCluster(members(9)), field: "spec.replicas", fix: "use 1, 3, 5 or 7", pureOnly: true},
		{name: "a malformed version", new: etcdCluster(etcdVersion("v3.6")),
			field: "spec.version", fix: "must be a version such as v3.6.16; write v, then MAJOR.MINOR.PATCH"},
		{name: "a version with words", new: etcdCluster(etcdVersion("latest")), field: "spec.version", fix: "write v, then MAJOR.MINOR.PATCH"},
		{name: "etcd older than v3.5", new: etcdCluster(etcdVersion("v3.4.30")),
			field: "spec.version", fix: "QCP runs etcd v3.5.0 or later (it adds members as learners); use a v3.5.x or v3.6.x version"},
		{name: "a flag qcp-agent owns", new: etcdCluster(func(ec *etcdv1.EtcdCluster) {
			ec.Spec.ExtraArgs = []controlplanev1.Arg{{Name: "data-dir", Value: "/tmp/x"}}
		}), field: "spec.extraArgs[0].name", fix: "flag --data-dir of etcd is owned by qcp-agent"},
		{name: "an extra flag", new: etcdCluster(func(ec *etcdv1.EtcdCluster) {
			ec.Spec.ExtraArgs = []controlplanev1.Arg{{Name: "snapshot-count", Value: "50000"}}
		})},
		{name: "the backend quota as a flag", new: etcdCluster(etcdExtraArgs(controlplanev1.Arg{Name: "quota-backend-bytes", Value: "4294967296"})),
			field: "spec.extraArgs[0].name", fix: "remove it and set spec.quotaBackendBytes instead"},
		{name: "the backend quota flag added by an update", old: etcdCluster(),
			new:   etcdCluster(etcdExtraArgs(controlplanev1.Arg{Name: "log-level", Value: "debug"}, controlplanev1.Arg{Name: "quota-backend-bytes", Value: "4294967296"})),
			field: "spec.extraArgs[1].name", fix: "set spec.quotaBackendBytes instead"},
		{name: "a backend quota", new: etcdCluster(etcdQuota(4 << 30))},
		{name: "backend quota raised", old: etcdCluster(etcdQuota(4 << 30)), new: etcdCluster(etcdQuota(8 << 30))},
		{name: "labels only on a spec with the backend quota flag", pureOnly: true,
			old: etcdCluster(etcdExtraArgs(controlplanev1.Arg{Name: "quota-backend-bytes", Value: "4294967296"})),
			new: etcdCluster(etcdExtraArgs(controlplanev1.Arg{Name: "quota-backend-bytes", Value: "4294967296"}), func(ec *etcdv1.EtcdCluster) {
				ec.Labels = map[string]string{"team": "a"}
			})},
		{name: "upgrade v3.5 to v3.6", old: etcdCluster(etcdVersion("v3.5.35")), new: etcdCluster(etcdVersion("v3.6.16"))},
		{name: "downgrade", old: etcdCluster(), new: etcdCluster(etcdVersion("v3.5.35")),
			field: "spec.version", fix: "cannot downgrade from v3.6.16: etcd members do not move back to an older storage version; use v3.6.16 or later"},
		{name: "a skipped minor version", old: etcdCluster(etcdVersion("v3.5.35")), new: etcdCluster(etcdVersion("v3.7.0")),
			field: "spec.version", fix: "the members run v3.5.35 and etcd upgrades go one minor version at a time; set a v3.6.x version first"},
		{name: "scale 3 to 5", old: etcdCluster(), new: etcdCluster(members(5))},
		{name: "scale 3 to 4", old: etcdCluster(), new: etcdCluster(members(4)), field: "spec.replicas", fix: "use 3 or 5"},
	}
}

func TestValidateEtcdCluster(t *testing.T) {
	for _, tc := range etcdClusterCases() {
		t.Run(tc.name, func(t *testing.T) {
			old, ec := tc.old.DeepCopy(), tc.new.DeepCopy()
			if old != nil {
				webhooks.DefaultEtcdCluster(old)
			}
			webhooks.DefaultEtcdCluster(ec)
			errs := webhooks.ValidateEtcdCluster(old, ec)
			if tc.field == "" {
				if len(errs) > 0 {
					t.Fatalf("rejected a valid request: %v", errs.ToAggregate())
				}
				return
			}
			if len(errs) != 1 || errs[0].Field != tc.field || !strings.Contains(errs[0].Error(), tc.fix) {
				t.Fatalf("want one error on %s saying %q, got %v", tc.field, tc.fix, errs.ToAggregate())
			}
		})
	}
}

func TestDefaultEtcdCluster(t *testing.T) {
	ec := etcdCluster(etcdVersion("3.6.16"))
	webhooks.DefaultEtcdCluster(ec)
	if got := ptr.Deref(ec.Spec.Replicas, 0); got != 3 {
		t.Errorf("replicas = %d, want 3", got)
	}
	if ec.Spec.Version != "v3.6.16" {
		t.Errorf("version = %q, want v3.6.16", ec.Spec.Version)
	}
	if got := ptr.Deref(ec.Spec.UnhealthyMemberTimeoutSeconds, 0); got != etcdv1.DefaultUnhealthyMemberTimeoutSeconds {
		t.Errorf("unhealthyMemberTimeoutSeconds = %d, want %d", got, etcdv1.DefaultUnhealthyMemberTimeoutSeconds)
	}
	again := ec.DeepCopy()
	webhooks.DefaultEtcdCluster(again)
	if !equality.Semantic.DeepEqual(ec, again) {
		t.Errorf("defaulting is not idempotent: %+v, then %+v", ec.Spec, again.Spec)
	}
	set := etcdCluster(members(5), func(ec *etcdv1.EtcdCluster) { ec.Spec.UnhealthyMemberTimeoutSeconds = ptr.To[int32](30) })
	webhooks.DefaultEtcdCluster(set)
	if *set.Spec.Replicas != 5 || *set.Spec.UnhealthyMemberTimeoutSeconds != 30 {
		t.Errorf("defaulting changed values the user set: %+v", set.Spec)
	}
}

// testEtcdClusterAdmission sends every EtcdCluster case, and scales, to the
// API server of TestAdmissionThroughAPIServer.
func testEtcdClusterAdmission(ctx context.Context, t *testing.T, c client.Client) {
	getEC := func(t *testing.T, name string) *etcdv1.EtcdCluster {
		t.Helper()
		ec := &etcdv1.EtcdCluster{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceDefault, Name: name}, ec); err != nil {
			t.Fatalf("reading EtcdCluster %s: %v", name, err)
		}
		return ec
	}
	for i, tc := range etcdClusterCases() {
		if tc.pureOnly {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("etcd-%02d", i)
			var stored *etcdv1.EtcdCluster
			obj := tc.new.DeepCopy()
			obj.Name = name
			var err error
			if tc.old != nil {
				old := tc.old.DeepCopy()
				old.Name = name
				if err := c.Create(ctx, old); err != nil {
					t.Fatalf("creating the starting object: %v", err)
				}
				// qcp-manager's EtcdCluster controller writes the object's
				// status meanwhile (it waits for a cluster-name label), so
				// the update goes on the latest version, as a client's would.
				err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
					stored = getEC(t, name)
					obj.ResourceVersion = stored.ResourceVersion
					return c.Update(ctx, obj)
				})
			} else {
				err = c.Create(ctx, obj)
			}
			if tc.field == "" {
				if err != nil {
					t.Fatalf("rejected a valid request: %v", err)
				}
				want := tc.new.DeepCopy()
				webhooks.DefaultEtcdCluster(want)
				if got := getEC(t, name); !equality.Semantic.DeepEqual(got.Spec, want.Spec) {
					t.Errorf("stored spec\n%+v\nwant the defaulted request\n%+v", got.Spec, want.Spec)
				}
				return
			}
			checkRejected(t, err, etcdValidatingWebhook, tc.field, tc.fix)
			if stored == nil {
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), &etcdv1.EtcdCluster{}); !apierrors.IsNotFound(err) {
					t.Errorf("a rejected create left an object behind: %v", err)
				}
			} else if got := getEC(t, name); got.Generation != stored.Generation || !equality.Semantic.DeepEqual(got.Spec, stored.Spec) {
				t.Errorf("a rejected update changed the object: generation %d, spec %+v; was %d, %+v", got.Generation, got.Spec, stored.Generation, stored.Spec)
			}
		})
	}

	t.Run("backend quota below 16 MiB refused by the schema", func(t *testing.T) {
		ec := etcdCluster(etcdQuota(16<<20 - 1))
		ec.Name = "etcd-small-quota"
		err := c.Create(ctx, ec)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.quotaBackendBytes") || !strings.Contains(err.Error(), "16777216") {
			t.Errorf("want an Invalid error on spec.quotaBackendBytes that names 16777216, got %v", err)
		}
	})

	t.Run("scale subresource", func(t *testing.T) {
		ec := etcdCluster()
		ec.Name = "etcd-scale"
		if err := c.Create(ctx, ec); err != nil {
			t.Fatal(err)
		}
		scaleEC := func(n int32) error {
			scale := &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: ec.Name, Namespace: ec.Namespace}, Spec: autoscalingv1.ScaleSpec{Replicas: n}}
			return c.SubResource("scale").Update(ctx, ec.DeepCopy(), client.WithSubResourceBody(scale))
		}
		checkRejected(t, scaleEC(4), etcdScaleWebhook, "spec.replicas", "use 3 or 5")
		if got := getEC(t, ec.Name); *got.Spec.Replicas != 3 {
			t.Errorf("a refused scale changed spec.replicas to %d", *got.Spec.Replicas)
		}
		if err := scaleEC(5); err != nil {
			t.Fatalf("scaling to 5: %v", err)
		}
		if got := getEC(t, ec.Name); *got.Spec.Replicas != 5 {
			t.Errorf("after scaling to 5, spec.replicas = %d", *got.Spec.Replicas)
		}
	})
}

func etcdRestore(edit func(*controlplanev1.RestoreSource)) func(*etcdv1.EtcdCluster) {
	return func(ec *etcdv1.EtcdCluster) {
		r := &controlplanev1.RestoreSpec{From: controlplanev1.RestoreSource{Cluster: "lost",
			Target: &controlplanev1.BackupTarget{Endpoint: "https://s3.example.com", Bucket: "etcd", CredentialsSecret: "s3"}}}
		if edit != nil {
			edit(&r.From)
		}
		ec.Spec.Restore = r
	}
}
