package webhooks_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/webhooks"
)

const (
	validatingWebhook = `admission webhook "validation.quorumcontrolplane.controlplane.cluster.x-k8s.io" denied the request`
	scaleWebhook      = `admission webhook "validation-scale.quorumcontrolplane.controlplane.cluster.x-k8s.io" denied the request`
)

// TestAdmissionThroughAPIServer sends every case to a real kube-apiserver
// that calls qcp-manager's webhooks, installed as the local environment
// installs them: each rejection must come from QCP's webhook, name its field
// in the API status and say how to fix it, and leave the stored object as it
// was; each accepted object must be stored exactly as defaulted.
func TestAdmissionThroughAPIServer(t *testing.T) {
	env := localenv.StartForTest(t, localenv.Options{WithoutCAPI: true})
	bin := localenv.BuildForTest(t, "qcp-manager")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := env.StartManager(ctx, localenv.ManagerOptions{Path: filepath.Join(bin, "qcp-manager")}); err != nil {
		t.Fatal(err)
	}
	c := env.Client

	for i, tc := range admissionCases() {
		if tc.pureOnly {
			continue // covered by TestValidate
		}
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("case-%02d", i)
			stored := createOld(ctx, t, c, name, tc.old)
			obj := tc.new.DeepCopy()
			obj.Name = name
			var err error
			if stored == nil {
				err = c.Create(ctx, obj)
			} else {
				obj.ResourceVersion = stored.ResourceVersion
				err = c.Update(ctx, obj)
			}
			if tc.field == "" {
				checkAccepted(ctx, t, c, obj, tc.new, err)
				return
			}
			checkRejected(t, err, validatingWebhook, tc.field, tc.fix)
			checkUnchanged(ctx, t, c, name, stored)
		})
	}

	t.Run("negative replicas refused by the API server itself", func(t *testing.T) {
		obj := qcp(replicas(-1))
		obj.Name = "negative"
		err := c.Create(ctx, obj)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.replicas") {
			t.Errorf("want an Invalid error on spec.replicas, got %v", err)
		}
	})

	t.Run("backend quota below 16 MiB refused by the schema", func(t *testing.T) {
		obj := qcp(quota(16<<20 - 1))
		obj.Name = "small-quota"
		err := c.Create(ctx, obj)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.etcd.stacked.quotaBackendBytes") ||
			!strings.Contains(err.Error(), "16777216") {
			t.Errorf("want an Invalid error on spec.etcd.stacked.quotaBackendBytes that names 16777216, got %v", err)
		}
	})

	t.Run("two etcd modes at once refused by the schema", func(t *testing.T) {
		obj := qcp(external("https://10.0.0.1:2379"), func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Etcd.Stacked.Version = "v3.6.16"
		})
		obj.Name = "two-modes"
		err := c.Create(ctx, obj)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.etcd") ||
			!strings.Contains(err.Error(), "set at most one of stacked, external and clusterRef; remove the others") {
			t.Errorf("want an Invalid error on spec.etcd that says to set one mode, got %v", err)
		}
	})

	t.Run("scale subresource", func(t *testing.T) {
		stacked := createOld(ctx, t, c, "scale-stacked", qcp())
		err := scaleTo(ctx, c, stacked, 4)
		checkRejected(t, err, scaleWebhook, "spec.replicas", "stacked etcd needs an odd number of replicas (1, 3, 5 or 7) to keep quorum; use 3 or 5")
		checkUnchanged(ctx, t, c, stacked.Name, stacked)
		if err := scaleTo(ctx, c, stacked, 5); err != nil {
			t.Fatalf("scaling stacked etcd to 5: %v", err)
		}
		if got := get(ctx, t, c, stacked.Name); *got.Spec.Replicas != 5 {
			t.Errorf("after scaling to 5, spec.replicas = %d", *got.Spec.Replicas)
		}
		checkRejected(t, scaleTo(ctx, c, stacked, 0), scaleWebhook, "spec.replicas", "use 1, 3 or 5")

		ext := createOld(ctx, t, c, "scale-external", qcp(external("https://10.0.0.1:2379")))
		if err := scaleTo(ctx, c, ext, 4); err != nil {
			t.Errorf("scaling external etcd to 4 was refused: %v", err)
		}
	})

	t.Run("EtcdCluster", func(t *testing.T) { testEtcdClusterAdmission(ctx, t, c) })
	t.Run("templates", func(t *testing.T) { testTemplateAdmission(ctx, t, c) })
}

