package controlplane

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

func rolloutControlPlane() *controlplanev1.QuorumControlPlane {
	return &controlplanev1.QuorumControlPlane{Spec: controlplanev1.QuorumControlPlaneSpec{
		Version: "v1.36.3",
		MachineTemplate: controlplanev1.QuorumControlPlaneMachineTemplate{Spec: controlplanev1.QuorumControlPlaneMachineTemplateSpec{
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{Kind: "ProcessMachineTemplate", Name: "a"},
		}},
		QuorumControlPlaneConfig: controlplanev1.QuorumControlPlaneConfig{
			APIServer: controlplanev1.APIServerSpec{ExtraArgs: []controlplanev1.Arg{{Name: "v", Value: "2"}}},
		},
	}}
}

func template(binDir string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	_ = unstructured.SetNestedField(u.Object, binDir, "spec", "template", "spec", "binDir")
	_ = unstructured.SetNestedField(u.Object, "x", "spec", "template", "metadata", "labels", "l")
	return u
}

// machineFrom is a machine created at t0 from cp and tmpl, as createMachine
// records it.
func machineFrom(cp *controlplanev1.QuorumControlPlane, tmpl *unstructured.Unstructured) *clusterv1.Machine {
	return &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: "m", CreationTimestamp: metav1.NewTime(t0),
			Annotations: map[string]string{MachineSpecAnnotation: desiredMachineSpec(cp, tmpl).annotation()}},
		Spec: clusterv1.MachineSpec{Version: cp.Spec.Version},
	}
}

// TestOutdatedSaysWhy checks each reason a machine is rolled out, that
// metadata alone and the certificate validity never roll one, and that a
// machine without a record rolls out only for its version, rollout.after
// or certificate expiry.
func TestOutdatedSaysWhy(t *testing.T) {
	now := t0.Add(time.Hour)
	tmpl := template("/bin")
	for _, tc := range []struct {
		name    string
		change  func(cp *controlplanev1.QuorumControlPlane, tmpl *unstructured.Unstructured, m *clusterv1.Machine)
		outdate string // "" means up to date
	}{
		{"unchanged", func(*controlplanev1.QuorumControlPlane, *unstructured.Unstructured, *clusterv1.Machine) {}, ""},
		{"version", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, _ *clusterv1.Machine) {
			cp.Spec.Version = "v1.37.0"
		}, "Version v1.36.3, v1.37.0 required"},
		{"new template", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, _ *clusterv1.Machine) {
			cp.Spec.MachineTemplate.Spec.InfrastructureRef.Name = "b"
		}, "InfrastructureMachine cloned from ProcessMachineTemplate/a, ProcessMachineTemplate/b required"},
		{"template edited in place", func(_ *controlplanev1.QuorumControlPlane, tmpl *unstructured.Unstructured, _ *clusterv1.Machine) {
			_ = unstructured.SetNestedField(tmpl.Object, "/other", "spec", "template", "spec", "binDir")
		}, "InfrastructureMachine template ProcessMachineTemplate/a changed"},
		{"template metadata only", func(_ *controlplanev1.QuorumControlPlane, tmpl *unstructured.Unstructured, _ *clusterv1.Machine) {
			_ = unstructured.SetNestedField(tmpl.Object, "y", "spec", "template", "metadata", "labels", "l")
		}, ""},
		{"machine metadata only", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, _ *clusterv1.Machine) {
			cp.Spec.MachineTemplate.ObjectMeta.Labels = map[string]string{"team": "a"}
			cp.Spec.CertificateValidityPeriodDays = ptr.To[int32](30)
		}, ""},
		{"apiserver args", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, _ *clusterv1.Machine) {
			cp.Spec.APIServer.ExtraArgs[0].Value = "4"
		}, "kube-apiserver extra args changed"},
		{"etcd args", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, _ *clusterv1.Machine) {
			cp.Spec.Etcd.Stacked.ExtraArgs = []controlplanev1.Arg{{Name: "snapshot-count", Value: "5000"}}
		}, "etcd extra args changed"},
		{"certSANs", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, _ *clusterv1.Machine) {
			cp.Spec.APIServer.CertSANs = []string{"api.example.com"}
		}, "apiServer.certSANs changed"},
		{"rollout.after passed", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, _ *clusterv1.Machine) {
			cp.Spec.Rollout.After = metav1.NewTime(now)
		}, "Created before rollout.after"},
		{"rollout.after to come", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, _ *clusterv1.Machine) {
			cp.Spec.Rollout.After = metav1.NewTime(now.Add(time.Minute))
		}, ""},
		{"rollout.after before creation", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, _ *clusterv1.Machine) {
			cp.Spec.Rollout.After = metav1.NewTime(t0.Add(-time.Minute))
		}, ""},
		{"certificates within the threshold", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, m *clusterv1.Machine) {
			cp.Spec.Rollout.Before.CertificatesExpiryDays = ptr.To[int32](7)
			m.Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation] = now.Add(6 * 24 * time.Hour).Format(time.RFC3339)
		}, "within rollout.before.certificatesExpiryDays (7 days)"},
		{"certificates past the threshold", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, m *clusterv1.Machine) {
			cp.Spec.Rollout.Before.CertificatesExpiryDays = ptr.To[int32](7)
			m.Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation] = now.Add(8 * 24 * time.Hour).Format(time.RFC3339)
		}, ""},
		{"adopted: no record, same version", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, m *clusterv1.Machine) {
			delete(m.Annotations, MachineSpecAnnotation)
			cp.Spec.MachineTemplate.Spec.InfrastructureRef.Name = "b"
			cp.Spec.APIServer.ExtraArgs = nil
		}, ""},
		{"adopted: rollout.after", func(cp *controlplanev1.QuorumControlPlane, _ *unstructured.Unstructured, m *clusterv1.Machine) {
			delete(m.Annotations, MachineSpecAnnotation)
			cp.Spec.Rollout.After = metav1.NewTime(now)
		}, "Created before rollout.after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp, tmpl := rolloutControlPlane(), tmpl.DeepCopy()
			m := machineFrom(cp, tmpl)
			tc.change(cp, tmpl, m)
			ro := rollout{version: cp.Spec.Version, want: desiredMachineSpec(cp, tmpl), after: cp.Spec.Rollout.After.Time,
				certThreshold: time.Duration(ptr.Deref(cp.Spec.Rollout.Before.CertificatesExpiryDays, 0)) * 24 * time.Hour, now: now}
			why := strings.Join(ro.outdated(m), "; ")
			if (tc.outdate == "") != (why == "") || !strings.Contains(why, tc.outdate) {
				t.Fatalf("outdated: %q, want %q", why, tc.outdate)
			}
		})
	}
}

