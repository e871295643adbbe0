package agent

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/qcp-dev/qcp/internal/atomicfile"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// PKI is what the agent issued for this machine: paths of the files the
// components read, and the in-memory identities the agent itself uses.
type PKI struct {
	Dir string

	// clusterCA issues the leaves of the cluster CA (nil on a machine
	// without Kubernetes components); a cluster CA rotation replaces it.
	clusterCA *certs.KeyPair

	// clusterSigner is what kube-controller-manager signs certificate
	// requests with, pki/ca.crt and ca.key: clusterCA, or from the first
	// stage of a cluster CA rotation on, the new authority.
	clusterSigner *certs.KeyPair

	// frontProxyCA issues the API server's front-proxy client certificate
	// (nil on a machine without an API server); a front-proxy CA rotation
	// replaces it.
	frontProxyCA *certs.KeyPair

	// serviceAccount is the key kube-apiserver signs service-account
	// tokens with, and kube-controller-manager legacy token Secrets (nil on
	// a machine without either); a service-account key rotation replaces
	// it.
	serviceAccount *certs.KeyPair

	// etcdCA issues the etcd leaves (nil on an external etcd's machine);
	// an etcd CA rotation replaces it (MoveEtcdLeaves).
	etcdCA *certs.KeyPair

	// leaves are the certificates the agent issued, which Renew signs
	// again; the authorities, the service-account key and an external
	// etcd client pair came with the bootstrap data and are not among
	// them. Only Renew changes them, and its callers serialize it.
	leaves []*leaf

	// mu guards the identities, which Renew replaces while they are used,
	// and the etcd trust bundle, which a rotation replaces.
	mu sync.Mutex
	// etcdTrust is the PEM bundle of the etcd authorities this machine
	// trusts: etcd/ca.crt.
	etcdTrust []byte
	// clusterTrust is the PEM bundle of the cluster authorities it
	// trusts: ca-bundle.crt, the components' client CA, and the CA of
	// every kubeconfig and client of the agent.
	clusterTrust []byte
	// frontProxyTrust is the PEM bundle of the front-proxy authorities it
	// trusts: front-proxy-ca.crt, the components' request header client CA.
	frontProxyTrust []byte
	// serviceAccountTrust is the PEM bundle of the public keys
	// kube-apiserver takes service-account tokens of: sa.pub.
	serviceAccountTrust []byte
	// node is the machine's own kubelet identity (system:node:<name>).
	node *certs.KeyPair
	// admin is used once, to label the Node as a control plane node the
	// way kubeadm's mark-control-plane phase does with admin.conf: a node
	// may not set node-role labels on itself (NodeRestriction).
	admin *certs.KeyPair
	// etcdClient lets the agent read the member list while joining.
	etcdClient *certs.KeyPair
}

// Names of the in-memory identities among the leaves.
const (
	memoryNode       = "memory:node"
	memoryAdmin      = "memory:admin"
	memoryEtcdClient = "memory:etcd-client"
)

// leaf is one certificate the agent issued, and where its readers find it.
type leaf struct {
	// name is the file under the PKI directory, or memory:<identity>.
	name string
	ca   *certs.KeyPair
	kp   *certs.KeyPair
	// put writes kp where its reader finds it, or swaps the identity.
	put func(w *pkiWriter, kp *certs.KeyPair)
	// kubeconfig: put writes a kubeconfig, which embeds the trust bundle.
	kubeconfig bool
}

// ClusterTrustFile, under the PKI directory, is the bundle of cluster
// authorities the components trust (their --client-ca-file, the
// controller manager's --root-ca-file); ca.crt is the one that signs.
const ClusterTrustFile = "ca-bundle.crt"

// FrontProxyTrustFile, under the PKI directory, is the bundle of
// front-proxy authorities the components take request header clients of
// (their --requestheader-client-ca-file).
const FrontProxyTrustFile = "front-proxy-ca.crt"

// ServiceAccountKeyFile and ServiceAccountTrustFile, under the PKI
// directory, are the private key kube-apiserver signs service-account
// tokens with (--service-account-signing-key-file) and
// kube-controller-manager legacy token Secrets
// (--service-account-private-key-file), and the bundle of public keys
// kube-apiserver takes tokens of (--service-account-key-file).
const (
	ServiceAccountKeyFile   = "sa.key"
	ServiceAccountTrustFile = "sa.pub"
)

// ServiceAccountTokenMaxLifetime is the longest a service-account token
// lives: kube-apiserver's --service-account-max-token-expiration (a longer
// request is cut to it), with --service-account-extend-token-expiration
// off, which would otherwise extend every token admission injects into a
// Pod to a year. A service-account key rotation waits this long after the
// last API server stopped signing with the old key before it distrusts
// it. kube-apiserver takes no maximum under an hour.
const ServiceAccountTokenMaxLifetime = 24 * time.Hour

// Node is the machine's kubelet identity now.
func (p *PKI) Node() *certs.KeyPair { return p.identity(&p.node) }

