package controlplane

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
)

// certificateExpiries is status.certificates: for each kind of certificate
// the control plane runs on, the one that expires first, and where it is.
// kubeconfigLifetime is the kubeconfig's, whose renewal time s carries.
func certificateExpiries(cluster *clusterv1.Cluster, s *clusterSecrets, machines []*clusterv1.Machine, kubeconfigLifetime time.Duration) []controlplanev1.CertificateExpiry {
	var out []controlplanev1.CertificateExpiry
	add := func(kind controlplanev1.CertificateKind, notAfter time.Time, source string) {
		if !notAfter.IsZero() {
			out = append(out, controlplanev1.CertificateExpiry{Kind: kind, NotAfter: metav1.NewTime(notAfter.UTC().Truncate(time.Second)), Source: source})
		}
	}
	inSecret := func(purpose secret.Purpose) string { return "Secret " + secret.Name(cluster.Name, purpose) }
	notAfter := func(kp *certs.KeyPair) time.Time {
		if kp == nil || kp.Cert == nil {
			return time.Time{}
		}
		return kp.Cert.NotAfter
	}
	add(controlplanev1.CertificateKindClusterCA, notAfter(s.cas.Cluster), inSecret(secret.ClusterCA))
	etcdCA := notAfter(s.cas.Etcd)
	if s.external != nil {
		etcdCA = pemNotAfter(s.external.caCert)
	}
	add(controlplanev1.CertificateKindEtcdCA, etcdCA, inSecret(secret.EtcdCA))
	add(controlplanev1.CertificateKindFrontProxyCA, notAfter(s.cas.FrontProxy), inSecret(secret.FrontProxyCA))
	if !s.renewAt.IsZero() {
		add(controlplanev1.CertificateKindKubeconfig, s.renewAt.Add(kubeconfigLifetime/2), inSecret(secret.Kubeconfig))
	}
	if s.external != nil {
		add(controlplanev1.CertificateKindEtcdClient, pemNotAfter(s.external.clientCert), inSecret(secret.APIServerEtcdClient))
	}
	var first time.Time
	var firstMachine string
	for _, m := range machines {
		at, err := time.Parse(time.RFC3339, m.Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation])
		if err == nil && (first.IsZero() || at.Before(first)) {
			first, firstMachine = at, m.Name
		}
	}
	add(controlplanev1.CertificateKindMachines, first, "Machine "+firstMachine)
	return out
}

// pemNotAfter is when a PEM certificate expires; zero if it does not parse.
func pemNotAfter(data []byte) time.Time {
	c, err := certs.ParseCert(data)
	if err != nil {
		return time.Time{}
	}
	return c.NotAfter
}
