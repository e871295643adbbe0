package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
)

// TestVersionUpgradeAndRollouts upgrades 3 machines from the previous
// Kubernetes minor to the pinned one with maxSurge 1: never more than 4
// machines, leadership moved off each leader's machine before it goes,
// status.version the lowest version while the rollout runs, and every API
// server on the new version at the end, with kubeadm-config and the addons
// following (the addons once the last machine is upgraded). The same control plane then rolls
// out for rollout.after and for certificate expiry (one cluster, not three:
// creating each costs minutes of the suite's time).
func TestVersionUpgradeAndRollouts(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 2*time.Minute, "kube-previous")
	requirePreviousKube(t, mgmt)
	from := binaries.PreviousKubeVersion
	s := newScenario(t, mgmt, "upgrade", 3, withoutAutorepair, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Version = from
		cp.Spec.CertificateValidityPeriodDays = ptr.To[int32](10)
	})
	s.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)
	s.checkAPIServerVersions(from)
	s.checkWorkloadVersions(from)

	start := time.Now()
	sawLowest := false
	s.rollOut(func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Version = version }, func(cp *controlplanev1.QuorumControlPlane, ms []clusterv1.Machine) error {
		newer := slices.ContainsFunc(ms, func(m clusterv1.Machine) bool { return m.Spec.Version == version })
		older := slices.ContainsFunc(ms, func(m clusterv1.Machine) bool { return m.Spec.Version == from && m.DeletionTimestamp.IsZero() })
		if newer && older {
			if cp.Status.Version != from && cp.Status.Version != "" {
				return fmt.Errorf("status.version is %s while machines still run %s", cp.Status.Version, from)
			}
			sawLowest = sawLowest || cp.Status.Version == from
		}
		return nil
	})
	t.Logf("upgrade of 3 machines took %s", time.Since(start).Round(time.Second))
	if !sawLowest {
		t.Error("status.version never showed the lowest version while old and new machines ran side by side")
	}
	s.checkAPIServerVersions(version)
	s.checkWorkloadVersions(version)
	s.checkLeaderMovedBeforeRemoval()
	s.checkRolloutAfterAndCertificateExpiry()
	s.finish()
}

// withoutAutorepair turns the control plane's health check off, for the
// rollout scenarios, which count the machines replaced and the machines up
// to date: on a CPU-starved host the check has marked a live machine (one
// just promoted, its components slow to report), and its replacement was a
// machine those counts did not expect. Remediation has scenarios of its own.
func withoutAutorepair(cp *controlplanev1.QuorumControlPlane) {
	cp.Spec.Remediation.Autorepair = ptr.To(false)
}

// TestTemplateRolloutWithoutSurgeThenOnDelete rolls 3 machines to a new
// infrastructure template with maxSurge 0: each machine goes before its
// replacement comes, so there are never more than 3. The same control
// plane then switches to OnDelete (see checkOnDelete).
func TestTemplateRolloutWithoutSurgeThenOnDelete(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, time.Minute+25*time.Second)
	s := newScenario(t, mgmt, "nosurge", 3, withoutAutorepair, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge = ptr.To[int32](0)
		cp.Spec.Etcd.Stacked.ExtraArgs = []controlplanev1.Arg{{Name: "snapshot-count", Value: "10000"}}
	})
	s.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s.create(ctx, &infrav1.ProcessMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: s.name + "-v2", Namespace: ns}})
	s.rollOut(func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.MachineTemplate.Spec.InfrastructureRef.Name = s.name + "-v2"
	}, nil)
	machines, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		if !strings.HasPrefix(m.Spec.InfrastructureRef.Name, s.name+"-") {
			t.Errorf("machine %s's infrastructure is %s", m.Name, m.Spec.InfrastructureRef.Name)
		}
		var pm infrav1.ProcessMachine
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: m.Spec.InfrastructureRef.Name}, &pm); err != nil {
			t.Fatal(err)
		}
		if got := pm.Annotations[clusterv1.TemplateClonedFromNameAnnotation]; got != s.name+"-v2" {
			t.Errorf("machine %s was cloned from template %q, want %s-v2", m.Name, got, s.name)
		}
	}
	s.checkOnDelete()
	s.finish()
}

