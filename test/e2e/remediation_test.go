package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/controlplane"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// TestRemediation kills one machine of 3 (scenarios 1 and 4): QCP's own
// MachineHealthCheck marks it, QCP removes its member, deletes it and
// replaces it, back to 3 healthy voters; a rollout that started while it
// was down waits for that, and then completes. With maxRetry 1, the
// replacement failing too is a retry and is remediated; the next
// replacement failing is not, and the machine and the control plane say
// why.
func TestRemediation(t *testing.T) {
	mgmt := requireShared(t)
	t.Parallel()
	s := newScenario(t, mgmt, "remediate", 3, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Remediation.MaxRetry = ptr.To[int32](1)
	})
	s.startTraffic(3)
	s.waitAvailable(5*time.Minute, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	host := &machinehost.Host{Root: mgmt.env.MachineRoot()}

	machines, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := machines[0].Name
	s.checkRemediationBeforeRollout(ctx, host, victim)
	replacement := s.replacementOf(ctx, victim)
	t.Logf("machine %s, down while a rollout waited, replaced by %s", victim, replacement)

	// The replacement failing is the chain's first retry.
	victim = replacement
	for retry := 1; retry <= 1; retry++ {
		start := time.Now()
		if err := host.Kill(ns, victim); err != nil {
			t.Fatal(err)
		}
		replacement := s.waitRemediated(victim)
		t.Logf("remediation %d: machine %s killed, replaced by %s, 3 healthy voters after %s", retry, victim, replacement, time.Since(start).Round(time.Second))
		if got := s.replacementOf(ctx, victim); got != replacement {
			t.Errorf("machine %s records replacing %s; want %s", got, victim, replacement)
		}
		var m clusterv1.Machine
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: replacement}, &m); err != nil {
			t.Fatal(err)
		}
		if record := m.Annotations[controlplane.RemediationForAnnotation]; !strings.Contains(record, fmt.Sprintf(`"retryCount":%d`, retry)) {
			t.Errorf("replacement %s records %q, want it replacing %s after %d retries", replacement, record, victim, retry)
		}
		victim = replacement
	}

	// The third failure in the chain: maxRetry 1 is used up.
	if err := host.Kill(ns, victim); err != nil {
		t.Fatal(err)
	}
	s.eventually(4*time.Minute, "the remediation of "+victim+" refused, on the machine and the control plane", func(ctx context.Context) error {
		var m clusterv1.Machine
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim}, &m); err != nil {
			return err
		}
		if msg := conditions.GetMessage(&m, clusterv1.MachineOwnerRemediatedCondition); !strings.Contains(msg, "maxRetry (1) is used up") {
			return fmt.Errorf("machine %s's OwnerRemediated says %q", victim, msg)
		}
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		c := conditions.Get(cp, controlplanev1.RemediatingCondition)
		if c == nil || c.Reason != controlplanev1.RemediationBlockedReason || !strings.Contains(c.Message, victim) {
			return fmt.Errorf("Remediating is %+v", c)
		}
		return nil
	})
	// Refused means left alone: the machine and its member stay.
	cp, err := s.controlPlane(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(cp.Status.Etcd.Members, func(m controlplanev1.EtcdMemberStatus) bool { return m.Machine == victim }) {
		t.Errorf("the member of %s was removed although its remediation was refused", victim)
	}
	if got := s.bound.machinesSeen(); got != 7 {
		t.Errorf("%d machines existed in all, want 7 (3, two rolled out, two replacements)", got)
	}
	s.finish()
}

// checkRemediationBeforeRollout is scenario 4: victim is down when a
// rollout starts, so the rollout waits for its member; once the health
// check marks it, its remediation goes first, its replacement is built to
// the new spec, and then the rollout completes, replacing each other
// machine once.
func (s *scenario) checkRemediationBeforeRollout(ctx context.Context, host *machinehost.Host, victim string) {
	s.t.Helper()
	if err := host.Kill(ns, victim); err != nil {
		s.t.Fatal(err)
	}
	s.eventually(2*time.Minute, "the member of "+victim+" reported unhealthy", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(cp.Status.Etcd.Members, func(m controlplanev1.EtcdMemberStatus) bool { return m.Machine == victim && !m.Healthy }) {
			return nil
		}
		return fmt.Errorf("members %+v", cp.Status.Etcd.Members)
	})
	s.rollOut(func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Etcd.Stacked.ExtraArgs = append(cp.Spec.Etcd.Stacked.ExtraArgs, controlplanev1.Arg{Name: "snapshot-count", Value: "20000"})
	}, nil)
	if gone := s.bound.departures(); len(gone) == 0 || gone[0] != victim {
		s.t.Errorf("machines left in the order %v; want %s, the unhealthy one, first", gone, victim)
	}
	if got := s.bound.machinesSeen(); got != 6 {
		s.t.Errorf("%d machines existed in all, want 6: each of 3 replaced once, the remediated one included", got)
	}
}

