package certs

import (
	"fmt"
	"net"
	"slices"
	"time"
)

// APIServerServingSANs returns the DNS names and IPs kube-apiserver's serving
// certificate needs, as kubeadm sets them: the machine's address, the
// control plane endpoint host, loopback, the in-cluster service names and the
// first service IP, then extra (each an IP address or a DNS name, like
// kubeadm's certSANs) for names clients reach the API server by that QCP
// cannot know, such as a DNS name in front of the load balancer. A name
// listed twice is kept once.
func APIServerServingSANs(machineIP net.IP, endpointHost string, firstServiceIP net.IP, extra []string) ([]string, []net.IP) {
	dns := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}
	ips := []net.IP{machineIP, net.IPv4(127, 0, 0, 1)}
	if firstServiceIP != nil {
		ips = append(ips, firstServiceIP)
	}
	add := func(name string) {
		if ip := net.ParseIP(name); ip != nil {
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
			return
		}
		if !slices.Contains(dns, name) {
			dns = append(dns, name)
		}
	}
	if endpointHost != "" {
		add(endpointHost)
	}
	for _, name := range extra {
		if name != "" {
			add(name)
		}
	}
	return dns, ips
}

// IssueAPIServerServing issues kube-apiserver's serving certificate; see
// APIServerServingSANs for its names.
func IssueAPIServerServing(ca *KeyPair, machineIP net.IP, endpointHost string, firstServiceIP net.IP, extraSANs []string, now time.Time) (*KeyPair, error) {
	dns, ips := APIServerServingSANs(machineIP, endpointHost, firstServiceIP, extraSANs)
	kp, err := ca.Issue(Request{CommonName: "kube-apiserver", DNSNames: dns, IPs: ips, Usages: ServerUsage}, now)
	if err != nil {
		return nil, fmt.Errorf("issuing kube-apiserver serving certificate for %s: %w", machineIP, err)
	}
	return kp, nil
}

// IssueServing issues a serving certificate for a component (such as
// kube-controller-manager or kube-scheduler) listening on ip.
func IssueServing(ca *KeyPair, commonName string, ip net.IP, now time.Time) (*KeyPair, error) {
	kp, err := ca.Issue(Request{CommonName: commonName, DNSNames: []string{"localhost"}, IPs: []net.IP{ip, net.IPv4(127, 0, 0, 1)}, Usages: ServerUsage}, now)
	if err != nil {
		return nil, fmt.Errorf("issuing serving certificate %s for %s: %w", commonName, ip, err)
	}
	return kp, nil
}

// IssueKubeletClient issues the certificate kube-apiserver presents to
// kubelets (apiserver-kubelet-client in kubeadm).
func IssueKubeletClient(ca *KeyPair, now time.Time) (*KeyPair, error) {
	return ca.Issue(Request{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"kubeadm:cluster-admins"}, Usages: ClientUsage}, now)
}

// IssueFrontProxyClient issues the certificate kube-apiserver presents to
// aggregated API servers; its CN must match --requestheader-allowed-names.
func IssueFrontProxyClient(frontProxyCA *KeyPair, now time.Time) (*KeyPair, error) {
	return frontProxyCA.Issue(Request{CommonName: FrontProxyClientName, Usages: ClientUsage}, now)
}

// FrontProxyClientName is the CN of the front-proxy client certificate.
const FrontProxyClientName = "front-proxy-client"

// IssueNodeClient issues a node's client certificate, the identity the Node
// authorizer and NodeRestriction admission recognise.
func IssueNodeClient(ca *KeyPair, nodeName string, now time.Time) (*KeyPair, error) {
	return ca.Issue(Request{CommonName: "system:node:" + nodeName, Organization: []string{"system:nodes"}, Usages: ClientUsage}, now)
}