// checkRolloutAfterAndCertificateExpiry: rollout.after set to now rolls
// every machine once and only once; then machines whose certificates
// (issued for 10 days) are within a 20-day threshold are rolled, and
// their replacements, issued for 30 days, are not.
func (s *scenario) checkRolloutAfterAndCertificateExpiry() {
	s.t.Helper()
	t := s.t
	seen := s.bound.machinesSeen()
	// rollout.after: every machine once.
	s.rollOut(func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Rollout.After = metav1.Now() }, nil)
	if got := s.bound.machinesSeen(); got != seen+3 {
		t.Errorf("rollout.after: %d machines existed in all, want %d (each of 3 replaced once)", got, seen+3)
	}

	// Certificates: the replacements were issued for 10 days as well.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s.eventually(2*time.Minute, "every machine's certificate expiry recorded", func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			expiry, err := time.Parse(time.RFC3339, m.Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation])
			if err != nil {
				return fmt.Errorf("machine %s: %v", m.Name, err)
			}
			if left := time.Until(expiry); left < 9*24*time.Hour || left > 10*24*time.Hour {
				return fmt.Errorf("machine %s's certificates expire in %s, want 10 days", m.Name, left.Round(time.Hour))
			}
		}
		return nil
	})
	s.rollOut(func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.CertificateValidityPeriodDays = ptr.To[int32](30)
		cp.Spec.Rollout.Before.CertificatesExpiryDays = ptr.To[int32](20)
	}, nil)
	if got := s.bound.machinesSeen(); got != seen+6 {
		t.Errorf("certificate expiry: %d machines existed in all, want %d (each of 3 replaced once more)", got, seen+6)
	}
	ms, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		expiry, _ := time.Parse(time.RFC3339, m.Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation])
		if left := time.Until(expiry); left < 29*24*time.Hour {
			t.Errorf("machine %s's certificates expire in %s, want 30 days", m.Name, left.Round(time.Hour))
		}
	}
}

// checkOnDelete switches the control plane to OnDelete: a spec change
// alone replaces nothing; deleting 2 of 3 machines at once replaces them
// one at a time, and the API server answers throughout.
func (s *scenario) checkOnDelete() {
	s.t.Helper()
	t := s.t
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s.patchControlPlane(ctx, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Rollout.Strategy = controlplanev1.RolloutStrategy{Type: controlplanev1.OnDelete}
	})
	// A user's deletions do not wait for replacements: the deleted
	// machines and one replacement may exist together.
	s.bound.setSurge(1)
	seen := s.bound.machinesSeen()
	before, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// A spec change: every machine outdated, none replaced.
	generation := s.patchControlPlane(ctx, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Etcd.Stacked.ExtraArgs[0].Value = "20000"
	})
	s.eventually(2*time.Minute, "every machine reported outdated", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if cp.Status.ObservedGeneration < generation || ptr.Deref(cp.Status.UpToDateReplicas, -1) != 0 {
			return fmt.Errorf("observed generation %d of %d, %d up to date", cp.Status.ObservedGeneration, generation, ptr.Deref(cp.Status.UpToDateReplicas, -1))
		}
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if msg := conditions.GetMessage(&m, clusterv1.MachineUpToDateCondition); !strings.Contains(msg, "etcd extra args changed") {
				return fmt.Errorf("machine %s's UpToDate message is %q", m.Name, msg)
			}
		}
		return nil
	})
	s.waitAvailable(time.Minute, 3)
	if got := s.bound.machinesSeen(); got != seen {
		t.Fatalf("OnDelete replaced machines nobody deleted: %d machines existed, %d before", got, seen)
	}

	// Two machines deleted at once: replaced one at a time.
	probe := s.startAPIProbe(false)
	for _, m := range before[:2] {
		if err := s.c.Delete(ctx, &m); err != nil {
			t.Fatal(err)
		}
	}
	s.eventually(8*time.Minute, "both deleted machines replaced", func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		joining := 0
		for _, m := range ms {
			if slices.ContainsFunc(before[:2], func(b clusterv1.Machine) bool { return b.Name == m.Name }) {
				return fmt.Errorf("machine %s still there", m.Name)
			}
			if !conditions.IsTrue(&m, clusterv1.MachineReadyCondition) {
				joining++
			}
		}
		if joining > 1 {
			t.Fatalf("%d replacements joining at once; OnDelete replaces one at a time", joining)
		}
		return nil
	})
	s.waitAvailable(3*time.Minute, 3)
	// The API server answers throughout: no gap longer than the bound
	// issue 12 sets for the workload API during an etcd upgrade. A
	// deleted machine leaves the load balancer, which closes its
	// connections, before its member is removed.
	gap := probe.stop()
	t.Logf("longest time the API server did not answer while 2 machines were replaced: %s", gap)
	if gap > maxAPIGap {
		t.Errorf("the API server went %s without answering while 2 machines were replaced, more than %s", gap.Round(time.Millisecond), maxAPIGap)
	}
}

