package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// pauseHold is how long a paused control plane is watched for any action.
const pauseHold = 20 * time.Second

// TestPauseAndDeletion pauses the Cluster in the middle of a scale-up,
// resumes it, and then deletes the control plane while a worker Machine
// exists.
func TestPauseAndDeletion(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, time.Minute+15*time.Second)
	s := newScenario(t, mgmt, "pause", 1)
	s.startTraffic(1)
	s.waitAvailable(convergeTimeout, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s.scale(ctx, 3)
	s.eventually(3*time.Minute, "a second machine", func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil || len(ms) < 2 {
			return fmt.Errorf("%d machines (%v)", len(ms), err)
		}
		return nil
	})
	s.setPaused(ctx, true)
	s.checkNothingMoves(ctx)
	s.setPaused(ctx, false)
	s.waitAvailable(convergeTimeout, 3)
	s.finish()

	s.checkDeletion(ctx)
}

// setPaused sets the Cluster's spec.paused and waits for the control plane
// to report it.
func (s *scenario) setPaused(ctx context.Context, paused bool) {
	s.t.Helper()
	cluster := &clusterv1.Cluster{}
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, cluster); err != nil {
		s.t.Fatal(err)
	}
	before := cluster.DeepCopy()
	cluster.Spec.Paused = ptr.To(paused)
	if err := s.c.Patch(ctx, cluster, client.MergeFrom(before)); err != nil {
		s.t.Fatal(err)
	}
	s.waitPaused(paused)
}

// pauseControlPlane pauses or resumes the control plane alone, with CAPI's
// paused annotation on it: unlike the Cluster's spec.paused, this leaves
// CAPI core's MachineHealthCheck running.
func (s *scenario) pauseControlPlane(ctx context.Context, paused bool) {
	s.t.Helper()
	cp, err := s.controlPlane(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	before := cp.DeepCopy()
	if paused {
		annotations.AddAnnotations(cp, map[string]string{clusterv1.PausedAnnotation: ""})
	} else {
		delete(cp.Annotations, clusterv1.PausedAnnotation)
	}
	if err := s.c.Patch(ctx, cp, client.MergeFrom(before)); err != nil {
		s.t.Fatal(err)
	}
	s.waitPaused(paused)
}

// waitPaused waits for the control plane to report Paused=paused.
func (s *scenario) waitPaused(paused bool) {
	s.t.Helper()
	s.eventually(time.Minute, fmt.Sprintf("Paused=%v on the control plane", paused), func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if conditions.IsTrue(cp, controlplanev1.PausedCondition) != paused {
			return fmt.Errorf("Paused condition %+v", conditions.Get(cp, controlplanev1.PausedCondition))
		}
		return nil
	})
}

// checkNothingMoves watches a paused control plane for pauseHold: no
// Machine is created or deleted, no hook or record changes, and the etcd
// membership (IDs and roles) stays as it is.
func (s *scenario) checkNothingMoves(ctx context.Context) {
	s.t.Helper()
	machinesAt := func() string {
		ms, err := s.machines(ctx)
		if err != nil {
			s.t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			var keys []string
			for k := range m.Annotations {
				if strings.Contains(k, "qcp") {
					keys = append(keys, k+"="+m.Annotations[k])
				}
			}
			slices.Sort(keys)
			out = append(out, fmt.Sprintf("%s deleting=%v %v", m.Name, !m.DeletionTimestamp.IsZero(), keys))
		}
		return strings.Join(out, "; ")
	}
	membersAt := func() string {
		cli := s.traffic.client
		var ms []etcd.Member
		err := retry(ctx, func(ctx context.Context) (err error) { ms, err = cli.Members(ctx); return err })
		if err != nil {
			s.t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			out = append(out, fmt.Sprintf("%x learner=%v", m.ID, m.IsLearner))
		}
		return strings.Join(out, "; ")
	}
	machines, members := machinesAt(), membersAt()
	deadline := time.Now().Add(pauseHold)
	for time.Now().Before(deadline) {
		if now := machinesAt(); now != machines {
			s.t.Fatalf("machines changed while paused:\n was %s\n now %s", machines, now)
		}
		if now := membersAt(); now != members {
			s.t.Fatalf("etcd membership changed while paused:\n was %s\n now %s", members, now)
		}
		select {
		case <-ctx.Done():
			s.t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// checkDeletion deletes the control plane with a worker Machine present:
// it waits, naming the worker, and once the worker is gone every control
// plane Machine, Secret and machine process goes, and then the control
// plane itself.
func (s *scenario) checkDeletion(ctx context.Context) {
	s.t.Helper()
	worker := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: s.name + "-worker", Namespace: ns, Labels: map[string]string{clusterv1.ClusterNameLabel: s.name}},
		Spec: clusterv1.MachineSpec{
			ClusterName: s.name, Version: version, Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(s.name + "-worker-bootstrap")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachine", Name: s.name + "-worker"},
		},
	}
	s.create(ctx, worker)
	cp, err := s.controlPlane(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.c.Delete(ctx, cp); err != nil {
		s.t.Fatal(err)
	}
	s.eventually(time.Minute, "Deleting naming the worker", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		c := conditions.Get(cp, controlplanev1.DeletingCondition)
		if c == nil || c.Reason != controlplanev1.DeletingWaitingForWorkersReason || !strings.Contains(c.Message, worker.Name) {
			return fmt.Errorf("Deleting condition %+v", c)
		}
		return nil
	})
	ms, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range ms {
		if !m.DeletionTimestamp.IsZero() {
			s.t.Errorf("control plane machine %s deleted while worker %s exists", m.Name, worker.Name)
		}
	}
	if err := s.c.Delete(ctx, worker); err != nil {
		s.t.Fatal(err)
	}
	s.eventually(5*time.Minute, "the control plane, its Machines, Secrets and processes gone", func(ctx context.Context) error {
		if _, err := s.controlPlane(ctx); !isNotFound(err) {
			return fmt.Errorf("QuorumControlPlane still there (%v)", err)
		}
		if ms, err := s.machines(ctx); err != nil || len(ms) > 0 {
			return fmt.Errorf("%d control plane machines left (%v)", len(ms), err)
		}
		var secrets corev1.SecretList
		if err := s.reader(ctx).List(ctx, &secrets, client.InNamespace(ns), client.MatchingLabels{clusterv1.ClusterNameLabel: s.name}); err != nil {
			return err
		}
		if len(secrets.Items) > 0 {
			var names []string
			for _, sec := range secrets.Items {
				names = append(names, sec.Name)
			}
			return fmt.Errorf("Secrets left: %v", names)
		}
		if procs := machineProcesses(s.mgmt, s.name); len(procs) > 0 {
			return fmt.Errorf("machine processes left: %v", procs)
		}
		return nil
	})
}

// retry calls f until it succeeds or ctx ends, for reads that may meet a
// leader election.
func retry(ctx context.Context, f func(context.Context) error) error {
	var err error
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = f(rctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// machineProcesses lists the processes of cluster's machines on mgmt,
// found by their directories on the command line. The load balancer is the
// ProcessCluster's, not the control plane's, and stays with the Cluster.
func machineProcesses(mgmt *management, cluster string) []string {
	procs, err := machinehost.ProcessesMatching(filepath.Join(mgmt.env.MachineRoot(), ns, cluster+"-"))
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var out []string
	for _, p := range procs {
		out = append(out, fmt.Sprintf("%s (pid %d)", p.Comm, p.PID))
	}
	return out
}
