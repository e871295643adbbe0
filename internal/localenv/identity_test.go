package localenv_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestManagerWithoutAPermission: qcp-manager runs as its ServiceAccount with
// the release's roles, so a permission they lack stops it. Taken from a
// copy of the roles, `create` on Machines makes a 1-machine control plane's
// first step fail: no Machine is made, the step's Warning event names the
// missing permission, and the environment's log check reports it.
func TestManagerWithoutAPermission(t *testing.T) {
	// The process provider starts load balancers with the qcp-agent next
	// to the manager.
	bin := t.TempDir()
	if err := testkit.BuildQCP(bin, "qcp-manager", "qcp-agent"); err != nil {
		t.Fatal(err)
	}
	manager := filepath.Join(bin, "qcp-manager")
	env := localenv.StartForTest(t, localenv.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	removed := false
	_, err := env.StartManager(ctx, localenv.ManagerOptions{
		Path:      manager,
		ExtraArgs: []string{"--address-range=127.31.0.0/16"},
		EditRoles: func(roles []rbacv1.ClusterRole) {
			// The rule may name other resources too: they keep its verbs.
			for k := range roles {
				for i, r := range roles[k].Rules {
					if !slices.Contains(r.APIGroups, clusterv1.GroupVersion.Group) || !slices.Contains(r.Resources, "machines") || !slices.Contains(r.Verbs, "create") {
						continue
					}
					machines := *r.DeepCopy()
					machines.Resources = []string{"machines"}
					machines.Verbs = slices.DeleteFunc(machines.Verbs, func(v string) bool { return v == "create" })
					roles[k].Rules[i].Resources = slices.DeleteFunc(slices.Clone(r.Resources), func(res string) bool { return res == "machines" })
					roles[k].Rules = append(roles[k].Rules, machines)
					removed = true
				}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !removed {
		t.Fatal("no rule of the release's roles grants create on machines.cluster.x-k8s.io")
	}
	if found, err := env.ManagerForbidden(); err != nil || len(found) > 0 {
		t.Fatalf("before any control plane: forbidden %v (%v)", found, err)
	}

	const name, ns = "norbac", "default"
	c := env.Client
	pc, qcp, cluster := processCluster(name, ns, name, 1)
	objs := []client.Object{pc, &infrav1.ProcessMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, qcp, cluster}
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T: %v", obj, err)
		}
	}

	const want = `cannot create resource "machines" in API group "cluster.x-k8s.io"`
	var seen []string
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		events := &corev1.EventList{}
		if err := c.List(ctx, events, client.InNamespace(ns), client.MatchingFields{"involvedObject.name": name}); err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range events.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == "StepFailed" && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, want) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		found, _ := env.ManagerForbidden()
		cp := &controlplanev1.QuorumControlPlane{}
		_ = c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cp)
		t.Fatalf("no StepFailed event naming the missing permission (%s): %v; events: %q; refused requests: %q; control plane status: %+v",
			want, err, seen, found, cp.Status)
	}
	machines := &clusterv1.MachineList{}
	if err := c.List(ctx, machines, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(machines.Items) > 0 {
		t.Errorf("%d Machines made without create on machines", len(machines.Items))
	}
	// The event may be recorded before the manager's log line that
	// reports the refusal is written: wait for the line.
	machinesOnly := func(l string) bool { return strings.Contains(l, `cannot create resource \"machines\"`) }
	var found []string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		found, err = env.ManagerForbidden()
		return slices.ContainsFunc(found, machinesOnly), err
	})
	if err != nil {
		t.Errorf("the log check found no refused request to create machines within 30 s of the event (%v); it found %q", err, found)
	}
	// Anything else refused is a permission the release itself lacks.
	for _, l := range slices.DeleteFunc(found, machinesOnly) {
		t.Errorf("refused beyond the permission taken away: %s", l)
	}

}
