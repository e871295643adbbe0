package etcdcluster

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

func machineAt(name, ip string) *clusterv1.Machine {
	return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: clusterv1.MachineStatus{Addresses: []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: ip}}}}
}

// The contract fields: endpoints list the started voters, ready needs as
// many healthy voters as desired and no learner, creationComplete stays
// true once reached, and an unobservable etcd is not ready.
func TestContractStatus(t *testing.T) {
	ec := etcdCluster("v3.6.16")
	ec.Spec.Replicas = ptr.To[int32](3)
	a, b, c := machineAt("a", "127.0.0.2"), machineAt("b", "127.0.0.3"), machineAt("c", "127.0.0.4")
	obs := &observation{Observation: engine.Observation{
		Machines: []*clusterv1.Machine{a, b, c},
		Members: []quorum.Member{
			{ID: 1, Name: "a", Healthy: true, Leader: true},
			{ID: 2, Name: "b", Healthy: true},
			{ID: 3, PeerURL: "https://127.0.0.4:2380", Learner: true},
		},
	}, rollout: newRollout(ec, t0)}
	setStatus(ec, obs, quorum.Decision{Kind: quorum.Wait, Reason: "learner catching up"}, false, t0)
	if got, want := ec.Status.Endpoints, "https://127.0.0.2:2379,https://127.0.0.3:2379"; got != want {
		t.Errorf("endpoints %q, want %q (started voters only)", got, want)
	}
	if !ec.Status.Initialized || ec.Status.Ready || ec.Status.CreationComplete {
		t.Errorf("initialized %v, ready %v, creationComplete %v with a learner", ec.Status.Initialized, ec.Status.Ready, ec.Status.CreationComplete)
	}
	if !conditions.IsTrue(ec, etcdv1.AvailableCondition) {
		t.Errorf("2 healthy voters of 2 are a quorum, but Available is %v", conditions.Get(ec, etcdv1.AvailableCondition))
	}

	obs.Members[2] = quorum.Member{ID: 3, Name: "c", Healthy: true}
	setStatus(ec, obs, quorum.Decision{Kind: quorum.Wait, Reason: "nothing to do"}, false, t0)
	if !ec.Status.Ready || !ec.Status.CreationComplete || ptr.Deref(ec.Status.ReadyReplicas, 0) != 3 {
		t.Errorf("3 healthy voters: ready %v, creationComplete %v, readyReplicas %d", ec.Status.Ready, ec.Status.CreationComplete, ptr.Deref(ec.Status.ReadyReplicas, 0))
	}

	// Every status request timed out, but etcd served the linearizable
	// member list, which only a quorum can: available, and the message
	// says why.
	for i := range obs.Members {
		obs.Members[i].Healthy = false
	}
	setStatus(ec, obs, quorum.Decision{Kind: quorum.Wait, Reason: "waiting for members to become healthy"}, false, t0)
	if c := conditions.Get(ec, etcdv1.AvailableCondition); c == nil || c.Status != metav1.ConditionTrue ||
		!strings.Contains(c.Message, "only 0 of 3 voters answered a status request") {
		t.Errorf("Available with the member list served and no status answered: %+v, want True naming the 0 of 3", c)
	}

	obs.Members, obs.MembersErr = nil, errors.New("no member answers")
	setStatus(ec, obs, quorum.Decision{Kind: quorum.Wait, Reason: "membership unknown"}, false, t0)
	if ec.Status.Ready || !ec.Status.CreationComplete || !ec.Status.Initialized || ec.Status.Endpoints == "" {
		t.Errorf("unobservable etcd: ready %v (want false), creationComplete %v, initialized %v, endpoints %q (want kept)",
			ec.Status.Ready, ec.Status.CreationComplete, ec.Status.Initialized, ec.Status.Endpoints)
	}
	if c := conditions.Get(ec, etcdv1.AvailableCondition); c == nil || c.Status != metav1.ConditionUnknown {
		t.Errorf("Available with etcd unobservable: %+v, want Unknown", c)
	}
}
