package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestExternalEtcdEndpoints runs a control plane on an etcd the test
// starts itself, given by spec.etcd.external.endpoints, with the contract
// Secrets as whoever runs such an etcd provides them: the CA's certificate
// alone, and the API servers' client pair. Its preflight checks only that
// etcd answers: while the etcd is not started, no machine is created and
// the control plane says why; once it is, the control plane reaches
// Available, runs no etcd of its own and stores its data in that etcd, the
// test kit's writer and monitor running against it meanwhile. Then the
// owner replaces the client pair in its Secret, as a user rotating it
// would: the machine holds the new pair within a minute, and once the
// first pair has expired and etcd restarted (every connection to it made
// again), the API still writes.
func TestExternalEtcdEndpoints(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, firstPairLifetime+30*time.Second)
	const name = "external-endpoints"
	ext := testkit.NewEtcdCluster(t, name)
	member, err := ext.NewMember(name + "-etcd")
	if err != nil {
		t.Fatal(err)
	}
	s, cp := newScenarioWithoutControlPlane(t, mgmt, name, 1, failureDomains, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Etcd.External = &controlplanev1.ExternalEtcd{Endpoints: []string{member.ClientURL()}}
	})
	// The cluster goes before its etcd does (cleanups run last first): a
	// control plane left on an etcd that is gone would keep failing its
	// 5-second connectivity checks on qcp-manager's one worker, and slow
	// every other scenario's control plane.
	t.Cleanup(s.deleteCluster)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	client, err := certs.IssueEtcdClient(ext.CA.WithLeafValidity(firstPairLifetime), "kube-apiserver-etcd-client", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	contract := func(purpose secret.Purpose, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: secret.Name(name, purpose), Namespace: ns, Labels: map[string]string{clusterv1.ClusterNameLabel: name}},
			Type:       clusterv1.ClusterSecretType, Data: data,
		}
	}
	s.create(ctx,
		contract(secret.EtcdCA, map[string][]byte{secret.TLSCrtDataName: ext.CA.CertPEM}),
		contract(secret.APIServerEtcdClient, map[string][]byte{secret.TLSCrtDataName: client.CertPEM, secret.TLSKeyDataName: client.KeyPEM}),
		cp)

	s.eventually(2*time.Minute, "the control plane saying its etcd does not answer", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if msg := conditions.GetMessage(cp, controlplanev1.EtcdClusterHealthyCondition); !conditions.IsFalse(cp, controlplanev1.EtcdClusterHealthyCondition) ||
			!strings.Contains(msg, "no etcd endpoint passes /health") || !strings.Contains(msg, member.ClientURL()) {
			return fmt.Errorf("EtcdClusterHealthy: %q", msg)
		}
		if !strings.Contains(cp.Status.LastOperation.Reason, "waiting for the external etcd") {
			return fmt.Errorf("last operation %s: %s", cp.Status.LastOperation.Kind, cp.Status.LastOperation.Reason)
		}
		return nil
	})
	s.holds(10*time.Second, "no machine created while the external etcd does not answer", s.machinesStay(0))
	if err := member.Start(testkit.InitialCluster(member), "new"); err != nil {
		t.Fatal(err)
	}
	tr, err := startTraffic(ext.Config(member.ClientURL()), 1, scenarioWriterPause)
	if err != nil {
		t.Fatal(err)
	}
	s.traffic = tr
	s.waitExternalAvailable(convergeTimeout, 1)
	s.runNoEtcd(ctx)
	s.storesIn(ctx, ext.Config(member.ClientURL()))
	s.checkReplacedPair(ctx, ext.CA, client)
	if err := member.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := member.Restart(); err != nil {
		t.Fatal(err)
	}
	s.eventually(2*time.Minute, "a write through the API once the first pair expired and etcd restarted", func(ctx context.Context) error {
		wl, err := s.workload(ctx)
		if err != nil {
			return err
		}
		_, err = wl.CoreV1().ConfigMaps(metav1.NamespaceDefault).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "rotated-"}}, metav1.CreateOptions{})
		return err
	})
	s.waitExternalAvailable(time.Minute, 1)
	s.checkReplacedAuthority(ctx)
	s.finish()
}

