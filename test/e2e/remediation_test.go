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
	parallel(t, 5*time.Minute)
	s := newScenario(t, mgmt, "remediate", 3, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Remediation.MaxRetry = ptr.To[int32](1)
	})
	s.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)
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
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: replacement}, &m); err != nil {
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
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: victim}, &m); err != nil {
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
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: victim}, &m); !isNotFound(err) {
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
