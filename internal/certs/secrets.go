package certs

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
)

// AuthorityAlgorithm is the key algorithm QCP asks CAPI's util/secret for
// when it generates a cluster's authorities: ECDSA P-256, as this package's
// own certificates. util/secret's default, RSA-2048, took about 65 ms a key
// on an idle 2-core machine, and several times that under load, all in a
// new cluster's first round, before its first machine.
const AuthorityAlgorithm = bootstrapv1.EncryptionAlgorithmECDSAP256

// Secrets returns the Secrets that hold cas for cluster, named, typed and
// labelled as CAPI's util/secret names them (<cluster>-ca, -etcd, -proxy,
// -sa; tls.crt and tls.key), so CAPI core and other providers find them.
func Secrets(namespace, cluster string, cas *ClusterCAs) []*corev1.Secret {
	return []*corev1.Secret{
		capiSecret(namespace, cluster, secret.ClusterCA, cas.Cluster.CertPEM, cas.Cluster.KeyPEM),
		capiSecret(namespace, cluster, secret.EtcdCA, cas.Etcd.CertPEM, cas.Etcd.KeyPEM),
		capiSecret(namespace, cluster, secret.FrontProxyCA, cas.FrontProxy.CertPEM, cas.FrontProxy.KeyPEM),
		// CAPI keeps the service-account public key under tls.crt.
		capiSecret(namespace, cluster, secret.ServiceAccount, cas.ServiceAccount.CertPEM, cas.ServiceAccount.KeyPEM),
	}
}

// KubeconfigSecret returns the <cluster>-kubeconfig Secret CAPI core reaches
// the workload cluster through.
func KubeconfigSecret(namespace, cluster string, kubeconfig []byte) *corev1.Secret {
	s := capiSecret(namespace, cluster, secret.Kubeconfig, nil, nil)
	s.Data = map[string][]byte{secret.KubeconfigDataName: kubeconfig}
	return s
}

// ClusterCAsFromSecrets reads the authorities back from the Secrets that
// Secrets returns, keyed by their names.
func ClusterCAsFromSecrets(cluster string, byName map[string]*corev1.Secret) (*ClusterCAs, error) {
	return clusterCAsFromSecrets(cluster, byName, true)
}

// ClusterCAsWithoutEtcd is ClusterCAsFromSecrets for a control plane whose
// etcd is external: byName need not hold the etcd CA, and Etcd is then nil.
func ClusterCAsWithoutEtcd(cluster string, byName map[string]*corev1.Secret) (*ClusterCAs, error) {
	return clusterCAsFromSecrets(cluster, byName, false)
}

func clusterCAsFromSecrets(cluster string, byName map[string]*corev1.Secret, withEtcd bool) (*ClusterCAs, error) {
	pair := func(purpose secret.Purpose) (*KeyPair, error) {
		name := secret.Name(cluster, purpose)
		s, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("secret %s is missing", name)
		}
		kp, err := ParseAuthority(purpose, s.Data[secret.TLSCrtDataName], s.Data[secret.TLSKeyDataName])
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", name, err)
		}
		return kp, nil
	}
	var cas ClusterCAs
	var err error
	if cas.Cluster, err = pair(secret.ClusterCA); err != nil {
		return nil, err
	}
	if withEtcd {
		if cas.Etcd, err = pair(secret.EtcdCA); err != nil {
			return nil, err
		}
	}
	if cas.FrontProxy, err = pair(secret.FrontProxyCA); err != nil {
		return nil, err
	}
	if cas.ServiceAccount, err = pair(secret.ServiceAccount); err != nil {
		return nil, err
	}
	return &cas, nil
}

// ParseAuthority parses the PEM pair of an authority's Secret of purpose,
// or of a rotation's Secret of it (<purpose>-next, <purpose>-previous): a
// certificate and its key, or for the service-account key
// (secret.ServiceAccount) a public key and its private key
// (ParseServiceAccountKeyPair).
func ParseAuthority(purpose secret.Purpose, crt, key []byte) (*KeyPair, error) {
	if isServiceAccount(purpose) {
		return ParseServiceAccountKeyPair(crt, key)
	}
	return ParseKeyPair(crt, key)
}

// NewAuthority generates an authority for the Secret of purpose, as
// ParseAuthority reads it: a CA named commonName, or a service-account key.
func NewAuthority(purpose secret.Purpose, commonName string, now time.Time) (*KeyPair, error) {
	if isServiceAccount(purpose) {
		return NewServiceAccountKeyPair()
	}
	return NewCA(commonName, now)
}

// isServiceAccount says whether purpose is the service-account key's
// Secret, or a rotation's Secret of it.
func isServiceAccount(purpose secret.Purpose) bool {
	base, _, _ := strings.Cut(string(purpose), "-")
	return secret.Purpose(base) == secret.ServiceAccount
}

func capiSecret(namespace, cluster string, purpose secret.Purpose, crt, key []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: secret.Name(cluster, purpose), Namespace: namespace,
			Labels: map[string]string{clusterv1.ClusterNameLabel: cluster},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{secret.TLSCrtDataName: crt, secret.TLSKeyDataName: key},
	}
}
