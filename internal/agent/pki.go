package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/qcp-dev/qcp/internal/atomicfile"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// PKI is what the agent issued for this machine: paths of the files the
// components read, and the in-memory identities the agent itself uses.
type PKI struct {
	Dir string

	ClusterCAPEM []byte
	EtcdCAPEM    []byte
	// Node is the machine's own kubelet identity (system:node:<name>).
	Node *certs.KeyPair
	// Admin is used once, to label the Node as a control plane node the way
	// kubeadm's mark-control-plane phase does with admin.conf: a node may
	// not set node-role labels on itself (NodeRestriction).
	Admin *certs.KeyPair
	// EtcdClient lets the agent read the member list while joining.
	EtcdClient *certs.KeyPair
}

// File returns the path of a file under the PKI directory.
func (p *PKI) File(name string) string { return filepath.Join(p.Dir, name) }

// firstServiceIP is the first address of the service range, which the
// in-cluster "kubernetes" Service gets.
func firstServiceIP(cidr string) (net.IP, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, err
	}
	ip := n.IP.To4()
	if ip == nil {
		return nil, fmt.Errorf("service range %s is not IPv4", cidr)
	}
	out := make(net.IP, 4)
	copy(out, ip)
	out[3]++
	return out, nil
}

// IssuePKI issues every certificate and kubeconfig this machine needs from
// the CA material in doc and writes them under dir/pki (0700, keys 0600).
func IssuePKI(dir string, m Machine, doc *bootstrap.Document, now time.Time) (*PKI, error) {
	p := &PKI{Dir: filepath.Join(dir, PKIDir)}
	if err := os.MkdirAll(filepath.Join(p.Dir, "etcd"), 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", p.Dir, err)
	}
	w := &pkiWriter{dir: p.Dir}
	ip := m.IP()
	c := doc.Certificates

	if c.EtcdCA != nil {
		etcdCA, err := parseCA(c.EtcdCA, doc)
		if err != nil {
			return nil, fmt.Errorf("certificates.etcdCA: %w", err)
		}
		p.EtcdCAPEM = etcdCA.CertPEM
		w.cert("etcd/ca.crt", etcdCA.CertPEM)
		if doc.Runs(bootstrap.Etcd) {
			member, err := certs.IssueEtcdMember(etcdCA, m.Name, ip, now)
			if err != nil {
				return nil, err
			}
			w.pair("etcd/server", member.Server)
			w.pair("etcd/peer", member.Peer)
		}
		if p.EtcdClient, err = certs.IssueEtcdClient(etcdCA, "qcp-agent:"+m.Name, now); err != nil {
			return nil, err
		}
		if doc.Runs(bootstrap.KubeAPIServer) {
			kp, err := certs.IssueEtcdClient(etcdCA, "kube-apiserver-etcd-client", now)
			if err != nil {
				return nil, err
			}
			w.pair("apiserver-etcd-client", kp)
		}
	}
	if ext := doc.Etcd.External; ext != nil {
		// The agent reads the member list with the API server's identity:
		// it has no etcd CA key to issue one of its own.
		client, err := certs.ParseKeyPair([]byte(ext.ClientCert), []byte(ext.ClientKey))
		if err != nil {
			return nil, fmt.Errorf("etcd.external.clientCert and clientKey: %w", err)
		}
		p.EtcdClient = client
		p.EtcdCAPEM = []byte(ext.CACert)
		w.cert("etcd/ca.crt", []byte(ext.CACert))
		w.cert("apiserver-etcd-client.crt", []byte(ext.ClientCert))
		w.key("apiserver-etcd-client.key", []byte(ext.ClientKey))
	}
	if doc.RunsKubernetes() {
		if err := p.issueKubernetes(w, m, doc, now); err != nil {
			return nil, err
		}
	}
	if w.err != nil {
		return nil, w.err
	}
	return p, nil
}

