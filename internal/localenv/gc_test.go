package localenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestGarbageCollection checks that the management cluster collects what a
// real one does: the dependents of a deleted owner, whether the owner is a
// built-in object or a CAPI Machine served through CAPI's CRDs, and the
// contents of a deleted namespace.
func TestGarbageCollection(t *testing.T) {
	env := localenv.StartForTest(t, localenv.Options{})
	c := env.Client
	t.Run("dependent of a ConfigMap", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		owner := create(ctx, t, c, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "default"}})
		kept := create(ctx, t, c, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept-owner", Namespace: "default"}})
		dependent := create(ctx, t, c, ownedSecret("dependent", owner, "v1", "ConfigMap"))
		keptDependent := create(ctx, t, c, ownedSecret("kept-dependent", kept, "v1", "ConfigMap"))
		deleteAndWaitGone(ctx, t, c, owner, dependent)
		if err := c.Get(ctx, client.ObjectKeyFromObject(keptDependent), &corev1.Secret{}); err != nil {
			t.Errorf("the dependent of an owner that still exists: %v", err)
		}
	})
	t.Run("dependent of a CAPI Machine", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// The Machine names a Cluster that does not exist, so CAPI core
		// never gets as far as adding its finalizer, and deleting it
		// removes it at once; paused in case it ever does.
		m := create(ctx, t, c, &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Name: "gc-owner", Namespace: "default", Annotations: map[string]string{clusterv1.PausedAnnotation: ""}},
			Spec: clusterv1.MachineSpec{
				ClusterName: "no-such-cluster", Version: "v1.36.3", Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr("gc-owner-bootstrap")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "ProcessMachine", Name: "gc-owner"},
			},
		})
		dependent := create(ctx, t, c, ownedSecret("gc-owner-bootstrap", m, clusterv1.GroupVersion.String(), "Machine"))
		deleteAndWaitGone(ctx, t, c, m, dependent)
	})
	t.Run("contents of a namespace", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ns := create(ctx, t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gc-doomed"}})
		create(ctx, t, c, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "content", Namespace: ns.Name}})
		deleteAndWaitGone(ctx, t, c, ns, ns)
	})
}

func create[T client.Object](ctx context.Context, t *testing.T, c client.Client, obj T) T {
	t.Helper()
	if err := c.Create(ctx, obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
	return obj
}

func ownedSecret(name string, owner client.Object, apiVersion, kind string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: owner.GetNamespace(),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: owner.GetName(), UID: owner.GetUID()}}}}
}

// deleteAndWaitGone deletes owner with background propagation, kubectl's
// default, and waits until gone no longer exists.
func deleteAndWaitGone(ctx context.Context, t *testing.T, c client.Client, owner, gone client.Object) {
	t.Helper()
	if err := c.Delete(ctx, owner, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("deleting %s: %v", owner.GetName(), err)
	}
	what := fmt.Sprintf("%T %s to be gone after deleting %s", gone, gone.GetName(), owner.GetName())
	err := testkit.Eventually(ctx, 100*time.Millisecond, what, func(ctx context.Context) error {
		err := c.Get(ctx, client.ObjectKeyFromObject(gone), gone)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("it still exists (owners %v, finalizers %v)", gone.GetOwnerReferences(), gone.GetFinalizers())
	})
	if err != nil {
		t.Fatal(err)
	}
}
