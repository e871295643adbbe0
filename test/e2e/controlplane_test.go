package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/cloudinit"
	"github.com/qcp-dev/qcp/internal/controllers/controlplane"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestCreateAndScale creates a 3-machine control plane, then scales it to
// 5 and back to 3 through the scale subresource. At 5, two machines are
// killed at once and replaced, one at a time.
func TestCreateAndScale(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 2*time.Minute+55*time.Second)
	s := newScenario(t, mgmt, "scale", 3)
	s.startTraffic(3)
	cp := s.waitAvailable(convergeTimeout, 3)
	s.checkCreated(cp)
	if got := s.waitNodes(); got[cloudinit.Format] != 3 || len(got) != 1 {
		t.Errorf("machines by bootstrap data format: %v; want 3 booted from cloud-config", got)
	}

	// Two machines killed at once take one remediation after the other; on
	// a CPU-starved host the health check may also mark a live machine.
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	s.scale(ctx, 5)
	s.waitAvailable(convergeTimeout, 5)
	machines := s.settled(5*time.Minute, 5)
	if got := domainCounts(machines); !slices.Equal(got, []int{2, 2, 1}) {
		t.Errorf("5 machines spread %v over fd-a, fd-b, fd-c; want 2/2/1", got)
	}

	s.checkTwoOfFive(ctx, machines[:2])
	machines = s.settled(5*time.Minute, 5)

	// The machine annotated for deletion goes first, wherever it is; the
	// next comes from a fuller domain, oldest first.
	marked := machines[len(machines)-1] // the newest
	s.annotate(ctx, marked.Name, clusterv1.DeleteMachineAnnotation)
	departed := len(s.bound.departures())
	s.scale(ctx, 3)
	s.waitAvailable(convergeTimeout, 3)
	left, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gone := s.bound.departures()[departed:]
	if len(gone) != 2 || gone[0] != marked.Name {
		t.Fatalf("scale-down removed %v; want %s (annotated) first, then one more", gone, marked.Name)
	}
	if want := oldestInFullestDomain(machines, marked.Name); gone[1] != want {
		t.Errorf("scale-down's second removal was %s; want %s, the oldest machine of the fullest domain", gone[1], want)
	}
	if got := domainCounts(left); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("3 machines spread %v over fd-a, fd-b, fd-c; want 1/1/1", got)
	}
	s.checkMetrics(ctx)
	s.checkDatabases()
	s.checkCertificates()
	s.finish()
}

// checkCertificates: status.certificates reports, for stacked etcd, when
// the three authorities, the kubeconfig and the first machine's
// certificates expire, each as the certificate itself says (read from its
// Secret, or the Machines' records), and the metric exports each.
func (s *scenario) checkCertificates() {
	s.t.Helper()
	s.eventually(time.Minute, "status.certificates as the certificates say", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		want := map[controlplanev1.CertificateKind]time.Time{}
		for kind, purpose := range map[controlplanev1.CertificateKind]secret.Purpose{
			controlplanev1.CertificateKindClusterCA: secret.ClusterCA, controlplanev1.CertificateKindEtcdCA: secret.EtcdCA,
			controlplanev1.CertificateKindFrontProxyCA: secret.FrontProxyCA,
		} {
			var sec corev1.Secret
			if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, purpose)}, &sec); err != nil {
				return err
			}
			c, err := certs.ParseCert(sec.Data[secret.TLSCrtDataName])
			if err != nil {
				return err
			}
			want[kind] = c.NotAfter
		}
		var kc corev1.Secret
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.Kubeconfig)}, &kc); err != nil {
			return err
		}
		cfg, err := clientcmd.Load(kc.Data[secret.KubeconfigDataName])
		if err != nil {
			return err
		}
		for _, user := range cfg.AuthInfos {
			c, err := certs.ParseCert(user.ClientCertificateData)
			if err != nil {
				return err
			}
			want[controlplanev1.CertificateKindKubeconfig] = c.NotAfter
		}
		machines, err := s.machines(ctx)
		if err != nil {
			return err
		}
		for _, m := range machines {
			at, err := time.Parse(time.RFC3339, m.Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation])
			if err != nil {
				return fmt.Errorf("machine %s has no certificate expiry record yet", m.Name)
			}
			if w, ok := want[controlplanev1.CertificateKindMachines]; !ok || at.Before(w) {
				want[controlplanev1.CertificateKindMachines] = at
			}
		}
		got := map[controlplanev1.CertificateKind]time.Time{}
		for _, e := range cp.Status.Certificates {
			got[e.Kind] = e.NotAfter.Time
		}
		if len(got) != len(want) {
			return fmt.Errorf("status.certificates %+v; want the kinds of %v", cp.Status.Certificates, want)
		}
		for kind, w := range want {
			if !got[kind].Equal(w) {
				return fmt.Errorf("status.certificates says %s expires %s; the certificate says %s", kind, got[kind], w)
			}
			series := fmt.Sprintf(`qcp_controlplane_certificate_expiry_timestamp_seconds{kind=%q,name=%q,namespace=%q} `, kind, s.name, ns)
			if v, err := testkit.Metric(ctx, s.mgmt.manager.MetricsAddr, series); err != nil || int64(v) != w.Unix() {
				return fmt.Errorf("metric %s= %v (%v); want %d", series, v, err, w.Unix())
			}
		}
		return nil
	})
}

