package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestExternalEtcdEndpoints runs a control plane on an etcd the test
// starts itself, given by spec.etcd.external.endpoints, with the contract
// Secrets as whoever runs such an etcd provides them: the CA's certificate
// alone, and the API servers' client pair. Its preflight checks only that
// etcd answers: while the etcd is not started, no machine is created and
// the control plane says why; once it is, the control plane reaches
// Available, runs no etcd of its own and stores its data in that etcd, the
// test kit's writer and monitor running against it meanwhile.
func TestExternalEtcdEndpoints(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 35*time.Second)
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
	client, err := certs.IssueEtcdClient(ext.CA, "kube-apiserver-etcd-client", time.Now())
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
	s.finish()
}
