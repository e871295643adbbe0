//go:build partitions

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/cli"
	"github.com/qcp-dev/qcp/internal/hostnet"
)

// partitionAddressRange is the partition scenario's machines' network, in
// the range set aside for benchmarking networks (hostnet.DefaultPrefix's),
// on a bridge of its own.
const partitionAddressRange = "198.18.23.0/24"

// partitionCut is how long the old leader stays cut off: well inside the
// health check's timeout (40 s here), so that no check marks the cut
// machine and every machine must stay.
const partitionCut = 25 * time.Second

// The partition scenarios run with `make partitions` (-tags partitions), not
// yet in `make test`: they need a management cluster of their own, and no
// full run of the suite with them has finished yet (docs/testing.md).

// TestPartitionedLeader (issue 37): each machine a network host of its own
// (qcp-manager --machine-network=namespaces), and the etcd leader's
// machine cut off from both peers by `qcpctl machine isolate`, while the
// manager still reaches it, under the writer and the monitor. The majority
// elects a new leader, and QCP's status names it, not the old leader that
// may still call itself leader in an older term; while the cut lasts QCP
// deletes no machine and removes no member. Healed, the old leader is back
// as a healthy voter. Then the new leader is cut one way (--one-way: what
// it sends to its peers is dropped, what they send arrives), which breaks
// its TCP connections both ways, so the outcome must be the same. No
// machine was replaced, and the history is linearizable with nothing
// acknowledged lost.
func TestPartitionedLeader(t *testing.T) {
	requireShared(t)
	if err := hostnet.Available(); err != nil {
		t.Fatalf("network namespaces cannot be made here, and this scenario needs them: %v", err)
	}
	parallel(t, 4*time.Minute)
	// Registered before the management cluster, so that it runs after its
	// machines and their namespaces are gone.
	t.Cleanup(func() {
		if err := hostnet.ForRange(netip.MustParsePrefix(partitionAddressRange)).Remove(); err != nil {
			t.Error(err)
		}
	})
	mgmt := ownManagement(t, partitionAddressRange, []string{"--machine-network=namespaces"})
	s := newScenario(t, mgmt, "partition", 3)
	s.startTraffic(3)
	cp := s.waitAvailable(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	before, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range before {
		if a := internalIP(&m); !netip.MustParsePrefix(partitionAddressRange).Contains(netip.MustParseAddr(a)) {
			t.Fatalf("machine %s has address %s, outside the machines' network %s", m.Name, a, partitionAddressRange)
		}
	}
	cp = s.cutLeader(ctx, cp, "cut off from its peers")
	s.cutLeader(ctx, cp, "cut off one way (what it sends its peers dropped)", "--one-way")
	after := s.settled(2*time.Minute, 3)
	if was, is := machineNames(before), machineNames(after); !slices.Equal(was, is) {
		t.Errorf("machines %v before the cut, %v after it healed: a machine was replaced", was, is)
	}
	s.finish()
}

// cutLeader cuts the etcd leader in cp's status off from its peers with
// `qcpctl machine isolate` and extra flags (what says what that does),
// while the manager still reaches it. The majority must elect another
// leader, which QCP's status names; until partitionCut has passed since
// the cut, QCP names the cut-off member the leader in no round, and keeps
// every member and machine. Healed, every member must be a healthy voter
// again. It returns the control plane then.
func (s *scenario) cutLeader(ctx context.Context, cp *controlplanev1.QuorumControlPlane, what string, extra ...string) *controlplanev1.QuorumControlPlane {
	s.t.Helper()
	leader := leaderMachine(cp)
	if leader == "" {
		s.t.Fatalf("no leader in status.etcd.members %+v", cp.Status.Etcd.Members)
	}
	qcpctl(ctx, s.t, s.mgmt, append([]string{"machine", "isolate", leader}, extra...)...)
	cut := time.Now()
	healed := false
	heal := func() {
		if !healed {
			healed = true
			qcpctl(ctx, s.t, s.mgmt, "machine", "heal", leader)
		}
	}
	defer heal()
	s.eventually(time.Minute, "a new etcd leader among the majority after the leader "+leader+" was "+what, func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if l := leaderMachine(cp); l == "" || l == leader {
			return fmt.Errorf("leader is %q; members %s; last operation %s: %s", l, memberRoles(cp), cp.Status.LastOperation.Kind, cp.Status.LastOperation.Reason)
		}
		return nil
	})
	s.t.Logf("%s %s: a new leader %.1fs after the cut", leader, what, time.Since(cut).Seconds())
	stay := s.machinesStay(3)
	s.holds(max(time.Until(cut.Add(partitionCut)), time.Second), "every machine and member kept, and "+leader+" never taken for the leader, while it is "+what,
		func(ctx context.Context) error {
			cp, err := s.controlPlane(ctx)
			if err != nil {
				return nil // the management cluster's answer, not the control plane's
			}
			var errs []error
			if l := leaderMachine(cp); l == leader {
				errs = append(errs, fmt.Errorf("QCP names %s the leader", leader))
			}
			if n := len(cp.Status.Etcd.Members); n != 3 {
				errs = append(errs, fmt.Errorf("%d members in status, want 3", n))
			}
			return errors.Join(append(errs, stay(ctx))...)
		})
	heal()
	s.eventually(2*time.Minute, "every member a healthy voter once "+leader+" is healed", func(ctx context.Context) error {
		var err error
		if cp, err = s.controlPlane(ctx); err != nil {
			return err
		}
		if len(cp.Status.Etcd.Members) != 3 || slices.ContainsFunc(cp.Status.Etcd.Members, func(m controlplanev1.EtcdMemberStatus) bool {
			return !m.Healthy || m.Role == controlplanev1.EtcdMemberRoleLearner
		}) {
			return fmt.Errorf("members %s", memberRoles(cp))
		}
		return nil
	})
	return cp
}

// qcpctl runs qcpctl with args against mgmt, as a user does, and fails t
// if it fails.
func qcpctl(ctx context.Context, t testing.TB, mgmt *management, args ...string) {
	t.Helper()
	root := cli.NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--kubeconfig", mgmt.env.Kubeconfig}, args...))
	if err := root.ExecuteContext(ctx); err != nil {
		t.Fatalf("qcpctl %v: %v\n%s", args, err, out.String())
	}
	t.Logf("qcpctl %v: %s", args, bytes.TrimSpace(out.Bytes()))
}

// machineNames is the sorted names of ms.
func machineNames(ms []clusterv1.Machine) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

// memberRoles says each member's machine, role and health in cp's status.
func memberRoles(cp *controlplanev1.QuorumControlPlane) string {
	var out []string
	for _, m := range cp.Status.Etcd.Members {
		out = append(out, fmt.Sprintf("%s %s healthy=%t", m.Machine, m.Role, m.Healthy))
	}
	return strings.Join(out, ", ")
}