// maxAPIGap is the longest a client polling the workload API may go
// without an answer while the control plane changes.
const maxAPIGap = 5 * time.Second

// TestRebalancing starts 3 machines in one failure domain, then offers
// three: the control plane moves two of them, one at a time, and ends with
// one machine per domain, saying meanwhile that it is rebalancing.
func TestRebalancing(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 55*time.Second)
	s := newScenarioIn(t, mgmt, "rebalance", 3, failureDomains[:1], withoutAutorepair)
	s.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	var pc infrav1.ProcessCluster
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, &pc); err != nil {
		t.Fatal(err)
	}
	orig := pc.DeepCopy()
	pc.Spec.FailureDomains = failureDomains
	if err := s.c.Patch(ctx, &pc, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	sawRebalancing := false
	s.eventually(10*time.Minute, "one machine per failure domain", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if c := conditions.Get(cp, controlplanev1.RollingOutCondition); c != nil && c.Reason == controlplanev1.RebalancingReason &&
			strings.Contains(c.Message, "holds") {
			sawRebalancing = true
		}
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		if got := domainCounts(ms); !slices.Equal(got, []int{1, 1, 1}) {
			return fmt.Errorf("machines spread %v over fd-a, fd-b, fd-c", got)
		}
		return nil
	})
	s.waitAvailable(3*time.Minute, 3)
	if !sawRebalancing {
		t.Error("the RollingOut condition never said the control plane was rebalancing failure domains")
	}
	if got := s.bound.machinesSeen(); got != 5 {
		t.Errorf("%d machines existed in all, want 5 (two moved)", got)
	}
	s.finish()
}

// rollOut applies change to the control plane and waits until every
// machine that existed before has been replaced by an up-to-date one and
// the control plane is Available again. during, if set, is checked on
// every poll.
func (s *scenario) rollOut(change func(*controlplanev1.QuorumControlPlane), during func(*controlplanev1.QuorumControlPlane, []clusterv1.Machine) error) {
	s.t.Helper()
	s.rollOutBy(func(ctx context.Context) { s.patchControlPlane(ctx, change) }, during)
}

// rollOutBy is rollOut for a change that apply makes, to the control plane
// or to what it is made from.
func (s *scenario) rollOutBy(apply func(context.Context), during func(*controlplanev1.QuorumControlPlane, []clusterv1.Machine) error) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	apply(ctx)
	// 5 minutes a machine: a fresh-clone run on a loaded 2-core machine took
	// 3.5 minutes a machine, and its 10-minute wait ran out on the third.
	s.eventually(time.Duration(len(before))*5*time.Minute, "every machine rolled out", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		if during != nil {
			if err := during(cp, ms); err != nil {
				s.t.Fatal(err)
			}
		}
		for _, m := range ms {
			if slices.ContainsFunc(before, func(b clusterv1.Machine) bool { return b.Name == m.Name }) {
				return fmt.Errorf("machine %s not replaced yet; last operation %s %s: %s", m.Name,
					cp.Status.LastOperation.Kind, cp.Status.LastOperation.Target, cp.Status.LastOperation.Reason)
			}
		}
		if got := ptr.Deref(cp.Status.UpToDateReplicas, 0); got != int32(len(before)) {
			return fmt.Errorf("%d machines up to date, want %d", got, len(before))
		}
		return nil
	})
	s.waitAvailable(3*time.Minute, len(before))
}

