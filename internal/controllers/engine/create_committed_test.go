package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/localenv"
)

// TestCreateMachineDecidesByWhatExists is issue 28's controller hole 5: a
// Machine create whose answer is an error may still have committed, at
// once or after the client gave up. CreateMachine must then keep the
// machine's bootstrap data and infrastructure machine, hand the data to
// the Machine, and report it created, leaving exactly one Machine and no
// orphan; a create the API server really refuses must still take both
// away. The faults come from an interceptor around a real API server:
// every write is real, only the answer is changed.
func TestCreateMachineDecidesByWhatExists(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := localenv.StartForTest(t, localenv.Options{})
	base, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "create-owner", Namespace: "default"}}
	tmpl := &infrav1.ProcessMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: "create-tmpl", Namespace: "default"}}
	for _, o := range []client.Object{owner, tmpl} {
		if err := base.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}

	for i, tc := range []struct {
		name string
		// create stands in for the Machine create; commitLate, if it
		// returns a function, is a write the API server finishes later.
		create  func(ctx context.Context, c client.WithWatch, m *clusterv1.Machine) (commitLate func(), err error)
		created bool
	}{
		{"the answer is lost after the write commits", func(ctx context.Context, c client.WithWatch, m *clusterv1.Machine) (func(), error) {
			if err := c.Create(ctx, m); err != nil {
				return nil, err
			}
			return nil, apierrors.NewTimeoutError("the request was committed, but its answer timed out", 1)
		}, true},
		{"the write commits after the client gave up", func(ctx context.Context, c client.WithWatch, m *clusterv1.Machine) (func(), error) {
			late := m.DeepCopy()
			return func() {
				if err := c.Create(context.Background(), late); err != nil {
					t.Errorf("the late write of machine %s: %v", late.Name, err)
				}
			}, context.DeadlineExceeded
		}, true},
		{"the API server refuses it", func(ctx context.Context, c client.WithWatch, m *clusterv1.Machine) (func(), error) {
			bad := m.DeepCopy()
			bad.Spec.ClusterName = ""
			return nil, c.Create(ctx, bad)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster := fmt.Sprintf("create-%d", i)
			// The late write commits once the first look for the Machine
			// has found nothing (the look raced it), or, if nothing looks,
			// after CreateMachine has returned.
			var pending func()
			commit := func() {
				if pending != nil {
					pending()
					pending = nil
				}
			}
			writer := interceptor.NewClient(base, interceptor.Funcs{
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					m, ok := obj.(*clusterv1.Machine)
					if !ok {
						return c.Create(ctx, obj, opts...)
					}
					late, err := tc.create(ctx, c, m)
					pending = late
					return err
				},
			})
			reader := interceptor.NewClient(base, interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					err := c.Get(ctx, key, obj, opts...)
					if _, ok := obj.(*clusterv1.Machine); ok && apierrors.IsNotFound(err) {
						commit()
					}
					return err
				},
			})
			nm := NewMachine{
				Owner: owner, OwnerRef: *metav1.NewControllerRef(owner, corev1.SchemeGroupVersion.WithKind("ConfigMap")),
				Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: cluster, Namespace: "default"}},
				Name:    cluster + "-m", Labels: map[string]string{clusterv1.ClusterNameLabel: cluster},
				// Paused, so that CAPI core leaves the Machine as created.
				Annotations:      map[string]string{clusterv1.PausedAnnotation: ""},
				InfraAnnotations: map[string]string{clusterv1.PausedAnnotation: ""},
				InfraTemplate:    clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachineTemplate", Name: tmpl.Name},
				Version:          "v1.36.3",
				Bootstrap:        bootstrap.NewStacked(cluster, cas, "127.0.9.1:6443", bootstrap.JoinMember("https://127.0.9.2:2379")),
			}
			machine, err := CreateMachine(ctx, writer, reader, nil, nm)
			commit()
			if tc.created {
				if err != nil || machine == nil {
					t.Errorf("CreateMachine: machine %v, error %v; want the machine the write created", machine != nil, err)
				}
				checkOneMachine(ctx, t, base, cluster, nm.Name, owner.UID)
				return
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("CreateMachine: %v, want the API server's refusal of the invalid Machine", err)
			}
			checkNothingLeft(ctx, t, base, cluster)
		})
	}
	// On the same API server: GetTemplate, which CreateMachine clones from.
	t.Run("the template is read from the cache, and live only when the cache lacks it", func(t *testing.T) {
		checkTemplateReads(ctx, t, env.Config, base, tmpl)
	})
}