// checkTwoOfFive kills two machines of five at once (#10125): QCP's health
// check marks both, and QCP replaces them on its own, one at a time (the
// second remediation begins only once the first replacement exists), back
// to 5 healthy voters.
func (s *scenario) checkTwoOfFive(ctx context.Context, victims []clusterv1.Machine) {
	s.t.Helper()
	host := &machinehost.Host{Root: s.mgmt.env.MachineRoot()}
	start := time.Now()
	for _, v := range victims {
		if err := host.Kill(ns, v.Name); err != nil {
			s.t.Fatal(err)
		}
	}
	s.eventually(15*time.Minute, "both killed machines replaced", func(ctx context.Context) error {
		for _, v := range victims {
			var m clusterv1.Machine
			if err := s.reader(ctx).Get(ctx, client.ObjectKeyFromObject(&v), &m); !isNotFound(err) {
				cp, _ := s.controlPlane(ctx)
				return fmt.Errorf("machine %s still there (%v); Remediating: %s", v.Name, err, conditions.GetMessage(cp, controlplanev1.RemediatingCondition))
			}
		}
		return nil
	})
	s.waitAvailable(convergeTimeout, 5)
	s.t.Logf("2 of 5 machines killed; 5 healthy voters again after %s", time.Since(start).Round(time.Second))

	ms, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	type replacement struct {
		machine                 clusterv1.Machine
		replaced, remediationAt string
	}
	var reps []replacement
	for _, m := range ms {
		var rec struct {
			Machine   string      `json:"machine"`
			Timestamp metav1.Time `json:"timestamp"`
		}
		raw, ok := m.Annotations[controlplane.RemediationForAnnotation]
		if !ok {
			continue
		}
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			s.t.Fatalf("machine %s: %s: %v", m.Name, controlplane.RemediationForAnnotation, err)
		}
		// A live machine the health check marked on a starved host is
		// replaced too; only the killed machines' replacements count here.
		if !slices.ContainsFunc(victims, func(v clusterv1.Machine) bool { return v.Name == rec.Machine }) {
			s.t.Logf("machine %s replaced %s, a machine this scenario did not kill", m.Name, rec.Machine)
			continue
		}
		reps = append(reps, replacement{m, rec.Machine, rec.Timestamp.UTC().Format(time.RFC3339)})
	}
	if len(reps) != 2 || reps[0].replaced == reps[1].replaced {
		s.t.Fatalf("replacements %+v; want one for each of the killed machines %s and %s", reps, victims[0].Name, victims[1].Name)
	}
	// Oldest replacement first; RFC 3339 seconds sort as strings, and both
	// times are kept to the second.
	first, second := reps[0], reps[1]
	if created := first.machine.CreationTimestamp.UTC().Format(time.RFC3339); second.remediationAt < created {
		s.t.Errorf("the remediation of %s began at %s, before %s replaced %s at %s: not one at a time",
			second.replaced, second.remediationAt, first.machine.Name, first.replaced, created)
	}
}

