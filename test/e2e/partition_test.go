package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/process"
)

// partitionAddressRange is the partition scenario's machines' network, in
// the range set aside for benchmarking networks (hostnet.DefaultPrefix's),
// on a bridge of its own.
const partitionAddressRange = "198.18.23.0/24"

// partitionCut is how long the old leader stays cut off: well inside the
// health check's timeout (40 s here) and partitionMemberTimeout, so that
// no check marks the cut machine and every machine must stay.
const partitionCut = 25 * time.Second

// partitionMemberTimeout is the partition scenario's manager's
// --unhealthy-member-timeout: longer than every cut of a member its peers
// cannot reach (partitionCut, and the seconds it takes to rejoin), so
// that none of those is replaced, and short enough that a member cut off
// from the manager alone outlasts it within the scenario. A user sets it
// the same way; the default, 5 minutes, would only make the scenario
// longer.
const partitionMemberTimeout = 50 * time.Second

// TestPartitionedControlPlane (issue 37): each machine a network host of
// its own (qcp-manager --machine-network=namespaces), under the writer and
// the monitor, cut off three ways with `qcpctl machine isolate`:
//   - The etcd leader's machine, from both peers, while the manager still
//     reaches it. The majority elects a new leader, and QCP's status names
//     it, not the old leader that may still call itself leader in an older
//     term; while the cut lasts QCP deletes no machine and removes no
//     member. Healed, the old leader is back as a healthy voter.
//   - The new leader, one way (--one-way: what it sends to its peers is
//     dropped, what they send arrives), which breaks its TCP connections
//     both ways, so the outcome must be the same.
//   - A follower, from the manager alone (--from manager), its peers fine,
//     for longer than the manager's unhealthy-member timeout. QCP sees, from
//     the machine's own report through the workload cluster, that its etcd
//     answers there, and replaces nothing.
//
// No machine was replaced by then. Last, a follower is cut off from its
// peers while a rollout is asked for: the rollout takes no step while the
// cut lasts, naming the cut member, and finishes once it is healed. The
// history is linearizable with nothing acknowledged lost.
func TestPartitionedControlPlane(t *testing.T) {
	requireShared(t)
	parallel(t, 9*time.Minute)
	mgmt := ownNetworkedManagement(t, partitionAddressRange, []string{"--unhealthy-member-timeout=" + partitionMemberTimeout.String()})
	s := newScenario(t, mgmt, "partition", 3)
	s.startTraffic(3)
	cp := s.waitAvailable(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	before, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range before {
		if a := internalIP(&m); !netip.MustParsePrefix(partitionAddressRange).Contains(netip.MustParseAddr(a)) {
			t.Fatalf("machine %s has address %s, outside the machines' network %s", m.Name, a, partitionAddressRange)
		}
		pm := &infrav1.ProcessMachine{}
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: m.Spec.InfrastructureRef.Name}, pm); err != nil {
			t.Fatal(err)
		}
		if c := conditions.Get(pm, process.OwnNetworkCondition); c == nil || c.Status != metav1.ConditionTrue || c.Reason != process.NetworkNamespaceReason {
			t.Errorf("ProcessMachine %s: OwnNetwork = %+v; want True, %s", pm.Name, c, process.NetworkNamespaceReason)
		}
	}
	cp = s.cutLeader(ctx, cp, "cut off from its peers")
	cp = s.cutLeader(ctx, cp, "cut off one way (what it sends its peers dropped)", "--one-way")
	cp = s.cutFromManager(ctx, cp)
	after := s.settled(2*time.Minute, 3)
	if was, is := machineNames(before), machineNames(after); !slices.Equal(was, is) {
		t.Errorf("machines %v before the cuts, %v after they healed: a machine was replaced", was, is)
	}
	s.cutDuringRollout(ctx, cp)
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
	cut, heal := s.isolate(ctx, leader, extra...)
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
	return s.healthyVoters(leader)
}

// cutFromManager cuts a follower's machine off from the management host
// alone (`qcpctl machine isolate --from manager`): QCP, and the tests'
// writer and monitor, cannot reach it; its peers can. QCP must see, from
// the machine's Node, that its etcd answers there, and keep every member
// and machine for
// partitionMemberTimeout (the unhealthy-member timeout of this management
// cluster's manager) and partitionCut more: before, it replaced a member it
// could not reach once that timeout had passed, whatever its peers saw.
// Healed, every member is a healthy voter again.
func (s *scenario) cutFromManager(ctx context.Context, cp *controlplanev1.QuorumControlPlane) *controlplanev1.QuorumControlPlane {
	s.t.Helper()
	var follower string
	for _, m := range cp.Status.Etcd.Members {
		if m.Role == controlplanev1.EtcdMemberRoleVoter {
			follower = m.Machine
			break
		}
	}
	if follower == "" {
		s.t.Fatalf("no follower in status.etcd.members: %s", memberRoles(cp))
	}
	cut, heal := s.isolate(ctx, follower, "--from", "manager")
	defer heal()
	s.eventually(time.Minute, "QCP sees that "+follower+"'s etcd answers there, cut off from the manager alone", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		msg := conditions.GetMessage(cp, controlplanev1.EtcdClusterHealthyCondition)
		if !strings.Contains(msg, "(machine "+follower+"): does not answer QCP, but its machine says it answers there") {
			return fmt.Errorf("%s: %q", controlplanev1.EtcdClusterHealthyCondition, msg)
		}
		return nil
	})
	s.t.Logf("%s cut off from the manager: QCP saw its machine's word %.1fs after the cut", follower, time.Since(cut).Seconds())
	stay := s.machinesStay(3)
	s.holds(time.Until(cut.Add(partitionMemberTimeout+partitionCut)), "every machine and member kept while "+follower+
		" is cut off from the manager alone, past the unhealthy-member timeout", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return nil // the management cluster's answer, not the control plane's
		}
		var errs []error
		if n := len(cp.Status.Etcd.Members); n != 3 {
			errs = append(errs, fmt.Errorf("%d members in status, want 3: %s", n, memberRoles(cp)))
		}
		return errors.Join(append(errs, stay(ctx))...)
	})
	heal()
	return s.healthyVoters(follower)
}

