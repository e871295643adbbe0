package controlplane

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
)

// TestCertificateExpiries: stacked etcd reports its three authorities, the
// kubeconfig and the machine whose certificates expire first; external
// etcd reports the etcd CA and the API servers' client pair from its
// Secrets. A machine without a record is left out.
func TestCertificateExpiries(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	cas, err := certs.NewClusterCAs(now)
	if err != nil {
		t.Fatal(err)
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c1"}}
	machine := func(name, expiry string) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if expiry != "" {
			m.Annotations = map[string]string{clusterv1.MachineCertificatesExpiryDateAnnotation: expiry}
		}
		return m
	}
	machines := []*clusterv1.Machine{machine("m-1", "2027-11-26T12:00:00Z"), machine("m-2", "2027-10-01T08:00:00Z"), machine("m-3", "")}
	const lifetime = 24 * time.Hour
	s := &clusterSecrets{cas: cas, renewAt: now.Add(lifetime / 2)}
	got := certificateExpiries(cluster, s, machines, lifetime)
	ca := cas.Cluster.Cert.NotAfter
	want := []controlplanev1.CertificateExpiry{
		{Kind: controlplanev1.CertificateKindClusterCA, NotAfter: metav1.NewTime(ca), Source: "Secret c1-ca"},
		{Kind: controlplanev1.CertificateKindEtcdCA, NotAfter: metav1.NewTime(cas.Etcd.Cert.NotAfter), Source: "Secret c1-etcd"},
		{Kind: controlplanev1.CertificateKindFrontProxyCA, NotAfter: metav1.NewTime(cas.FrontProxy.Cert.NotAfter), Source: "Secret c1-proxy"},
		{Kind: controlplanev1.CertificateKindKubeconfig, NotAfter: metav1.NewTime(now.Add(lifetime)), Source: "Secret c1-kubeconfig"},
		{Kind: controlplanev1.CertificateKindMachines, NotAfter: metav1.NewTime(time.Date(2027, 10, 1, 8, 0, 0, 0, time.UTC)), Source: "Machine m-2"},
	}
	check := func(name string, got, want []controlplanev1.CertificateExpiry) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d kinds %+v; want %d %+v", name, len(got), got, len(want), want)
		}
		for i := range want {
			if got[i].Kind != want[i].Kind || !got[i].NotAfter.Equal(&want[i].NotAfter) || got[i].Source != want[i].Source {
				t.Errorf("%s: %+v; want %+v", name, got[i], want[i])
			}
		}
	}
	check("stacked", got, want)

	client, err := certs.IssueEtcdClient(cas.Etcd, "kube-apiserver-etcd-client", now)
	if err != nil {
		t.Fatal(err)
	}
	external := &clusterSecrets{cas: &certs.ClusterCAs{Cluster: cas.Cluster, FrontProxy: cas.FrontProxy}, renewAt: s.renewAt,
		external: &externalEtcd{caCert: cas.Etcd.CertPEM, clientCert: client.CertPEM, clientKey: client.KeyPEM}}
	wantExternal := append(append([]controlplanev1.CertificateExpiry{}, want[:4]...),
		controlplanev1.CertificateExpiry{Kind: controlplanev1.CertificateKindEtcdClient, NotAfter: metav1.NewTime(client.Cert.NotAfter), Source: "Secret c1-apiserver-etcd-client"})
	check("external", certificateExpiries(cluster, external, nil, lifetime), wantExternal)
}
