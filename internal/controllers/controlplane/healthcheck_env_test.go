package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qcp-dev/qcp/internal/localenv"
)

// testHealthCheckNames: QCP keeps its MachineHealthCheck under a name of its
// own, not the control plane's, which the topology controller's health
// check has (and deletes by). A health check QCP kept under the control
// plane's name before is replaced; a topology-owned one under that name is
// waited for; a foreign object under QCP's name is left alone, with an error
// that names it.
func testHealthCheckNames(t *testing.T, env *localenv.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newRemediationWorld(t, env, "mhc-names")
	cp := w.controlPlane(ctx)
	spec := healthCheckSpec(w.cluster(ctx), cp, DefaultHealthCheckTimeout)
	mhc := func(name string, labels map[string]string, owners ...metav1.OwnerReference) *clusterv1.MachineHealthCheck {
		return &clusterv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cp.Namespace, Labels: labels, OwnerReferences: owners}, Spec: spec}
	}
	exists := func(name string) *clusterv1.MachineHealthCheck {
		got := &clusterv1.MachineHealthCheck{}
		if err := w.c.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: name}, got); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			t.Fatal(err)
		}
		return got
	}
	ensure := func() (string, error) { return w.r.ensureHealthCheck(ctx, w.cluster(ctx), w.controlPlane(ctx)) }

	// Kept under the control plane's name by an earlier QCP.
	if err := w.c.Create(ctx, mhc(cp.Name, nil, controlPlaneOwnerRef(cp))); err != nil {
		t.Fatal(err)
	}
	if waiting, err := ensure(); err != nil || waiting != "" {
		t.Fatalf("ensureHealthCheck: waiting %q, error %v; want neither", waiting, err)
	}
	if exists(cp.Name) != nil {
		t.Errorf("MachineHealthCheck %s, QCP's under its old name, still exists", cp.Name)
	}
	own := exists(HealthCheckName(cp.Name))
	if own == nil || !metav1.IsControlledBy(own, cp) {
		t.Fatalf("MachineHealthCheck %s: %+v; want one the control plane controls", HealthCheckName(cp.Name), own)
	}
	if !w.sawEvent("HealthCheck", "MachineHealthCheck "+cp.Name+" deleted") {
		t.Errorf("no event says MachineHealthCheck %s was deleted; events: %v", cp.Name, w.events)
	}

	// The topology controller's, under the control plane's name, still there
	// after its class dropped it: QCP waits, and keeps its own as it is.
	if err := w.c.Create(ctx, mhc(cp.Name, map[string]string{clusterv1.ClusterTopologyOwnedLabel: ""})); err != nil {
		t.Fatal(err)
	}
	if waiting, err := ensure(); err != nil || !strings.Contains(waiting, "topology controller to delete MachineHealthCheck "+cp.Name) {
		t.Errorf("ensureHealthCheck beside the topology's health check: waiting %q, error %v; want it to wait for its deletion", waiting, err)
	}
	if exists(cp.Name) == nil {
		t.Errorf("QCP deleted the topology controller's MachineHealthCheck %s", cp.Name)
	}

	// A foreign object under QCP's name.
	if err := w.c.Delete(ctx, mhc(cp.Name, nil)); err != nil {
		t.Fatal(err)
	}
	if err := w.c.Delete(ctx, own); err != nil {
		t.Fatal(err)
	}
	foreign := mhc(HealthCheckName(cp.Name), nil)
	if err := w.c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	if _, err := ensure(); err == nil || !strings.Contains(err.Error(), "MachineHealthCheck named "+foreign.Name+" exists and QCP does not own it") {
		t.Errorf("ensureHealthCheck beside a foreign %s: error %v; want one that names it", foreign.Name, err)
	}
	if got := exists(foreign.Name); got == nil || metav1.IsControlledBy(got, cp) {
		t.Errorf("the foreign MachineHealthCheck %s was taken over or deleted: %+v", foreign.Name, got)
	}
}
