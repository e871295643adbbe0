package certs

import (
	"fmt"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kubeconfig builds a kubeconfig for user, trusting caPEM, pointed at server
// (for example https://127.0.10.1:6443).
func Kubeconfig(clusterName, server string, caPEM []byte, userName string, user *KeyPair) ([]byte, error) {
	ctx := userName + "@" + clusterName
	cfg := clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{
			clusterName: {Server: server, CertificateAuthorityData: caPEM},
		},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{
			userName: {ClientCertificateData: user.CertPEM, ClientKeyData: user.KeyPEM},
		},
		Contexts:       map[string]*clientcmdapi.Context{ctx: {Cluster: clusterName, AuthInfo: userName}},
		CurrentContext: ctx,
	}
	out, err := clientcmd.Write(cfg)
	if err != nil {
		return nil, fmt.Errorf("writing kubeconfig for %s: %w", clusterName, err)
	}
	return out, nil
}

// AdminKubeconfig issues a system:masters client certificate from the cluster
// CA and returns a kubeconfig for it, as kubeadm's admin.conf.
func AdminKubeconfig(clusterName, server string, ca *KeyPair, now time.Time) ([]byte, error) {
	return AdminKubeconfigValidFor(clusterName, server, ca, nil, now, 0)
}

// AdminKubeconfigValidFor is AdminKubeconfig with a client certificate valid
// for validity (0 means LeafValidity), for kubeconfigs that are rotated,
// trusting the PEM bundle trust (nil: ca alone; a cluster CA rotation
// trusts two).
func AdminKubeconfigValidFor(clusterName, server string, ca *KeyPair, trust []byte, now time.Time, validity time.Duration) ([]byte, error) {
	kp, err := ca.Issue(Request{CommonName: "kubernetes-admin", Organization: []string{"system:masters"}, Usages: ClientUsage, Validity: validity}, now)
	if err != nil {
		return nil, err
	}
	if trust == nil {
		trust = ca.CertPEM
	}
	return Kubeconfig(clusterName, server, trust, "kubernetes-admin", kp)
}

// ComponentKubeconfig returns a kubeconfig for a control plane component
// identity such as system:kube-controller-manager.
func ComponentKubeconfig(clusterName, server string, ca *KeyPair, user string, now time.Time) ([]byte, error) {
	return userKubeconfig(clusterName, server, ca, user, nil, now)
}

func userKubeconfig(clusterName, server string, ca *KeyPair, user string, groups []string, now time.Time) ([]byte, error) {
	kp, err := ca.Issue(Request{CommonName: user, Organization: groups, Usages: ClientUsage}, now)
	if err != nil {
		return nil, err
	}
	return Kubeconfig(clusterName, server, ca.CertPEM, user, kp)
}