// checkMetrics reads qcp-manager's metrics for the scenario after it grew
// to 5 and shrank to 3: steps by kind, membership step durations, the
// member gauges and reconcile outcomes must account for what happened.
func (s *scenario) checkMetrics(ctx context.Context) {
	s.t.Helper()
	cp := fmt.Sprintf(`name=%q,namespace=%q`, s.name, ns)
	for _, c := range []struct {
		series string
		check  func(float64) bool
		want   string
	}{
		{`qcp_controlplane_steps_total{kind="CreateMachine",` + cp + `,outcome="success"} `, func(v float64) bool { return v >= 5 }, "at least 5 machines created"},
		{`qcp_controlplane_steps_total{kind="Promote",` + cp + `,outcome="success"} `, func(v float64) bool { return v >= 4 }, "at least 4 learners promoted"},
		{`qcp_controlplane_steps_total{kind="RemoveMember",` + cp + `,outcome="success"} `, func(v float64) bool { return v >= 2 }, "at least 2 members removed"},
		{`qcp_controlplane_membership_step_duration_seconds_count{` + cp + `,step="promote"} `, func(v float64) bool { return v >= 4 }, "4 promotions timed"},
		{`qcp_controlplane_membership_step_duration_seconds_count{` + cp + `,step="remove"} `, func(v float64) bool { return v >= 2 }, "2 removals timed"},
		{`qcp_controlplane_etcd_members{` + cp + `,role="voter"} `, func(v float64) bool { return v == 3 }, "3 voters"},
		{`qcp_controlplane_etcd_members{` + cp + `,role="learner"} `, func(v float64) bool { return v == 0 }, "no learner"},
		{`qcp_controlplane_reconciles_total{` + cp + `,outcome="success"} `, func(v float64) bool { return v > 0 }, "successful reconciles"},
		{`qcp_controlplane_reaction_latency_seconds_count{` + cp + `} `, func(v float64) bool { return v >= 10 }, "a reaction latency per step"},
	} {
		v, err := testkit.Metric(ctx, s.mgmt.manager.MetricsAddr, c.series)
		if err != nil || !c.check(v) {
			s.t.Errorf("metric %s= %v (%v); want %s", c.series, v, err, c.want)
		}
	}
}

// checkDatabases checks that status and the metrics show each member's
// database: in status a size, the part in use (no larger) and etcd's
// default quota of 2 GiB; in the metrics the exact bytes and a revision.
func (s *scenario) checkDatabases() {
	s.t.Helper()
	quota := resource.MustParse("2Gi")
	s.eventually(time.Minute, "every member's database in status and metrics", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if len(cp.Status.Etcd.Members) != 3 {
			return fmt.Errorf("%d members in status, want 3", len(cp.Status.Etcd.Members))
		}
		for _, m := range cp.Status.Etcd.Members {
			db := m.Database
			switch {
			case db == nil:
				return fmt.Errorf("member %s: no database in status", m.ID)
			case db.Size.Sign() <= 0 || db.InUse.Sign() <= 0 || db.InUse.Cmp(db.Size) > 0:
				return fmt.Errorf("member %s: database of %s with %s in use", m.ID, db.Size.String(), db.InUse.String())
			case db.Quota == nil || db.Quota.Cmp(quota) != 0:
				return fmt.Errorf("member %s: quota %v, want etcd's default %s", m.ID, db.Quota, quota.String())
			}
			labels := fmt.Sprintf(`{member=%q,name=%q,namespace=%q} `, m.ID, s.name, ns)
			values := map[string]float64{}
			for _, metric := range []string{"db_size_bytes", "db_size_in_use_bytes", "db_quota_bytes", "revision"} {
				if values[metric], err = testkit.Metric(ctx, s.mgmt.manager.MetricsAddr, "qcp_controlplane_etcd_"+metric+labels); err != nil {
					return err
				}
			}
			if size, inUse := values["db_size_bytes"], values["db_size_in_use_bytes"]; size <= 0 || inUse <= 0 || inUse > size {
				return fmt.Errorf("member %s: metrics say %v bytes with %v in use", m.ID, size, inUse)
			}
			if values["db_quota_bytes"] != float64(quota.Value()) || values["revision"] <= 0 {
				return fmt.Errorf("member %s: metrics say quota %v and revision %v", m.ID, values["db_quota_bytes"], values["revision"])
			}
		}
		return nil
	})
}