// createOld stores the starting object of an update case, or does nothing
// for a create case.
func createOld(ctx context.Context, t *testing.T, c client.Client, name string, old *controlplanev1.QuorumControlPlane) *controlplanev1.QuorumControlPlane {
	t.Helper()
	if old == nil {
		return nil
	}
	obj := old.DeepCopy()
	obj.Name = name
	if err := c.Create(ctx, obj); err != nil {
		t.Fatalf("creating the starting object: %v", err)
	}
	return get(ctx, t, c, name)
}

func get(ctx context.Context, t *testing.T, c client.Client, name string) *controlplanev1.QuorumControlPlane {
	t.Helper()
	obj := &controlplanev1.QuorumControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceDefault, Name: name}, obj); err != nil {
		t.Fatalf("reading QuorumControlPlane %s: %v", name, err)
	}
	return obj
}

func scaleTo(ctx context.Context, c client.Client, obj *controlplanev1.QuorumControlPlane, replicas int32) error {
	scale := &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: obj.Name, Namespace: obj.Namespace},
		Spec:       autoscalingv1.ScaleSpec{Replicas: replicas},
	}
	return c.SubResource("scale").Update(ctx, obj.DeepCopy(), client.WithSubResourceBody(scale))
}

// checkAccepted: the server stored what local defaulting of the request
// gives, so the defaulting webhook ran (replicas 1, the version's "v").
func checkAccepted(ctx context.Context, t *testing.T, c client.Client, obj, request *controlplanev1.QuorumControlPlane, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("rejected a valid request: %v", err)
	}
	want := request.DeepCopy()
	webhooks.Default(want)
	got := get(ctx, t, c, obj.Name)
	if !equality.Semantic.DeepEqual(got.Spec, want.Spec) {
		t.Errorf("stored spec\n%+v\nwant the defaulted request\n%+v", got.Spec, want.Spec)
	}
	if got.Spec.Replicas == nil || *got.Spec.Replicas < 1 || !strings.HasPrefix(got.Spec.Version, "v") {
		t.Errorf("stored spec was not defaulted: replicas %v, version %q", got.Spec.Replicas, got.Spec.Version)
	}
}

// checkRejected: an Invalid error from the named webhook whose status names
// field as a cause and whose message says fix.
func checkRejected(t *testing.T, err error, webhook, field, fix string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want a rejection on %s", field)
	}
	if !apierrors.IsInvalid(err) {
		t.Errorf("error is not Invalid (422): %v", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, webhook) {
		t.Errorf("rejection did not come from QCP's webhook (%s): %s", webhook, msg)
	}
	if !strings.Contains(msg, field+":") || !strings.Contains(msg, fix) {
		t.Errorf("message does not name %s and say %q: %s", field, fix, msg)
	}
	var causes []string
	if status, ok := err.(apierrors.APIStatus); ok && status.Status().Details != nil {
		for _, cause := range status.Status().Details.Causes {
			causes = append(causes, cause.Field)
		}
	}
	if len(causes) != 1 || causes[0] != field {
		t.Errorf("status causes name fields %v, want [%s]", causes, field)
	}
}

// checkUnchanged: nothing of a rejected request was stored.
func checkUnchanged(ctx context.Context, t *testing.T, c client.Client, name string, stored *controlplanev1.QuorumControlPlane) {
	t.Helper()
	if stored == nil {
		err := c.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceDefault, Name: name}, &controlplanev1.QuorumControlPlane{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("a rejected create left an object behind: %v", err)
		}
		return
	}
	got := get(ctx, t, c, name)
	if got.ResourceVersion != stored.ResourceVersion || !equality.Semantic.DeepEqual(got.Spec, stored.Spec) {
		t.Errorf("a rejected update changed the object: spec %+v, was %+v", got.Spec, stored.Spec)
	}
}
