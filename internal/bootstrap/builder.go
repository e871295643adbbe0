package bootstrap

import (
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/certs"
)

// NewStacked returns the document for a stacked control plane machine: an
// etcd member plus kube-apiserver, kube-controller-manager and
// kube-scheduler, at the default pinned versions. endpoint is the load
// balancer's host:port ("" to use the machine's own API server). Use
// NewMember or JoinMember for etcd.
func NewStacked(clusterName string, cas *certs.ClusterCAs, endpoint string, etcd LocalEtcd) *Document {
	d := base(clusterName, endpoint)
	d.Components = []Component{Etcd, KubeAPIServer, KubeControllerManager, KubeScheduler}
	d.Versions.Etcd = binaries.EtcdVersion
	d.Etcd.Local = &etcd
	d.Certificates = CAMaterialFrom(cas)
	return d
}

// NewExternal returns the document for a control plane machine whose API
// server uses an external etcd cluster.
func NewExternal(clusterName string, cas *certs.ClusterCAs, endpoint string, ext ExternalEtcd) *Document {
	d := base(clusterName, endpoint)
	d.Components = []Component{KubeAPIServer, KubeControllerManager, KubeScheduler}
	d.Etcd.External = &ext
	d.Certificates = CAMaterialFrom(cas)
	d.Certificates.EtcdCA = nil
	return d
}

// NewEtcdOnly returns the document for a machine of a managed external etcd
// cluster: only an etcd member, issued from etcdCA.
func NewEtcdOnly(clusterName string, etcdCA *certs.KeyPair, etcd LocalEtcd) *Document {
	d := base(clusterName, "")
	d.Components = []Component{Etcd}
	d.Versions = Versions{Etcd: binaries.EtcdVersion}
	d.Etcd.Local = &etcd
	d.Certificates.EtcdCA = certKey(etcdCA)
	return d
}

// NewMember is the etcd section of the first member of a new cluster.
func NewMember() LocalEtcd { return LocalEtcd{Mode: EtcdModeNew} }

// JoinMember is the etcd section of a member joining through the client
// URLs of running members (it must already be added as a learner).
func JoinMember(existingEndpoints ...string) LocalEtcd {
	return LocalEtcd{Mode: EtcdModeExisting, ExistingEndpoints: existingEndpoints}
}

// CAMaterialFrom copies a cluster's authorities into a document's
// certificates section.
func CAMaterialFrom(cas *certs.ClusterCAs) CAMaterial {
	return CAMaterial{
		ClusterCA:       certKey(cas.Cluster),
		ClusterTrust:    string(cas.ClusterTrust),
		ClusterSigner:   certKey(cas.ClusterSigner),
		EtcdCA:          certKey(cas.Etcd),
		EtcdTrust:       string(cas.EtcdTrust),
		FrontProxyCA:    certKey(cas.FrontProxy),
		FrontProxyTrust: string(cas.FrontProxyTrust),
		ServiceAccount:  serviceAccount(cas),
	}
}

func base(clusterName, endpoint string) *Document {
	return &Document{
		APIVersion:           APIVersion,
		Kind:                 Kind,
		ClusterName:          clusterName,
		ControlPlaneEndpoint: endpoint,
		Versions:             Versions{Kubernetes: binaries.KubeVersion},
	}
}

// serviceAccount is the service-account key pair a machine signs tokens
// with, and the public keys it takes tokens of (two while a rotation
// runs).
func serviceAccount(cas *certs.ClusterCAs) *ServiceAccountKP {
	if cas.ServiceAccount == nil {
		return nil
	}
	pub := cas.ServiceAccountTrust
	if pub == nil {
		pub = cas.ServiceAccount.CertPEM
	}
	return &ServiceAccountKP{PrivateKey: string(cas.ServiceAccount.KeyPEM), PublicKey: string(pub)}
}

func certKey(kp *certs.KeyPair) *CertKey {
	if kp == nil {
		return nil
	}
	return &CertKey{Cert: string(kp.CertPEM), Key: string(kp.KeyPEM)}
}