// checkCreated checks a fresh 3-machine control plane: one machine per
// failure domain, the Cluster initialized, three Ready control plane nodes
// through the generated kubeconfig, one leader and two voters.
func (s *scenario) checkCreated(cp *controlplanev1.QuorumControlPlane) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	machines, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	if got := domainCounts(machines); !slices.Equal(got, []int{1, 1, 1}) {
		s.t.Errorf("3 machines spread %v over fd-a, fd-b, fd-c; want one in each", got)
	}
	roles := map[controlplanev1.EtcdMemberRole]int{}
	for _, m := range cp.Status.Etcd.Members {
		roles[m.Role]++
	}
	if roles[controlplanev1.EtcdMemberRoleLeader] != 1 || roles[controlplanev1.EtcdMemberRoleVoter] != 2 || len(cp.Status.Etcd.Members) != 3 {
		s.t.Errorf("status.etcd.members %+v; want one leader and two voters", cp.Status.Etcd.Members)
	}
	s.eventually(time.Minute, "the Cluster reporting the control plane initialized", func(ctx context.Context) error {
		cluster := &clusterv1.Cluster{}
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, cluster); err != nil {
			return err
		}
		if !ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) {
			return fmt.Errorf("Cluster %s: controlPlaneInitialized is not true", s.name)
		}
		return nil
	})
	s.eventually(2*time.Minute, "3 Ready control plane nodes through the generated kubeconfig", func(ctx context.Context) error {
		wl, err := s.workload(ctx)
		if err != nil {
			return err
		}
		nodes, err := wl.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == "Ready" && c.Status == "True" {
					ready++
				}
			}
		}
		if ready != 3 || len(nodes.Items) != 3 {
			return fmt.Errorf("%d nodes, %d Ready", len(nodes.Items), ready)
		}
		return nil
	})
	if !conditions.IsTrue(cp, controlplanev1.InitializedCondition) || !ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false) {
		s.t.Errorf("control plane not reported initialized: %+v", cp.Status.Initialization)
	}
}

// annotate sets annotation key on machine name.
func (s *scenario) annotate(ctx context.Context, name, key string) {
	s.t.Helper()
	m := &clusterv1.Machine{}
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
		s.t.Fatal(err)
	}
	before := m.DeepCopy()
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[key] = ""
	if err := s.c.Patch(ctx, m, client.MergeFrom(before)); err != nil {
		s.t.Fatal(err)
	}
}

// settled waits until the control plane has exactly n Machines, none being
// deleted and none marked by the health check, and returns them oldest
// first: the set a spread is judged on, not one caught mid-remediation.
func (s *scenario) settled(timeout time.Duration, n int) []clusterv1.Machine {
	s.t.Helper()
	var ms []clusterv1.Machine
	s.eventually(timeout, fmt.Sprintf("%d machines, none being deleted or remediated", n), func(ctx context.Context) error {
		var err error
		if ms, err = s.machines(ctx); err != nil {
			return err
		}
		if len(ms) != n {
			return fmt.Errorf("%d machines", len(ms))
		}
		for _, m := range ms {
			if !m.DeletionTimestamp.IsZero() {
				return fmt.Errorf("machine %s is being deleted", m.Name)
			}
			if conditions.IsFalse(&m, clusterv1.MachineHealthCheckSucceededCondition) {
				return fmt.Errorf("machine %s failed its health check: %s", m.Name, conditions.GetMessage(&m, clusterv1.MachineHealthCheckSucceededCondition))
			}
		}
		return nil
	})
	return ms
}

// domainCounts counts machines in fd-a, fd-b and fd-c.
func domainCounts(ms []clusterv1.Machine) []int {
	counts := make([]int, len(failureDomains))
	for _, m := range ms {
		if i := slices.Index(failureDomains, m.Spec.FailureDomain); i >= 0 {
			counts[i]++
		}
	}
	return counts
}

// oldestInFullestDomain is the machine the planner removes after except:
// the oldest of the domain with the most machines, ties alphabetical.
func oldestInFullestDomain(ms []clusterv1.Machine, except string) string {
	counts := map[string]int{}
	for _, m := range ms {
		if m.Name != except {
			counts[m.Spec.FailureDomain]++
		}
	}
	fullest := ""
	for _, fd := range failureDomains {
		if fullest == "" || counts[fd] > counts[fullest] {
			fullest = fd
		}
	}
	for _, m := range ms { // oldest first
		if m.Name != except && m.Spec.FailureDomain == fullest {
			return m.Name
		}
	}
	return ""
}