// Admin is the agent's system:masters identity now.
func (p *PKI) Admin() *certs.KeyPair { return p.identity(&p.admin) }

// EtcdTrust is the PEM bundle of the etcd authorities the machine trusts
// now.
func (p *PKI) EtcdTrust() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.etcdTrust
}

// ClusterTrust is the PEM bundle of the cluster authorities the machine
// trusts now; nil on a machine without Kubernetes components.
func (p *PKI) ClusterTrust() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.clusterTrust
}

// FrontProxyTrust is the PEM bundle of the front-proxy authorities the
// machine trusts now; nil on a machine without an API server.
func (p *PKI) FrontProxyTrust() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frontProxyTrust
}

// EtcdClient is the agent's etcd client identity now.
func (p *PKI) EtcdClient() *certs.KeyPair { return p.identity(&p.etcdClient) }

func (p *PKI) identity(slot **certs.KeyPair) *certs.KeyPair {
	p.mu.Lock()
	defer p.mu.Unlock()
	return *slot
}

// etcdClientCertificate serves as a tls.Config's GetClientCertificate, so
// that every new etcd connection presents the identity of the moment.
func (p *PKI) etcdClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	kp := p.EtcdClient()
	return &tls.Certificate{Certificate: [][]byte{kp.Cert.Raw}, PrivateKey: kp.Key, Leaf: kp.Cert}, nil
}

// Renewable reports whether Renew signs the certificate named name again.
func (p *PKI) Renewable(name string) bool {
	return slices.ContainsFunc(p.leaves, func(l *leaf) bool { return l.name == name })
}

// Renew signs every leaf the agent issued again, for its own key, with the
// validity the bootstrap data names, and puts it where IssuePKI put it.
// Since the keys stay, each file pair changes in one atomic write of its
// certificate (the key is written again with the same bytes), so no reader
// ever finds a certificate and a key that do not match. It stops at the
// first failure and returns the leaves renewed before it, which are valid,
// as are the ones not renewed yet. Callers serialize it.
func (p *PKI) Renew(now time.Time) (renewed []string, err error) {
	for _, l := range p.leaves {
		kp, err := l.ca.Reissue(l.kp, now)
		if err != nil {
			return renewed, fmt.Errorf("renewing %s: %w", l.name, err)
		}
		w := &pkiWriter{dir: p.Dir}
		l.put(w, kp)
		if w.err != nil {
			return renewed, fmt.Errorf("renewing %s: %w", l.name, w.err)
		}
		l.kp = kp
		renewed = append(renewed, l.name)
	}
	return renewed, nil
}

// issued records a leaf issued at boot and puts it in place.
func (p *PKI) issued(w *pkiWriter, l *leaf) {
	p.leaves = append(p.leaves, l)
	l.put(w, l.kp)
}

// pairLeaf is a leaf kept as base.crt and base.key.
func pairLeaf(base string, ca, kp *certs.KeyPair) *leaf {
	return &leaf{name: base + ".crt", ca: ca, kp: kp, put: func(w *pkiWriter, kp *certs.KeyPair) { w.pair(base, kp) }}
}

// memoryLeaf is an identity the agent keeps in slot.
func (p *PKI) memoryLeaf(name string, ca, kp *certs.KeyPair, slot **certs.KeyPair) *leaf {
	return &leaf{name: name, ca: ca, kp: kp, put: func(_ *pkiWriter, kp *certs.KeyPair) {
		p.mu.Lock()
		defer p.mu.Unlock()
		*slot = kp
	}}
}