// TestRolloutWakesWhenTimeOutdatesAMachine: with no event to come, the
// reconciler must wake when rollout.after arrives or certificates enter
// the threshold.
func TestRolloutWakesWhenTimeOutdatesAMachine(t *testing.T) {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0), Annotations: map[string]string{
		clusterv1.MachineCertificatesExpiryDateAnnotation: t0.Add(10 * 24 * time.Hour).Format(time.RFC3339)}}}
	ro := rollout{now: t0.Add(time.Minute), after: t0.Add(time.Hour), certThreshold: 7 * 24 * time.Hour}
	if got := ro.next([]*clusterv1.Machine{m}); !got.Equal(t0.Add(time.Hour)) {
		t.Errorf("next = %s, want rollout.after %s", got, t0.Add(time.Hour))
	}
	ro.after = time.Time{}
	if got, want := ro.next([]*clusterv1.Machine{m}), t0.Add(3*24*time.Hour); !got.Equal(want) {
		t.Errorf("next = %s, want %s (expiry minus threshold)", got, want)
	}
	ro.certThreshold = 0
	if got := ro.next([]*clusterv1.Machine{m}); !got.IsZero() {
		t.Errorf("next = %s, want none", got)
	}
}

func TestStrategyNames(t *testing.T) {
	for _, tc := range []struct {
		s    controlplanev1.RolloutStrategy
		want quorum.Strategy
	}{
		{controlplanev1.RolloutStrategy{}, quorum.SurgeFirst},
		{controlplanev1.RolloutStrategy{Type: controlplanev1.RollingUpdate, RollingUpdate: controlplanev1.RollingUpdateSpec{MaxSurge: ptr.To[int32](1)}}, quorum.SurgeFirst},
		{controlplanev1.RolloutStrategy{Type: controlplanev1.RollingUpdate, RollingUpdate: controlplanev1.RollingUpdateSpec{MaxSurge: ptr.To[int32](0)}}, quorum.RemoveFirst},
		{controlplanev1.RolloutStrategy{Type: controlplanev1.OnDelete}, quorum.OnDelete},
	} {
		if got := strategy(tc.s); got != tc.want {
			t.Errorf("strategy(%+v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

// TestRollingOutNamesWhyAndWhatBlocks: the RollingOut condition lists the
// outdated machines and why, and a replacement whose infrastructure cannot
// start (a missing kube binary) shows the infrastructure's fix.
func TestRollingOutNamesWhyAndWhatBlocks(t *testing.T) {
	old := observedMachine("cp-1")
	old.Spec.Version = "v1.35.4"
	blocked := observedMachine("cp-2")
	blocked.Spec.Version = "v1.36.3"
	blocked.Status.Addresses = nil
	fix := "binary kube v1.36.3 not found at bin/kube-v1.36.3: run `make binaries KUBE_VERSION=v1.36.3`"
	conditions.Set(blocked, metav1.Condition{Type: clusterv1.MachineInfrastructureReadyCondition, Status: metav1.ConditionFalse, Reason: "BinaryMissing", Message: fix})
	obs := &observation{Observation: engine.Observation{Machines: []*clusterv1.Machine{old, blocked}}, rollout: rollout{version: "v1.36.3", now: t0}}
	wait := quorum.Decision{Kind: quorum.Wait, Reason: "waiting for machine cp-2 to join before creating another"}

	cp := &controlplanev1.QuorumControlPlane{}
	engine.SetRollingOut(cp, &obs.Observation, obs.rollout.outdated, wait)
	c := conditions.Get(cp, controlplanev1.RollingOutCondition)
	if c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("RollingOut = %+v, want True", c)
	}
	for _, want := range []string{"Rolling out 1 not up-to-date replicas (cp-1)", "* Version v1.35.4, v1.36.3 required", "* Machine cp-2: " + fix, wait.Reason} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("RollingOut message %q lacks %q", c.Message, want)
		}
	}

	obs.State.Strategy = quorum.OnDelete
	engine.SetRollingOut(cp, &obs.Observation, obs.rollout.outdated, wait)
	if c := conditions.Get(cp, controlplanev1.RollingOutCondition); c.Status != metav1.ConditionFalse || c.Reason != controlplanev1.WaitingForDeleteReason {
		t.Errorf("with OnDelete RollingOut = %+v, want False, %s", c, controlplanev1.WaitingForDeleteReason)
	}

	obs.Machines = []*clusterv1.Machine{blocked}
	engine.SetRollingOut(cp, &obs.Observation, obs.rollout.outdated, wait)
	if c := conditions.Get(cp, controlplanev1.RollingOutCondition); c.Status != metav1.ConditionFalse || c.Reason != controlplanev1.NotRollingOutReason {
		t.Errorf("with every machine up to date RollingOut = %+v, want False, %s", c, controlplanev1.NotRollingOutReason)
	}
}

// TestRollingOutSaysRebalancing: machines crowded in one of three offered
// domains are reported as a rebalancing, with the domain and the limit.
func TestRollingOutSaysRebalancing(t *testing.T) {
	obs := &observation{rollout: rollout{version: "v1.36.3", now: t0}}
	for _, name := range []string{"cp-1", "cp-2", "cp-3"} {
		m := observedMachine(name)
		m.Spec.Version, m.Spec.FailureDomain = "v1.36.3", "fd-a"
		obs.Machines = append(obs.Machines, m)
		obs.State.Machines = append(obs.State.Machines, quorum.Machine{Name: name, FailureDomain: "fd-a", UpToDate: true, PeerURL: "https://" + name + ":2380", MemberID: uint64(len(obs.Machines))})
		obs.State.Members = append(obs.State.Members, quorum.Member{ID: uint64(len(obs.Machines)), Name: name, PeerURL: "https://" + name + ":2380", Healthy: true})
	}
	obs.State.Desired, obs.State.FailureDomains = 3, []string{"fd-a", "fd-b", "fd-c"}
	cp := &controlplanev1.QuorumControlPlane{}
	engine.SetRollingOut(cp, &obs.Observation, obs.rollout.outdated, quorum.Decision{Kind: quorum.CreateMachine})
	c := conditions.Get(cp, controlplanev1.RollingOutCondition)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != controlplanev1.RebalancingReason ||
		!strings.Contains(c.Message, "failure domain fd-a holds 3 machines, more than an even spread's 1") {
		t.Fatalf("RollingOut = %+v, want True, %s, naming fd-a's 3 machines", c, controlplanev1.RebalancingReason)
	}
	obs.State.FailureDomains = []string{"fd-a"}
	engine.SetRollingOut(cp, &obs.Observation, obs.rollout.outdated, quorum.Decision{Kind: quorum.Wait})
	if c := conditions.Get(cp, controlplanev1.RollingOutCondition); c.Status != metav1.ConditionFalse {
		t.Errorf("with one domain RollingOut = %+v, want False", c)
	}
}