// replacementOf is the machine that records replacing victim.
func (s *scenario) replacementOf(ctx context.Context, victim string) string {
	s.t.Helper()
	ms, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range ms {
		if strings.Contains(m.Annotations[controlplane.RemediationForAnnotation], fmt.Sprintf(`"machine":%q`, victim)) {
			return m.Name
		}
	}
	s.t.Fatalf("no machine records replacing %s", victim)
	return ""
}

// waitRemediated waits until victim is gone and 3 healthy voters run, and
// returns the machine that replaced it.
func (s *scenario) waitRemediated(victim string) string {
	s.t.Helper()
	before, err := s.machines(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	s.eventually(6*time.Minute, "machine "+victim+" remediated", func(ctx context.Context) error {
		var m clusterv1.Machine
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim}, &m); !isNotFound(err) {
			cp, _ := s.controlPlane(ctx)
			return fmt.Errorf("machine %s still there (%v); Remediating: %s", victim, err, conditions.GetMessage(cp, controlplanev1.RemediatingCondition))
		}
		return nil
	})
	s.waitAvailable(4*time.Minute, 3)
	after, err := s.machines(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range after {
		if !slices.ContainsFunc(before, func(b clusterv1.Machine) bool { return b.Name == m.Name }) {
			return m.Name
		}
	}
	s.t.Fatalf("no new machine replaced %s", victim)
	return ""
}

// TestFrozenMachines freezes machines as hung hosts freeze (SIGSTOP to all
// of a machine's processes). First the etcd leader's machine (#8465): the
// others elect a new leader and QCP remediates the frozen machine. Then 2
// of 3 (scenario 2): etcd has no quorum, so QCP takes no destructive step,
// says why, and waits; once one is thawed, it remediates the other.
func TestFrozenMachines(t *testing.T) {
	mgmt := requireShared(t)
	t.Parallel()
	s := newScenario(t, mgmt, "frozen", 3)
	s.startTraffic(3)
	cp := s.waitAvailable(5*time.Minute, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	host := &machinehost.Host{Root: mgmt.env.MachineRoot()}
	freeze := func(name string) {
		t.Helper()
		if err := host.Freeze(ns, name); err != nil {
			t.Fatal(err)
		}
		// A failed check must not leave stopped processes behind.
		t.Cleanup(func() { _ = host.Thaw(ns, name) })
	}

	// The leader's machine.
	leader := leaderMachine(cp)
	if leader == "" {
		t.Fatalf("no leader in status.etcd.members %+v", cp.Status.Etcd.Members)
	}
	freeze(leader)
	s.eventually(2*time.Minute, "a new etcd leader elected after "+leader+" froze", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if l := leaderMachine(cp); l == "" || l == leader {
			return fmt.Errorf("leader is %q", l)
		}
		return nil
	})
	replacement := s.waitRemediated(leader)
	t.Logf("frozen leader %s replaced by %s", leader, replacement)

	// Two of three: the one left frozen is not the replacement, whose
	// remediation would count as a retry of the first.
	machines, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var others []string
	for _, m := range machines {
		if m.Name != replacement {
			others = append(others, m.Name)
		}
	}
	thawed, stays := replacement, others[0]
	freeze(thawed)
	freeze(stays)
	s.eventually(2*time.Minute, "QCP reporting that it cannot act without quorum", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		op := cp.Status.LastOperation
		if op.Kind != controlplanev1.OperationDegraded || !strings.Contains(op.Reason, thawed) || !strings.Contains(op.Reason, stays) {
			return fmt.Errorf("last operation %s: %s", op.Kind, op.Reason)
		}
		if !conditions.IsFalse(cp, controlplanev1.AvailableCondition) {
			return fmt.Errorf("Available is %s", conditions.GetMessage(cp, controlplanev1.AvailableCondition))
		}
		return nil
	})
	cp, err = s.controlPlane(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("with %s and %s frozen: %s", thawed, stays, cp.Status.LastOperation.Reason)
	// Nothing destructive for longer than the health check's timeout: no
	// machine deleted, and after the thaw every member still there.
	s.holds(time.Minute+controlplane.DefaultHealthCheckTimeout, "no machine deleted while etcd has no quorum", func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return nil // the management cluster's answer, not the control plane's
		}
		if len(ms) != 3 {
			return fmt.Errorf("%d machines", len(ms))
		}
		for _, m := range ms {
			if !m.DeletionTimestamp.IsZero() {
				return fmt.Errorf("machine %s deleted", m.Name)
			}
		}
		return nil
	})
	if err := host.Thaw(ns, thawed); err != nil {
		t.Fatal(err)
	}
	var members []etcd.Member
	if err := retry(ctx, func(ctx context.Context) (err error) { members, err = s.traffic.client.Members(ctx); return err }); err != nil {
		t.Fatal(err)
	}
	if len(members) != 3 {
		t.Errorf("after the thaw etcd lists %d members, want the 3 it had: a member was removed without quorum", len(members))
	}
	s.waitRemediated(stays)
	s.finish()
}

// leaderMachine is the machine of the etcd leader in cp's status.
func leaderMachine(cp *controlplanev1.QuorumControlPlane) string {
	for _, m := range cp.Status.Etcd.Members {
		if m.Role == controlplanev1.EtcdMemberRoleLeader {
			return m.Machine
		}
	}
	return ""
}