// kubeconfigLeaf is a client certificate embedded in kubeconfig file name,
// which points at server and trusts the machine's cluster trust bundle.
func (p *PKI) kubeconfigLeaf(name, clusterName, server, user string, ca, kp *certs.KeyPair) *leaf {
	return &leaf{name: name, ca: ca, kp: kp, kubeconfig: true, put: func(w *pkiWriter, kp *certs.KeyPair) {
		kc, err := certs.Kubeconfig(clusterName, server, p.ClusterTrust(), user, kp)
		if err != nil {
			w.err = cmp.Or(w.err, err)
			return
		}
		w.key(name, kc)
	}}
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
		p.etcdCA = etcdCA
		p.etcdTrust = etcdCA.CertPEM
		if c.EtcdTrust != "" {
			p.etcdTrust = []byte(c.EtcdTrust)
		}
		w.cert("etcd/ca.crt", p.etcdTrust)
		if doc.Runs(bootstrap.Etcd) {
			member, err := certs.IssueEtcdMember(etcdCA, m.Name, ip, now)
			if err != nil {
				return nil, err
			}
			p.issued(w, pairLeaf("etcd/server", etcdCA, member.Server))
			p.issued(w, pairLeaf("etcd/peer", etcdCA, member.Peer))
		}
		client, err := certs.IssueEtcdClient(etcdCA, "qcp-agent:"+m.Name, now)
		if err != nil {
			return nil, err
		}
		p.issued(w, p.memoryLeaf(memoryEtcdClient, etcdCA, client, &p.etcdClient))
		if doc.Runs(bootstrap.KubeAPIServer) {
			kp, err := certs.IssueEtcdClient(etcdCA, "kube-apiserver-etcd-client", now)
			if err != nil {
				return nil, err
			}
			p.issued(w, pairLeaf("apiserver-etcd-client", etcdCA, kp))
		}
	}
	if ext := doc.Etcd.External; ext != nil {
		// The agent reads the member list with the API server's identity:
		// it has no etcd CA key to issue one of its own, so it renews
		// neither.
		client, err := certs.ParseKeyPair([]byte(ext.ClientCert), []byte(ext.ClientKey))
		if err != nil {
			return nil, fmt.Errorf("etcd.external.clientCert and clientKey: %w", err)
		}
		p.etcdClient = client
		p.etcdTrust = []byte(ext.CACert)
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
	p.clusterCA = ca
	p.clusterTrust = ca.CertPEM
	if c.ClusterTrust != "" {
		p.clusterTrust = []byte(c.ClusterTrust)
	}
	// kube-controller-manager signs CSRs with the CA key, as on kubeadm
	// nodes; every reader that verifies trusts the bundle.
	p.clusterSigner = ca
	if c.ClusterSigner != nil {
		if p.clusterSigner, err = parseCA(c.ClusterSigner, doc); err != nil {
			return fmt.Errorf("certificates.clusterSigner: %w", err)
		}
	}
	w.pair("ca", p.clusterSigner)
	w.cert(ClusterTrustFile, p.clusterTrust)
	if c.ServiceAccount != nil {
		sa, err := certs.ServiceAccountKeyPair([]byte(c.ServiceAccount.PrivateKey))
		if err != nil {
			return fmt.Errorf("certificates.serviceAccount.privateKey: %w", err)
		}
		trust := []byte(c.ServiceAccount.PublicKey)
		if err := certs.CheckBundle(trust, sa); err != nil {
			return fmt.Errorf("certificates.serviceAccount.publicKey: %w", err)
		}
		p.serviceAccount, p.serviceAccountTrust = sa, trust
		w.key(ServiceAccountKeyFile, sa.KeyPEM)
		w.cert(ServiceAccountTrustFile, trust)
	}
	node, err := certs.IssueNodeClient(ca, m.Name, now)
	if err != nil {
		return err
	}
	p.issued(w, p.memoryLeaf(memoryNode, ca, node, &p.node))
	admin, err := ca.Issue(certs.Request{CommonName: "qcp-agent:" + m.Name, Organization: []string{"system:masters"}, Usages: certs.ClientUsage}, now)
	if err != nil {
		return err
	}
	p.issued(w, p.memoryLeaf(memoryAdmin, ca, admin, &p.admin))
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
		// The in-cluster name in the cluster's own domain, as kubeadm adds it.
		sans := append(slices.Clone(doc.CertSANs), "kubernetes.default.svc."+doc.DNSDomain())
		serving, err := certs.IssueAPIServerServing(ca, ip, endpointHost, svcIP, sans, now)
		if err != nil {
			return err
		}
		p.issued(w, pairLeaf("apiserver", ca, serving))
		kubelet, err := certs.IssueKubeletClient(ca, now)
		if err != nil {
			return err
		}
		p.issued(w, pairLeaf("apiserver-kubelet-client", ca, kubelet))
		fp, err := parseCA(c.FrontProxyCA, doc)
		if err != nil {
			return fmt.Errorf("certificates.frontProxyCA: %w", err)
		}
		p.frontProxyCA, p.frontProxyTrust = fp, fp.CertPEM
		if c.FrontProxyTrust != "" {
			p.frontProxyTrust = []byte(c.FrontProxyTrust)
		}
		w.cert(FrontProxyTrustFile, p.frontProxyTrust)
		fpc, err := certs.IssueFrontProxyClient(fp, now)
		if err != nil {
			return err
		}
		p.issued(w, pairLeaf("front-proxy-client", fp, fpc))
		if !doc.Runs(bootstrap.Etcd) {
			// The agent endpoint's, on a machine without etcd's server
			// certificate to serve (serveAgentEndpoint).
			agentServing, err := certs.IssueServing(ca, "qcp-agent", ip, now)
			if err != nil {
				return err
			}
			p.issued(w, pairLeaf("agent-serving", ca, agentServing))
		}
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
		// certs.ComponentKubeconfig's identity, kept to be renewed.
		client, err := ca.Issue(certs.Request{CommonName: comp.user, Usages: certs.ClientUsage}, now)
		if err != nil {
			return err
		}
		p.issued(w, p.kubeconfigLeaf(comp.cfg+".conf", doc.ClusterName, local, comp.user, ca, client))
		serving, err := certs.IssueServing(ca, string(comp.c), ip, now)
		if err != nil {
			return err
		}
		p.issued(w, pairLeaf(comp.cfg+"-serving", ca, serving))
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
