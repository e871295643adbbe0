package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/controlplane"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/etcd"
)

// TestAdoption builds a control plane by hand, as a user moving an
// existing cluster to QCP has one: the cluster's certificate authorities,
// and three Machines with the control plane labels and qcp-agent bootstrap
// data, the first starting etcd and the others joining it as learners
// that this test adds and promotes. A QuorumControlPlane created then
// adopts all three (its owner reference, its name label, a recorded member
// ID on each), and neither replaces nor adds a machine.
func TestAdoption(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 2*time.Minute)
	s, cp := newScenarioWithoutControlPlane(t, mgmt, "adopt", 3, failureDomains)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	var cluster clusterv1.Cluster
	s.eventually(3*time.Minute, "the Cluster's infrastructure and endpoint", func(ctx context.Context) error {
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, &cluster); err != nil {
			return err
		}
		if !ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) || !cluster.Spec.ControlPlaneEndpoint.IsValid() {
			return fmt.Errorf("infrastructure provisioned %v, endpoint %+v", cluster.Status.Initialization.InfrastructureProvisioned, cluster.Spec.ControlPlaneEndpoint)
		}
		return nil
	})
	cas, err := controlplane.EnsureCertificateAuthorities(ctx, s.c, client.ObjectKeyFromObject(&cluster),
		*metav1.NewControllerRef(&cluster, clusterv1.GroupVersion.WithKind("Cluster")))
	if err != nil {
		t.Fatal(err)
	}
	endpoint := net.JoinHostPort(cluster.Spec.ControlPlaneEndpoint.Host, strconv.Itoa(int(cluster.Spec.ControlPlaneEndpoint.Port)))

	var cli *etcd.Client
	var clientURLs []string
	for i, fd := range failureDomains {
		name := fmt.Sprintf("%s-hand-%d", s.name, i)
		member := bootstrap.NewMember()
		if i > 0 {
			member = bootstrap.JoinMember(clientURLs...)
		}
		addr := s.handMadeMachine(ctx, cas, endpoint, name, fd, member)
		if i == 0 {
			s.eventually(3*time.Minute, "etcd on "+name+" answering", func(ctx context.Context) error {
				cfg, err := s.etcdConfig(ctx)
				if err != nil {
					return err
				}
				if cli == nil {
					if cli, err = etcd.New(cfg); err != nil {
						return err
					}
				}
				_, err = cli.Members(ctx)
				return err
			})
			t.Cleanup(func() { _ = cli.Close() })
		} else {
			joinByHand(s, cli, name, "https://"+net.JoinHostPort(addr, "2380"))
		}
		clientURLs = append(clientURLs, "https://"+net.JoinHostPort(addr, "2379"))
	}
	s.startTraffic(3)

	s.create(ctx, cp)
	s.waitAvailable(8*time.Minute, 3)
	ms, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if owner := metav1.GetControllerOf(&m); owner == nil || owner.Kind != "QuorumControlPlane" || owner.Name != s.name {
			t.Errorf("machine %s's controller is %+v, want QuorumControlPlane %s", m.Name, owner, s.name)
		}
		if m.Annotations[engine.MemberIDAnnotation] == "" {
			t.Errorf("adopted machine %s has no recorded etcd member ID (%s)", m.Name, engine.MemberIDAnnotation)
		}
		if got := m.Labels[clusterv1.MachineControlPlaneNameLabel]; got != s.name {
			t.Errorf("machine %s's %s label is %q, want %q (the health check selects on it)", m.Name, clusterv1.MachineControlPlaneNameLabel, got, s.name)
		}
		var data corev1.Secret
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: *m.Spec.Bootstrap.DataSecretName}, &data); err != nil {
			t.Fatal(err)
		}
		if owner := metav1.GetControllerOf(&data); owner == nil || owner.Kind != "Machine" || owner.Name != m.Name {
			t.Errorf("machine %s's bootstrap data is controlled by %+v, want the machine", m.Name, owner)
		}
	}
	// Adopted as they are: no rollout follows. The machines hold only
	// their version, which matches, and one per failure domain.
	s.holds(time.Minute, "no machine replaced or added after the adoption", func(ctx context.Context) error {
		if got := s.bound.machinesSeen(); got != 3 {
			return fmt.Errorf("%d machines existed, want the 3 made by hand", got)
		}
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return nil // the management cluster's answer, not the control plane's
		}
		if got := ptr.Deref(cp.Status.UpToDateReplicas, -1); got != 3 {
			return fmt.Errorf("%d machines up to date, want 3", got)
		}
		return nil
	})
	s.finish()
}

// handMadeMachine creates a control plane Machine as a user would without
// a control plane provider: the Machine with the control plane labels, its
// qcp-agent bootstrap data (unowned, as a hand-made Secret is) and its
// ProcessMachine. It returns the machine's address once it has one.
func (s *scenario) handMadeMachine(ctx context.Context, cas *certs.ClusterCAs, endpoint, name, fd string, member bootstrap.LocalEtcd) string {
	s.t.Helper()
	doc := bootstrap.NewStacked(s.name, cas, endpoint, member)
	doc.Versions.Kubernetes = version
	doc.Tunables.CertificateValidityDays = controlplanev1.DefaultCertificateValidityPeriodDays
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
			clusterv1.ClusterNameLabel: s.name, clusterv1.MachineControlPlaneLabel: "",
		}},
		Spec: clusterv1.MachineSpec{
			ClusterName: s.name, Version: version, FailureDomain: fd,
			Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To(engine.BootstrapDataSecretName(name))},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachine", Name: name},
		},
	}
	data, err := engine.BootstrapDataSecret(m, doc, "")
	if err != nil {
		s.t.Fatal(err)
	}
	data.OwnerReferences = nil
	s.create(ctx, data, m, &infrav1.ProcessMachine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
		Labels: map[string]string{clusterv1.ClusterNameLabel: s.name}}})
	var addr string
	s.eventually(3*time.Minute, "machine "+name+"'s address", func(ctx context.Context) error {
		if err := s.reader(ctx).Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
			return err
		}
		if addr = internalIP(m); addr == "" {
			return fmt.Errorf("no address yet")
		}
		return nil
	})
	return addr
}

// joinByHand adds machine name's member as a learner, waits for it to
// start, and promotes it: what QCP would do, done here by hand.
func joinByHand(s *scenario, cli *etcd.Client, name, peerURL string) {
	s.t.Helper()
	var learner etcd.Member
	// etcd refuses membership changes until every voter has been
	// connected for a few seconds, as right after a promotion; an add
	// answered with an error may still have taken effect.
	s.eventually(2*time.Minute, "etcd adding "+name+" as a learner", func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		members, err := cli.Members(ctx)
		if err != nil {
			return err
		}
		for _, m := range members {
			if slices.Contains(m.PeerURLs, peerURL) {
				learner = m
				return nil
			}
		}
		_, _, err = cli.AddLearner(ctx, peerURL)
		return fmt.Errorf("adding the learner: %v", err) // found in the list next time
	})
	s.eventually(3*time.Minute, "learner "+name+" started and promoted", func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		members, err := cli.Members(ctx)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(members, func(m etcd.Member) bool { return m.ID == learner.ID && !m.IsLearner }) {
			return nil // promoted, perhaps by an attempt answered with an error
		}
		return cli.Promote(ctx, learner.ID)
	})
}