func (p *PKI) issueKubernetes(w *pkiWriter, m Machine, doc *bootstrap.Document, now time.Time) error {
	c := doc.Certificates
	ip := m.IP()
	ca, err := parseCA(c.ClusterCA, doc)
	if err != nil {
		return fmt.Errorf("certificates.clusterCA: %w", err)
	}
	p.ClusterCAPEM = ca.CertPEM
	// kube-controller-manager signs CSRs with the CA key, as on kubeadm nodes.
	w.pair("ca", ca)
	if c.ServiceAccount != nil {
		w.key("sa.key", []byte(c.ServiceAccount.PrivateKey))
		w.cert("sa.pub", []byte(c.ServiceAccount.PublicKey))
	}
	if p.Node, err = certs.IssueNodeClient(ca, m.Name, now); err != nil {
		return err
	}
	if p.Admin, err = ca.Issue(certs.Request{CommonName: "qcp-agent:" + m.Name, Organization: []string{"system:masters"}, Usages: certs.ClientUsage}, now); err != nil {
		return err
	}
	local := fmt.Sprintf("https://%s:%d", m.Address, APIServerPort)
	if doc.Runs(bootstrap.KubeAPIServer) {
		endpointHost := ""
		if doc.ControlPlaneEndpoint != "" {
			endpointHost, _, _ = net.SplitHostPort(doc.ControlPlaneEndpoint)
		}
		svcIP, err := firstServiceIP(doc.ServiceClusterIPRange())
		if err != nil {
			return fmt.Errorf("tunables.serviceClusterIPRange: %w", err)
		}
		serving, err := certs.IssueAPIServerServing(ca, ip, endpointHost, svcIP, doc.CertSANs, now)
		if err != nil {
			return err
		}
		w.pair("apiserver", serving)
		kubelet, err := certs.IssueKubeletClient(ca, now)
		if err != nil {
			return err
		}
		w.pair("apiserver-kubelet-client", kubelet)
		fp, err := parseCA(c.FrontProxyCA, doc)
		if err != nil {
			return fmt.Errorf("certificates.frontProxyCA: %w", err)
		}
		w.cert("front-proxy-ca.crt", fp.CertPEM)
		fpc, err := certs.IssueFrontProxyClient(fp, now)
		if err != nil {
			return err
		}
		w.pair("front-proxy-client", fpc)
	}
	for _, comp := range []struct {
		c         bootstrap.Component
		user, cfg string
	}{
		{bootstrap.KubeControllerManager, "system:kube-controller-manager", "controller-manager"},
		{bootstrap.KubeScheduler, "system:kube-scheduler", "scheduler"},
	} {
		if !doc.Runs(comp.c) {
			continue
		}
		kc, err := certs.ComponentKubeconfig(doc.ClusterName, local, ca, comp.user, now)
		if err != nil {
			return err
		}
		w.key(comp.cfg+".conf", kc)
		serving, err := certs.IssueServing(ca, string(comp.c), ip, now)
		if err != nil {
			return err
		}
		w.pair(comp.cfg+"-serving", serving)
	}
	return nil
}

// pkiWriter remembers the first error so the issuing code reads top-down.
type pkiWriter struct {
	dir string
	err error
}

func (w *pkiWriter) write(name string, data []byte, mode os.FileMode) {
	if w.err != nil {
		return
	}
	w.err = atomicfile.Write(filepath.Join(w.dir, name), data, mode)
}

func (w *pkiWriter) cert(name string, pem []byte) { w.write(name, pem, 0o644) }
func (w *pkiWriter) key(name string, pem []byte)  { w.write(name, pem, 0o600) }
func (w *pkiWriter) pair(base string, kp *certs.KeyPair) {
	w.cert(base+".crt", kp.CertPEM)
	w.key(base+".key", kp.KeyPEM)
}

// parseCA parses a CA of the bootstrap data, set to issue the machine's
// certificates for the document's validity.
func parseCA(ck *bootstrap.CertKey, doc *bootstrap.Document) (*certs.KeyPair, error) {
	ca, err := certs.ParseKeyPair([]byte(ck.Cert), []byte(ck.Key))
	if err != nil {
		return nil, err
	}
	ca.LeafValidity = doc.LeafValidity()
	return ca, nil
}
