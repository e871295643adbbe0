package webhooks_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/webhooks"
)

// admit runs the rules in the API server's order: defaulting of the new
// object (the stored old one was defaulted when it was written), then
// validation.
func admit(old, qcp *controlplanev1.QuorumControlPlane) field.ErrorList {
	qcp = qcp.DeepCopy()
	if old != nil {
		old = old.DeepCopy()
		webhooks.Default(old)
	}
	webhooks.Default(qcp)
	return webhooks.Validate(old, qcp)
}

func TestValidate(t *testing.T) {
	for _, tc := range admissionCases() {
		t.Run(tc.name, func(t *testing.T) {
			errs := admit(tc.old, tc.new)
			if tc.field == "" {
				if len(errs) > 0 {
					t.Fatalf("rejected a valid request: %v", errs.ToAggregate())
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("want exactly one error on %s, got %v", tc.field, errs.ToAggregate())
			}
			if got := errs[0].Field; got != tc.field {
				t.Errorf("error names field %s, want %s (%v)", got, tc.field, errs[0])
			}
			if !strings.Contains(errs[0].Error(), tc.fix) {
				t.Errorf("error %q does not say %q", errs[0].Error(), tc.fix)
			}
		})
	}
}

func TestDefault(t *testing.T) {
	q := qcp(version("1.36.3"), func(q *controlplanev1.QuorumControlPlane) {
		q.Spec.Replicas = nil
		q.Spec.Etcd.Stacked.Version = "3.6.16"
	})
	webhooks.Default(q)
	s := q.Spec
	if got := ptr.Deref(s.Replicas, 0); got != 1 {
		t.Errorf("replicas = %d, want 1", got)
	}
	if s.Version != "v1.36.3" || s.Etcd.Stacked.Version != "v3.6.16" {
		t.Errorf("versions %q and %q, want v1.36.3 and v3.6.16", s.Version, s.Etcd.Stacked.Version)
	}
	if s.Rollout.Strategy.Type != controlplanev1.RollingUpdate || ptr.Deref(s.Rollout.Strategy.RollingUpdate.MaxSurge, -1) != 1 {
		t.Errorf("rollout strategy %+v, want RollingUpdate with maxSurge 1", s.Rollout.Strategy)
	}
	if !ptr.Deref(s.Remediation.Autorepair, false) {
		t.Errorf("autorepair is off by default")
	}

	onDelete := qcp(replicas(5), func(q *controlplanev1.QuorumControlPlane) {
		q.Spec.Rollout.Strategy.Type = controlplanev1.OnDelete
		q.Spec.Remediation.Autorepair = ptr.To(false)
	})
	webhooks.Default(onDelete)
	if got := *onDelete.Spec.Replicas; got != 5 {
		t.Errorf("defaulting changed replicas 5 to %d", got)
	}
	if onDelete.Spec.Rollout.Strategy.RollingUpdate.MaxSurge != nil || *onDelete.Spec.Remediation.Autorepair {
		t.Errorf("defaulting overrode the user's choices: %+v", onDelete.Spec)
	}
}

// FuzzValidate checks the rules as pure logic: the admission decision must
// agree with an independent statement of each rule, every error must name a
// spec field and say what to do, defaulting must be idempotent, and a
// request that leaves the spec alone is always admitted.
func FuzzValidate(f *testing.F) {
	for _, seed := range []struct {
		replicas                       int32
		version, oldVersion, running   string
		oldMode, newMode, surge, noOld uint8
	}{
		{3, "v1.36.3", "v1.36.3", "", 0, 0, 1, 0},
		{4, "v1.36.3", "v1.36.3", "", 0, 0, 1, 1},
		{4, "v1.36.3", "v1.36.3", "", 1, 1, 1, 0},
		{0, "v1.36.3", "", "", 0, 0, 1, 1},
		{-7, "1.36.3", "", "", 2, 2, 1, 1},
		{8, "v1.37.0", "v1.35.4", "", 0, 0, 1, 0},
		{3, "v1.35.9", "v1.36.0", "", 0, 0, 1, 0},
		{3, "v1.37.0", "v1.36.3", "v1.35.4", 0, 0, 1, 0},
		{3, "v1.36.3", "v1.36.3", "", 0, 1, 1, 0},
		{3, "v1.36.3", "v1.36.3", "", 2, 1, 1, 0},
		{1, "v1.36.3-rc.1+build.5", "v1.36.3-alpha.0", "", 0, 0, 0, 0},
		{1, "v01.36.3", "v1.36", "garbage", 0, 0, 0, 0},
		{7, "", "v1.36.3", "", 0, 0, 2, 0},
	} {
		f.Add(seed.replicas, seed.version, seed.oldVersion, seed.running, seed.oldMode, seed.newMode, seed.surge, seed.noOld)
	}
	f.Fuzz(func(t *testing.T, replicas int32, version, oldVersion, running string, oldMode, newMode, surge, noOld uint8) {
		newQCP := qcp(func(q *controlplanev1.QuorumControlPlane) {
			q.Spec.Replicas = ptr.To(replicas)
			q.Spec.Version = version
			q.Spec.Etcd = etcdMode(newMode)
			if surge < 2 {
				q.Spec.Rollout.Strategy.RollingUpdate.MaxSurge = ptr.To(int32(surge))
			}
		})
		var oldQCP *controlplanev1.QuorumControlPlane
		if noOld%2 == 0 {
			oldQCP = qcp(func(q *controlplanev1.QuorumControlPlane) {
				q.Spec.Version = oldVersion
				q.Spec.Etcd = etcdMode(oldMode)
				q.Status.Version = running
			})
		}

		errs := admit(oldQCP, newQCP)
		for _, err := range errs {
			if !strings.HasPrefix(err.Field, "spec.") || !namesFix(err.Detail) {
				t.Errorf("error %q does not name a spec field and say what to do", err.Error())
			}
		}
		if got, want := has(errs, "spec.replicas"), replicasWrong(replicas, newQCP.Spec.Etcd.IsStacked()); got != want {
			t.Errorf("replicas %d (stacked %v): rejected %v, want %v (%v)", replicas, newQCP.Spec.Etcd.IsStacked(), got, want, errs)
		}
		if oldQCP != nil {
			checkUpdate(t, oldQCP, newQCP, errs)
		}

		once := newQCP.DeepCopy()
		webhooks.Default(once)
		twice := once.DeepCopy()
		webhooks.Default(twice)
		if !equality.Semantic.DeepEqual(once, twice) {
			t.Errorf("defaulting is not idempotent: %+v then %+v", once.Spec, twice.Spec)
		}
		if errs := webhooks.Validate(once, once.DeepCopy()); len(errs) > 0 {
			t.Errorf("an update that changes nothing was rejected: %v", errs)
		}
	})
}

// checkUpdate states the version and etcd rules independently of the code
// under test.
func checkUpdate(t *testing.T, oldQCP, newQCP *controlplanev1.QuorumControlPlane, errs field.ErrorList) {
	t.Helper()
	if newQCP.Spec.Etcd.IsStacked() != oldQCP.Spec.Etcd.IsStacked() && !has(errs, "spec.etcd") {
		t.Errorf("switching etcd from %+v to %+v was admitted", oldQCP.Spec.Etcd, newQCP.Spec.Etcd)
	}
	from, errFrom := utilversion.ParseSemantic(oldQCP.Spec.Version)
	to, errTo := utilversion.ParseSemantic(newQCP.Spec.Version)
	wellFormed := errFrom == nil && errTo == nil && strings.HasPrefix(oldQCP.Spec.Version, "v") &&
		strings.TrimSpace(oldQCP.Spec.Version) == oldQCP.Spec.Version &&
		strings.TrimSpace(newQCP.Spec.Version) == newQCP.Spec.Version
	if !wellFormed {
		return
	}
	if to.LessThan(from) && !has(errs, "spec.version") {
		t.Errorf("downgrade %s -> %s was admitted", oldQCP.Spec.Version, newQCP.Spec.Version)
	}
	if to.Major() == from.Major() && to.Minor() > from.Minor()+1 && !has(errs, "spec.version") {
		t.Errorf("skipped minor %s -> %s was admitted", oldQCP.Spec.Version, newQCP.Spec.Version)
	}
}

func etcdMode(m uint8) controlplanev1.EtcdSpec {
	switch m % 3 {
	case 1:
		return controlplanev1.EtcdSpec{External: &controlplanev1.ExternalEtcd{Endpoints: []string{"https://10.0.0.1:2379"}}}
	case 2:
		return controlplanev1.EtcdSpec{ClusterRef: &controlplanev1.LocalObjectReference{Name: "etcd-a"}}
	}
	return controlplanev1.EtcdSpec{}
}

func replicasWrong(n int32, stacked bool) bool {
	return n < 1 || n > controlplanev1.MaxReplicas || (stacked && n%2 == 0)
}

func has(errs field.ErrorList, path string) bool {
	for _, err := range errs {
		if err.Field == path {
			return true
		}
	}
	return false
}

// namesFix: every message ends by telling the user what to write instead.
func namesFix(detail string) bool {
	for _, verb := range []string{"use ", "set ", "remove ", "write "} {
		if strings.Contains(detail, verb) {
			return true
		}
	}
	return false
}
