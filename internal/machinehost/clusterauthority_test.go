package machinehost

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// clusterLeaves are the leaves a stacked machine issues from the cluster CA.
var clusterLeaves = []string{"apiserver.crt", "apiserver-kubelet-client.crt", "controller-manager.conf", "controller-manager-serving.crt",
	"scheduler.conf", "scheduler-serving.crt", "memory:node", "memory:admin"}

// TestClusterAuthorityMove takes a running stacked machine through the
// machine's part of a cluster CA rotation with PUT /pki/cluster-authority:
// trusting the new authority beside the old (kube-apiserver,
// kube-controller-manager and kube-scheduler restart with the bundle, and
// kube-apiserver takes clients of the new one), moving every leaf of the cluster
// CA to the new one (kube-apiserver serves the new serving certificate
// without a restart), and distrusting the old one (a client of the old
// authority is refused, after the same restarts). etcd is never restarted, the Node keeps its
// lease, and kube-root-ca.crt ends up holding the new authority alone.
func TestClusterAuthorityMove(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real etcd and Kubernetes components")
	}
	testkit.RequireBinaries(t, "etcd", "kube")
	h := newHost(t)
	c := newTestCluster(t, h, "ns-clusterca", "cclusterca")
	m1 := c.spec("m1", "fd-a")
	c.start(m1, bootstrap.NewMember(), []string{m1.Address + ":6443"})
	c.waitNodeReady("m1", corev1.ConditionTrue, 3*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	oldCA := c.cas.Cluster
	newCA, err := certs.NewCA("kubernetes-next", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	both := certs.Bundle(oldCA, newCA)
	// The load balancer probes the API servers with both, as the process
	// provider does while <cluster>-ca-next exists.
	if err := h.StartLB(c.ns, c.cl, c.lbAddr, both); err != nil {
		t.Fatal(err)
	}
	server := "https://" + m1.Address + ":6443"
	asOld, asNew := testkit.AdminClient(t, c.cl, server, oldCA, both), testkit.AdminClient(t, c.cl, server, newCA, both)
	manager := etcdTLS(t, c.cas.Etcd, true)
	watched := []bootstrap.Component{bootstrap.Etcd, bootstrap.KubeAPIServer, bootstrap.KubeControllerManager, bootstrap.KubeScheduler}
	set := func(ca *certs.KeyPair, trust []byte, wantMoved bool, wantRestarted ...string) agent.AuthorityResult {
		t.Helper()
		return c.setAuthority(ctx, m1, manager, agent.ClusterAuthorityKind, ca, trust, wantMoved, "the cluster authorities its kubeconfig trusts", watched, wantRestarted...)
	}
	answers := func(cs kubernetes.Interface) error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cs.CoreV1().Namespaces().Get(cctx, metav1.NamespaceDefault, metav1.GetOptions{})
		return err
	}
	if err := answers(asNew); err == nil {
		t.Fatal("kube-apiserver took a client of the new authority before trusting it")
	}
	kubeconfigReaders := []string{string(bootstrap.KubeControllerManager), string(bootstrap.KubeScheduler)}
	withAPIServer := append([]string{string(bootstrap.KubeAPIServer)}, kubeconfigReaders...)

	// 1. Trust both: kube-apiserver restarts to read its client CA bundle.
	set(oldCA, both, false, withAPIServer...)
	c.eventually("kube-apiserver taking a client of the new authority", 90*time.Second, func() error { return answers(asNew) })
	// 2. Move the leaves: kube-apiserver reloads its serving certificate.
	res := set(newCA, both, true, kubeconfigReaders...)
	for _, want := range clusterLeaves {
		if !slices.Contains(res.Moved, want) {
			t.Errorf("moved %v, want %s among them", res.Moved, want)
		}
	}
	apiTLS := &tls.Config{RootCAs: pool(t, both), MinVersion: tls.VersionTLS12}
	c.eventually("kube-apiserver serving a certificate of the new authority", 90*time.Second, func() error {
		if got := presented(t, m1.Address, agent.APIServerPort, apiTLS); certs.IssuerKeyID(got) != certs.KeyID(newCA.Cert) {
			return fmt.Errorf("it serves a certificate of %s", got.Issuer.CommonName)
		}
		return nil
	})
	// 3. Distrust the old authority.
	res = set(newCA, newCA.CertPEM, false, withAPIServer...)
	for _, name := range clusterLeaves {
		if got, ok := res.Report.Find(name); !ok || got.IssuerKeyID != certs.KeyID(newCA.Cert) {
			t.Errorf("%s: %+v; want it issued by the new authority", name, got)
		}
	}
	if all := res.Report.All(agent.ClusterTrustFile); len(all) != 1 || all[0].KeyID != certs.KeyID(newCA.Cert) {
		t.Errorf("%s holds %+v; want the new authority alone", agent.ClusterTrustFile, all)
	}
	c.eventually("kube-apiserver refusing a client of the old authority", 90*time.Second, func() error {
		if err := answers(asOld); err == nil {
			return errors.New("still taken")
		}
		return answers(asNew)
	})
	// The Node keeps its lease, renewed through the agent's rebuilt
	// clients, and kube-root-ca.crt follows the controller manager's
	// --root-ca-file.
	answered := time.Now()
	c.eventually("the Node's lease renewed after the rotation", time.Minute, func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := asNew.CoordinationV1().Leases("kube-node-lease").Get(cctx, m1.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(answered) {
			return fmt.Errorf("renewed at %v", l.Spec.RenewTime)
		}
		return nil
	})
	c.eventually("kube-root-ca.crt holding the new authority alone", 2*time.Minute, func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		cm, err := asNew.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(cctx, "kube-root-ca.crt", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ids, err := certs.BundleKeyIDs([]byte(cm.Data["ca.crt"]))
		if err != nil || ids != certs.KeyID(newCA.Cert) {
			return fmt.Errorf("it holds %s (%v)", ids, err)
		}
		return nil
	})
	c.checkNoRaces()
}