// cutDuringRollout asks for a rollout (spec.rollout.after) while a
// follower is cut off from its peers, the manager still reaching it: a
// minority of the control plane. For partitionCut the rollout must take no
// step (no machine created or deleted, no member added or removed), since
// each would lean on the cut member or lower what etcd survives, and QCP
// must name the cut member as what it waits for. Healed, the rollout
// finishes: every machine replaced by an up-to-date one.
func (s *scenario) cutDuringRollout(ctx context.Context, cp *controlplanev1.QuorumControlPlane) {
	s.t.Helper()
	var follower string
	var members []string
	for _, m := range cp.Status.Etcd.Members {
		members = append(members, m.ID)
		if follower == "" && m.Role == controlplanev1.EtcdMemberRoleVoter {
			follower = m.Machine
		}
	}
	slices.Sort(members)
	if follower == "" {
		s.t.Fatalf("no follower in status.etcd.members: %s", memberRoles(cp))
	}
	s.rollOutBy(func(actx context.Context) {
		before, err := s.machines(actx)
		if err != nil {
			s.t.Fatal(err)
		}
		cut, heal := s.isolate(ctx, follower)
		defer heal()
		s.eventually(time.Minute, "etcd has no leader on "+follower+", cut off from its peers", func(ctx context.Context) error {
			cp, err := s.controlPlane(ctx)
			if err != nil {
				return err
			}
			for _, m := range cp.Status.Etcd.Members {
				if m.Machine == follower && m.Healthy {
					return fmt.Errorf("members %s", memberRoles(cp))
				}
			}
			return nil
		})
		gen := s.patchControlPlane(actx, func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Rollout.After = metav1.Now() })
		named := false
		s.holds(max(time.Until(cut.Add(partitionCut)), 10*time.Second), "no rollout step while "+follower+" is cut off from its peers",
			func(ctx context.Context) error {
				cp, err := s.controlPlane(ctx)
				if err != nil {
					return nil // the management cluster's answer, not the control plane's
				}
				var ids []string
				for _, m := range cp.Status.Etcd.Members {
					ids = append(ids, m.ID)
				}
				slices.Sort(ids)
				var errs []error
				if !slices.Equal(ids, members) {
					errs = append(errs, fmt.Errorf("members %v, were %v: a membership step during the cut", ids, members))
				}
				if cp.Status.ObservedGeneration >= gen && strings.Contains(cp.Status.LastOperation.Reason, follower) {
					named = true
				}
				ms, err := s.machines(ctx)
				if err == nil && !slices.Equal(machineNames(ms), machineNames(before)) {
					errs = append(errs, fmt.Errorf("machines %v, were %v: a machine step during the cut", machineNames(ms), machineNames(before)))
				}
				return errors.Join(errs...)
			})
		if !named {
			s.t.Errorf("QCP's last operation never named %s, the cut member its rollout waits for", follower)
		}
		heal()
	}, nil)
}

// isolate cuts machine off with `qcpctl machine isolate` and the flags in
// extra. It returns when, and a heal that runs `qcpctl machine heal` once,
// however often it is called.
func (s *scenario) isolate(ctx context.Context, machine string, extra ...string) (time.Time, func()) {
	s.t.Helper()
	qcpctl(ctx, s.t, s.mgmt, append([]string{"machine", "isolate", machine}, extra...)...)
	cut := time.Now()
	healed := false
	return cut, func() {
		if !healed {
			healed = true
			qcpctl(ctx, s.t, s.mgmt, "machine", "heal", machine)
		}
	}
}

// healthyVoters waits until every member in the control plane's status is
// a healthy voter once machine is healed, and returns the control plane.
func (s *scenario) healthyVoters(machine string) *controlplanev1.QuorumControlPlane {
	s.t.Helper()
	var cp *controlplanev1.QuorumControlPlane
	s.eventually(2*time.Minute, "every member a healthy voter once "+machine+" is healed", func(ctx context.Context) error {
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