// checkReplacedAuthority replaces the etcd CA's Secret by hand with another
// authority: the control plane refuses it with a condition naming the
// Secret, and changes nothing (no machine, no kubeconfig) while it is
// there; put back, it is taken again.
func (s *scenario) checkReplacedAuthority(ctx context.Context) {
	s.t.Helper()
	key := client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.EtcdCA)}
	var ca, kubeconfig corev1.Secret
	if err := s.reader(ctx).Get(ctx, key, &ca); err != nil {
		s.t.Fatal(err)
	}
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.Kubeconfig)}, &kubeconfig); err != nil {
		s.t.Fatal(err)
	}
	before, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	other, err := certs.NewCA("other-etcd-ca", time.Now())
	if err != nil {
		s.t.Fatal(err)
	}
	original := ca.Data
	ca.Data = map[string][]byte{secret.TLSCrtDataName: other.CertPEM}
	if err := s.c.Update(ctx, &ca); err != nil {
		s.t.Fatal(err)
	}
	s.eventually(time.Minute, "the replaced etcd CA refused", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		c := conditions.Get(cp, controlplanev1.CertificatesAvailableCondition)
		if c == nil || c.Reason != controlplanev1.CertificateAuthorityReplacedReason || !strings.Contains(c.Message, "Secret "+key.Name) {
			return fmt.Errorf("CertificatesAvailable %+v", c)
		}
		return nil
	})
	s.holds(10*time.Second, "nothing changed while the etcd CA is replaced", func(ctx context.Context) error {
		if err := s.controlPlaneUnchanged(before)(ctx); err != nil {
			return err
		}
		var now corev1.Secret
		if err := s.reader(ctx).Get(ctx, client.ObjectKeyFromObject(&kubeconfig), &now); err != nil {
			return err
		}
		if now.ResourceVersion != kubeconfig.ResourceVersion {
			return errors.New("the kubeconfig Secret was written")
		}
		return nil
	})
	if err := s.reader(ctx).Get(ctx, key, &ca); err != nil {
		s.t.Fatal(err)
	}
	ca.Data = original
	if err := s.c.Update(ctx, &ca); err != nil {
		s.t.Fatal(err)
	}
	s.eventually(time.Minute, "the etcd CA put back taken again", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if !conditions.IsTrue(cp, controlplanev1.CertificatesAvailableCondition) {
			return fmt.Errorf("CertificatesAvailable: %s", conditions.GetMessage(cp, controlplanev1.CertificatesAvailableCondition))
		}
		return nil
	})
}

// firstPairLifetime is how long the first client pair of the external etcd
// scenario lives: past the control plane's creation, so that it expires
// after its replacement, within the scenario.
const firstPairLifetime = 4 * time.Minute

// checkReplacedPair replaces the client pair in <cluster>-apiserver-etcd-client
// with a new one of ca, as an external etcd's owner rotating it would, and
// waits for every machine to hold it within a minute; then it waits for
// first to expire.
func (s *scenario) checkReplacedPair(ctx context.Context, ca *certs.KeyPair, first *certs.KeyPair) {
	s.t.Helper()
	replaced, err := certs.IssueEtcdClient(ca, "kube-apiserver-etcd-client", time.Now())
	if err != nil {
		s.t.Fatal(err)
	}
	var sec corev1.Secret
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.APIServerEtcdClient)}, &sec); err != nil {
		s.t.Fatal(err)
	}
	sec.Data = map[string][]byte{secret.TLSCrtDataName: replaced.CertPEM, secret.TLSKeyDataName: replaced.KeyPEM}
	if err := s.c.Update(ctx, &sec); err != nil {
		s.t.Fatal(err)
	}
	start := time.Now()
	host := &machinehost.Host{Root: s.mgmt.env.MachineRoot()}
	s.eventually(time.Minute, "every machine holding the replaced client pair", func(ctx context.Context) error {
		machines, err := s.machines(ctx)
		if err != nil {
			return err
		}
		for _, m := range machines {
			leaves, err := machineLeaves(host.DataDir(ns, m.Name))
			if err != nil {
				return err
			}
			if c := leaves["apiserver-etcd-client.crt"]; c == nil || c.SerialNumber.Cmp(replaced.Cert.SerialNumber) != 0 {
				return fmt.Errorf("machine %s holds another pair", m.Name)
			}
		}
		return nil
	})
	s.t.Logf("every machine held the replaced client pair %s after it was put in the Secret", time.Since(start).Round(time.Second))
	s.waitExpired(first.Cert.NotAfter)
}
