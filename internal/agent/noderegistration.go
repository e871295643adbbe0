package agent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/qcp-dev/qcp/internal/atomicfile"
	"github.com/qcp-dev/qcp/internal/certs"
)

// NodeRegistrationPath: PUT gives a machine that runs etcd but no
// Kubernetes component (an EtcdCluster's) what it needs to register and
// heartbeat a Node in its Cluster's workload cluster, as RKE2's etcd-only
// nodes do: the control plane endpoint, the cluster trust bundle, and a
// node client certificate. The manager sends it once the control plane
// exists, and again before the certificate is due or when the trust or the
// endpoint changed. CAPI links a Machine to its Node by providerID, and
// clusterctl move refuses to start while a Machine has no Node.
const NodeRegistrationPath = "/node/registration"

// nodeRegistrationFile keeps the registration across restarts of the agent,
// in the machine's PKI directory (mode 0600: it holds the node's key).
const nodeRegistrationFile = "node-registration.json"

// maxNodeRegistrationBody bounds a registration: a bundle, a certificate
// and a key.
const maxNodeRegistrationBody = 64 << 10

// nodeRegistrationTimeout bounds a call of PUT /node/registration.
const nodeRegistrationTimeout = 10 * time.Second

// NodeRegistration is the body of PUT /node/registration.
type NodeRegistration struct {
	// Server is the control plane endpoint, https://host:port.
	Server string `json:"server"`
	// ClusterTrust is the PEM bundle of cluster authorities the API
	// server's serving certificate chains to.
	ClusterTrust []byte `json:"clusterTrust"`
	// NodeCert and NodeKey (PEM) are the node's client pair:
	// system:node:<machine name> in group system:nodes, of the cluster CA.
	NodeCert []byte `json:"nodeCert"`
	NodeKey  []byte `json:"nodeKey"`
}

// NodeRegistrationResult is the answer of PUT /node/registration.
type NodeRegistrationResult struct {
	// Started is true when the registration started the Node agent, false
	// when it replaced the identity of one already running.
	Started bool `json:"started"`
}

// Digest identifies what the Node agent connects with besides the
// certificate: the server and the trust. The manager records it to see
// when a registration is out of date.
func (r NodeRegistration) Digest() string {
	h := sha256.New()
	h.Write([]byte(r.Server))
	h.Write([]byte{0})
	h.Write(r.ClusterTrust)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// check validates r for the machine named name at now and returns the
// node's pair. Each error names the field and what it must be.
func (r NodeRegistration) check(name string, now time.Time) (*certs.KeyPair, error) {
	if u, err := url.Parse(r.Server); err != nil || u.Scheme != "https" || u.Host == "" || u.Path != "" {
		return nil, fmt.Errorf("server %q: want the control plane endpoint as https://host:port", r.Server)
	}
	roots, err := certs.CertPool(r.ClusterTrust)
	if err != nil {
		return nil, fmt.Errorf("clusterTrust: want a PEM bundle of the cluster authorities: %w", err)
	}
	kp, err := certs.ParseKeyPair(r.NodeCert, r.NodeKey)
	if err != nil {
		return nil, fmt.Errorf("nodeCert and nodeKey: want a PEM certificate and its key: %w", err)
	}
	want := "system:node:" + name
	if subj := kp.Cert.Subject; subj.CommonName != want || !slices.Contains(subj.Organization, "system:nodes") {
		return nil, fmt.Errorf("nodeCert is for %q in %v: want %q in system:nodes", subj.CommonName, subj.Organization, want)
	}
	_, err = kp.Cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return nil, fmt.Errorf("nodeCert: want a client certificate valid now that chains to clusterTrust: %w", err)
	}
	return kp, nil
}

// nodeRegistration is the registration the machine holds, with its pair.
type nodeRegistration struct {
	mu  sync.Mutex
	reg *NodeRegistration
	kp  *certs.KeyPair
}

func (s *nodeRegistration) get() (*NodeRegistration, *certs.KeyPair) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reg, s.kp
}

func (s *nodeRegistration) set(reg *NodeRegistration, kp *certs.KeyPair) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reg, s.kp = reg, kp
}

// registersNode says whether the machine takes a node registration: it
// runs etcd and no Kubernetes component, whose machines register their
// Node with identities of their own.
func (a *machineCtx) registersNode() bool {
	return !a.doc.RunsKubernetes()
}

// loadNodeRegistration reads the registration a previous run kept, if
// any. One that no longer checks (the certificate expired while the agent
// was down) is left for the manager to replace.
func (a *machineCtx) loadNodeRegistration() error {
	data, err := os.ReadFile(a.pki.File(nodeRegistrationFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var reg NodeRegistration
	if err := json.Unmarshal(data, &reg); err != nil {
		return fmt.Errorf("%s: %w", a.pki.File(nodeRegistrationFile), err)
	}
	kp, err := reg.check(a.machine.Name, time.Now())
	if err != nil {
		a.log.Warn("the kept node registration is not valid: waiting for the manager to send another", "err", err)
		return nil
	}
	a.registration.set(&reg, kp)
	return nil
}

func (a *machineCtx) putNodeRegistration(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	var reg NodeRegistration
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxNodeRegistrationBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&reg); err != nil && !errors.Is(err, io.EOF) {
		http.Error(w, "invalid node registration: the request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	kp, err := reg.check(a.machine.Name, time.Now())
	if err != nil {
		http.Error(w, "invalid node registration: "+err.Error(), http.StatusBadRequest)
		return
	}
	res, err := a.setNodeRegistration(ctx, &reg, kp)
	if err != nil {
		a.log.Error("setting the node registration failed", "err", err, "client", clientName(r))
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	a.log.Info("node registration set", "server", reg.Server, "notAfter", kp.Cert.NotAfter.UTC().Format(time.RFC3339),
		"started", res.Started, "client", clientName(r))
	writeJSON(w, res)
}

// setNodeRegistration keeps reg, then starts the Node agent with it, or
// makes the running one connect with it.
func (a *machineCtx) setNodeRegistration(ctx context.Context, reg *NodeRegistration, kp *certs.KeyPair) (NodeRegistrationResult, error) {
	a.nodeStart.Lock()
	defer a.nodeStart.Unlock()
	data, err := json.Marshal(reg)
	if err != nil {
		return NodeRegistrationResult{}, err
	}
	if err := atomicfile.Write(a.pki.File(nodeRegistrationFile), data, 0o600); err != nil {
		return NodeRegistrationResult{}, fmt.Errorf("keeping the node registration: %w", err)
	}
	a.registration.set(reg, kp)
	if n := a.node.Load(); n != nil {
		return NodeRegistrationResult{}, n.newClients()
	}
	n, err := a.newNodeAgent()
	if err != nil {
		return NodeRegistrationResult{}, err
	}
	a.node.Store(n)
	go n.Run(ctx)
	return NodeRegistrationResult{Started: true}, nil
}

// PutNodeRegistration sends reg to the machine at host (its IP address).
// tlsCfg trusts the machine's agent endpoint and holds a client
// certificate it accepts.
func PutNodeRegistration(ctx context.Context, tlsCfg *tls.Config, host string, reg NodeRegistration) (NodeRegistrationResult, error) {
	var res NodeRegistrationResult
	err := sendAgent(ctx, tlsCfg, host, http.MethodPut, NodeRegistrationPath, nodeRegistrationTimeout, reg, &res)
	return res, err
}
