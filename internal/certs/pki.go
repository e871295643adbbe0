package certs

import (
	"crypto/x509"
	"fmt"
	"net"
	"time"
)

// Extended key usages for the common kinds of leaf certificate.
var (
	ServerUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	ClientUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	PeerUsage   = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
)

// ClusterCAs is the set of authorities and keys a control plane shares, as
// kubeadm copies them to every control plane node. CAPI names the Secrets
// that hold them <cluster>-ca, <cluster>-etcd, <cluster>-proxy and <cluster>-sa.
type ClusterCAs struct {
	Cluster *KeyPair
	// ClusterTrust is the PEM bundle of the cluster authorities machines
	// and kubeconfigs trust, which holds Cluster's certificate; nil:
	// Cluster's alone. It holds two while a cluster CA rotation runs.
	ClusterTrust []byte
	// ClusterSigner is the authority kube-controller-manager signs
	// certificate requests with; nil: Cluster. A cluster CA rotation moves
	// it to the new authority at its first stage.
	ClusterSigner *KeyPair
	Etcd          *KeyPair
	// EtcdTrust is the PEM bundle of the etcd authorities machines trust,
	// which holds Etcd's certificate; nil: Etcd's alone. It holds two
	// while an etcd CA rotation runs.
	EtcdTrust  []byte
	FrontProxy *KeyPair
	// FrontProxyTrust is the PEM bundle of the front-proxy authorities
	// API servers take request header clients of, which holds
	// FrontProxy's certificate; nil: FrontProxy's alone. It holds two
	// while a front-proxy CA rotation runs.
	FrontProxyTrust []byte
	// ServiceAccount is the key that signs service-account tokens, as
	// ServiceAccountKeyPair makes it; CAPI stores it in the <cluster>-sa
	// Secret, the public key under tls.crt.
	ServiceAccount *KeyPair
	// ServiceAccountTrust is the PEM bundle of the public keys API servers
	// take tokens of, which holds ServiceAccount's; nil: ServiceAccount's
	// alone. It holds two while a service-account key rotation runs.
	ServiceAccountTrust []byte
}

// NewClusterCAs generates every authority and key a new cluster needs.
func NewClusterCAs(now time.Time) (*ClusterCAs, error) {
	cluster, err := NewCA("kubernetes", now)
	if err != nil {
		return nil, err
	}
	etcd, err := NewCA("etcd-ca", now)
	if err != nil {
		return nil, err
	}
	proxy, err := NewCA("front-proxy-ca", now)
	if err != nil {
		return nil, err
	}
	sa, err := NewServiceAccountKeyPair()
	if err != nil {
		return nil, err
	}
	return &ClusterCAs{Cluster: cluster, Etcd: etcd, FrontProxy: proxy, ServiceAccount: sa}, nil
}

// EtcdMemberCerts are the certificates one etcd member serves with.
type EtcdMemberCerts struct {
	Server *KeyPair
	Peer   *KeyPair
}

// IssueEtcdMember issues the server and peer certificates for an etcd member
// named name listening on ip. Peer certificates carry both usages because a
// member is client and server to its peers.
func IssueEtcdMember(etcdCA *KeyPair, name string, ip net.IP, now time.Time) (*EtcdMemberCerts, error) {
	ips := []net.IP{ip, net.IPv4(127, 0, 0, 1)}
	dns := []string{name, "localhost"}
	server, err := etcdCA.Issue(Request{CommonName: name, DNSNames: dns, IPs: ips, Usages: PeerUsage}, now)
	if err != nil {
		return nil, fmt.Errorf("issuing etcd server certificate for %s: %w", name, err)
	}
	peer, err := etcdCA.Issue(Request{CommonName: name, DNSNames: dns, IPs: ips, Usages: PeerUsage}, now)
	if err != nil {
		return nil, fmt.Errorf("issuing etcd peer certificate for %s: %w", name, err)
	}
	return &EtcdMemberCerts{Server: server, Peer: peer}, nil
}

// IssueEtcdClient issues a client certificate for talking to etcd, such as
// kube-apiserver's apiserver-etcd-client or a controller's own client.
func IssueEtcdClient(etcdCA *KeyPair, name string, now time.Time) (*KeyPair, error) {
	return etcdCA.Issue(Request{CommonName: name, Usages: ClientUsage}, now)
}