// checkTemplateReads: with a cache-backed client of unstructured objects,
// as qcp-manager's, GetTemplate reads a template from its informer and asks
// the API server nothing; a template the cache does not have yet (one just
// created) is read live.
func checkTemplateReads(ctx context.Context, t *testing.T, cfg *rest.Config, base client.WithWatch, tmpl *infrav1.ProcessMachineTemplate) {
	informers, err := cache.New(cfg, cache.Options{Scheme: base.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = informers.Start(cctx) }()
	if !informers.WaitForCacheSync(ctx) {
		t.Fatal("the cache did not start")
	}
	cached, err := client.New(cfg, client.Options{Scheme: base.Scheme(), Cache: &client.CacheOptions{Reader: informers, Unstructured: true}})
	if err != nil {
		t.Fatal(err)
	}
	var liveReads atomic.Int32
	live := interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*unstructured.Unstructured); ok {
				liveReads.Add(1) // the template, not its CRD's contract
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	ref := clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachineTemplate", Name: tmpl.Name}
	for range 3 {
		got, err := GetTemplate(ctx, cached, live, ref, tmpl.Namespace)
		if err != nil || got.GetName() != tmpl.Name {
			t.Fatalf("GetTemplate through the cache: %v, %v; want template %s", got, err, tmpl.Name)
		}
	}
	if n := liveReads.Load(); n != 0 {
		t.Errorf("GetTemplate read a template the cache holds %d times from the API server, want 0", n)
	}
	// A cache that has not seen the template yet.
	behind := interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, _ client.WithWatch, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
			if _, ok := obj.(*unstructured.Unstructured); ok {
				return apierrors.NewNotFound(schema.GroupResource{Group: infrav1.GroupVersion.Group, Resource: "processmachinetemplates"}, key.Name)
			}
			return cached.Get(ctx, key, obj)
		},
	})
	got, err := GetTemplate(ctx, behind, live, ref, tmpl.Namespace)
	if err != nil || got.GetName() != tmpl.Name || liveReads.Load() != 1 {
		t.Errorf("GetTemplate with a cache that lacks the template: %v, %v after %d live reads; want it read live once", got, err, liveReads.Load())
	}
	ref.Name = "no-such-template"
	if _, err := GetTemplate(ctx, cached, live, ref, tmpl.Namespace); !apierrors.IsNotFound(err) {
		t.Errorf("GetTemplate of a template that does not exist: %v, want NotFound", err)
	}
}

// checkOneMachine: the cluster has exactly one Machine, name; its bootstrap
// data is handed to it, its infrastructure machine is the one it names and
// is owned by owner (CAPI core takes it over once the Machine is
// unpaused); and no other bootstrap data or infrastructure machine exists.
func checkOneMachine(ctx context.Context, t *testing.T, c client.Client, cluster, name string, owner types.UID) {
	t.Helper()
	inCluster := client.MatchingLabels{clusterv1.ClusterNameLabel: cluster}
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, client.InNamespace("default"), inCluster); err != nil {
		t.Fatal(err)
	}
	if len(machines.Items) != 1 || machines.Items[0].Name != name {
		t.Fatalf("%d machines (%v), want exactly %s", len(machines.Items), namesOf(machines.Items), name)
	}
	m := &machines.Items[0]
	var data corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: *m.Spec.Bootstrap.DataSecretName}, &data); err != nil {
		t.Fatalf("the bootstrap data of machine %s: %v", name, err)
	}
	if ref := metav1.GetControllerOf(&data); ref == nil || ref.Kind != "Machine" || ref.UID != m.UID {
		t.Errorf("the bootstrap data of machine %s is controlled by %+v, want the machine", name, ref)
	}
	var infras infrav1.ProcessMachineList
	if err := c.List(ctx, &infras, client.InNamespace("default"), inCluster); err != nil {
		t.Fatal(err)
	}
	if len(infras.Items) != 1 || infras.Items[0].Name != m.Spec.InfrastructureRef.Name || !infras.Items[0].DeletionTimestamp.IsZero() {
		t.Fatalf("process machines %v, want exactly %s, which machine %s names", infraNames(infras.Items), m.Spec.InfrastructureRef.Name, name)
	}
	if ref := metav1.GetControllerOf(&infras.Items[0]); ref == nil || ref.UID != owner {
		t.Errorf("process machine %s is controlled by %+v, want the machine's owner", infras.Items[0].Name, ref)
	}
	var secrets corev1.SecretList
	if err := c.List(ctx, &secrets, client.InNamespace("default"), inCluster); err != nil {
		t.Fatal(err)
	}
	if len(secrets.Items) != 1 {
		t.Errorf("%d bootstrap data Secrets for cluster %s, want machine %s's alone", len(secrets.Items), cluster, name)
	}
}

// checkNothingLeft: the cluster has no Machine, and no bootstrap data or
// infrastructure machine that is not being deleted.
func checkNothingLeft(ctx context.Context, t *testing.T, c client.Client, cluster string) {
	t.Helper()
	inCluster := client.MatchingLabels{clusterv1.ClusterNameLabel: cluster}
	for _, list := range []client.ObjectList{&clusterv1.MachineList{}, &corev1.SecretList{}, &infrav1.ProcessMachineList{}} {
		if err := c.List(ctx, list, client.InNamespace("default"), inCluster); err != nil {
			t.Fatal(err)
		}
		items, err := apimeta.ExtractList(list)
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, o := range items {
			if o := o.(client.Object); o.GetDeletionTimestamp().IsZero() {
				left = append(left, o.GetName())
			}
		}
		if len(left) > 0 {
			t.Errorf("%T left after a refused create: %v", list, left)
		}
	}
}

func namesOf(ms []clusterv1.Machine) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

func infraNames(ps []infrav1.ProcessMachine) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}