// patchControlPlane changes the control plane's spec and returns the new
// generation.
func (s *scenario) patchControlPlane(ctx context.Context, change func(*controlplanev1.QuorumControlPlane)) int64 {
	s.t.Helper()
	cp := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.name}}
	patchObject(ctx, s, cp, change)
	return cp.Generation
}

// patchObject reads obj (named by its namespace and name), changes it with
// edit and merge-patches the difference, failing the scenario on an error.
func patchObject[T client.Object](ctx context.Context, s *scenario, obj T, edit func(T)) {
	s.t.Helper()
	if err := s.reader(ctx).Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		s.t.Fatal(err)
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	edit(obj)
	if err := s.c.Patch(ctx, obj, patch); err != nil {
		s.t.Fatalf("patching %T %s: %v", obj, obj.GetName(), err)
	}
}

// checkAPIServerVersions asks every machine's own API server for its
// version.
func (s *scenario) checkAPIServerVersions(want string) {
	s.t.Helper()
	s.eventually(time.Minute, "every API server reporting "+want, func(ctx context.Context) error {
		var sec corev1.Secret
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.Kubeconfig)}, &sec); err != nil {
			return err
		}
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		for _, m := range ms {
			cfg, err := clientcmd.RESTConfigFromKubeConfig(sec.Data[secret.KubeconfigDataName])
			if err != nil {
				return err
			}
			ip := internalIP(&m)
			cfg.Host, cfg.Timeout = "https://"+net.JoinHostPort(ip, "6443"), 5*time.Second
			dc, err := discovery.NewDiscoveryClientForConfig(cfg)
			if err != nil {
				return err
			}
			v, err := dc.ServerVersion()
			if err != nil {
				return fmt.Errorf("machine %s: %w", m.Name, err)
			}
			if v.GitVersion != want {
				return fmt.Errorf("machine %s's API server reports %s", m.Name, v.GitVersion)
			}
		}
		return nil
	})
}

// checkLeaderMovedBeforeRemoval: QCP moved leadership at least once, as
// the first leader's machine was replaced too; finish checks that the
// monitor saw no member removed while it led.
func (s *scenario) checkLeaderMovedBeforeRemoval() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	moves := 0
	for _, e := range s.controlPlaneEvents(ctx, "MoveLeader") {
		moves += int(max(e.Count, 1))
	}
	if moves == 0 {
		s.t.Error("no MoveLeader event: the leader's machine was replaced without moving leadership first")
	}
}

// apiProbe reads the default Namespace from the workload API server,
// through the control plane endpoint, every 200 ms and records the longest
// time without an answer: a real request, not /readyz, which is the load
// balancer's routing signal. With reread, each request uses the
// <cluster>-kubeconfig Secret as last read (it is read again every 200 ms,
// beside the requests), as a client that takes the re-issued kubeconfig
// does.
type apiProbe struct {
	cancel context.CancelFunc
	done   chan struct{}
	worst  time.Duration
	// worstEnd is when the longest gap ended, and worstErr the last error
	// in it, for the log.
	worstEnd time.Time
	worstErr error
}

func (s *scenario) startAPIProbe(reread bool) *apiProbe {
	ctx, cancel := context.WithCancel(context.Background())
	p := &apiProbe{cancel: cancel, done: make(chan struct{})}
	cs, err := s.workload(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	var current atomic.Pointer[kubernetes.Clientset]
	current.Store(cs)
	if reread {
		// Beside the probe, so that a slow read of the Secret from the
		// management cluster is not counted as the workload API's silence.
		go func() {
			for ctx.Err() == nil {
				if fresh, err := s.workload(ctx); err == nil {
					current.Store(fresh)
				}
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
	}
	go func() {
		last, worst := time.Now(), time.Duration(0)
		var lastErr error
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			_, err := current.Load().CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
			if err != nil {
				lastErr = err
			} else {
				if gap := time.Since(last); gap > worst {
					worst, p.worstEnd, p.worstErr = gap, time.Now(), lastErr
				}
				last = time.Now()
			}
			select {
			case <-ctx.Done():
				p.worst = max(worst, time.Since(last))
				close(p.done)
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// stop ends the probe and returns the longest time without an answer.
func (p *apiProbe) stop() time.Duration {
	p.cancel()
	<-p.done
	return p.worst
}
