package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/qcp-dev/qcp/internal/atomicfile"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// AuthorityKind names the authority a rotation sets on a machine.
type AuthorityKind string

const (
	// EtcdAuthorityKind is the etcd CA, on a machine that runs a member.
	EtcdAuthorityKind AuthorityKind = "etcd"
	// ClusterAuthorityKind is the cluster CA, on a machine that runs
	// Kubernetes components.
	ClusterAuthorityKind AuthorityKind = "cluster"
	// FrontProxyAuthorityKind is the front-proxy CA, on a machine that
	// runs an API server.
	FrontProxyAuthorityKind AuthorityKind = "front-proxy"
	// ServiceAccountAuthorityKind is the service-account key, on a machine
	// that runs kube-apiserver or kube-controller-manager: its Authority's
	// CA is a PEM public key and its private key, its trust a bundle of
	// public keys (certs.ServiceAccountKeyPair).
	ServiceAccountAuthorityKind AuthorityKind = "service-account"
)

// AuthorityKinds are every kind a rotation sets.
var AuthorityKinds = []AuthorityKind{EtcdAuthorityKind, ClusterAuthorityKind, FrontProxyAuthorityKind, ServiceAccountAuthorityKind}

// Path is where the agent endpoint takes the authority of kind k: a step
// of a CA rotation.
func (k AuthorityKind) Path() string { return "/pki/" + string(k) + "-authority" }

// File, in the machine directory, holds the authority of kind k the
// manager set on the running machine (0600: it holds the CA's key). It
// overrides the bootstrap data's, which is read once at boot, so that a
// machine that restarts in the middle of a rotation comes back where the
// rotation left it.
func (k AuthorityKind) File() string { return string(k) + "-authority.json" }

// Authority is what a machine's certificates of one kind come from: the
// authority that issues its leaves and the bundle of authorities it
// trusts, which holds it.
type Authority struct {
	CA bootstrap.CertKey `json:"ca"`
	// Trust is a PEM bundle of authorities.
	Trust string `json:"trust"`
	// Signer, of the cluster kind only, is what kube-controller-manager
	// signs certificate requests with, when not CA: a cluster CA rotation
	// moves it to the new authority first. Trust holds it.
	Signer *bootstrap.CertKey `json:"signer,omitempty"`
}

// AuthorityResult answers a PUT of an authority: the machine's
// certificates after it, and what changed.
type AuthorityResult struct {
	Report PKIReport `json:"report"`
	// Moved names the leaves issued again from the new authority.
	Moved []string `json:"moved"`
	// Restarted names the components restarted to read the new trust or
	// certificates, in order.
	Restarted []string `json:"restarted"`
}

// maxAuthorityBody bounds the body of a PUT of an authority.
const maxAuthorityBody = 64 << 10

// parse checks the authority of kind k: the CA's certificate and key
// match and it is an authority, and the trust bundle holds only
// authorities, among them the CA.
func (e Authority) parse(k AuthorityKind) (*certs.KeyPair, error) {
	parse := certs.ParseKeyPair
	if k == ServiceAccountAuthorityKind {
		parse = certs.ParseServiceAccountKeyPair
	}
	ca, err := parse([]byte(e.CA.Cert), []byte(e.CA.Key))
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	if !ca.Cert.IsCA {
		return nil, errors.New("ca: the certificate is not an authority")
	}
	if err := certs.CheckBundle([]byte(e.Trust), ca); err != nil {
		return nil, fmt.Errorf("trust: %w", err)
	}
	if _, err := e.signer(k, ca); err != nil {
		return nil, err
	}
	return ca, nil
}

// signer is what kube-controller-manager signs certificate requests with
// under the authority of kind k whose CA is ca: Signer, or ca.
func (e Authority) signer(k AuthorityKind, ca *certs.KeyPair) (*certs.KeyPair, error) {
	if e.Signer == nil {
		return ca, nil
	}
	if k != ClusterAuthorityKind {
		return nil, fmt.Errorf("signer: only the %s authority has one", ClusterAuthorityKind)
	}
	// The same checks as the CA's: an authority the bundle holds.
	s, err := Authority{CA: *e.Signer, Trust: e.Trust}.parse(k)
	if err != nil {
		return nil, fmt.Errorf("signer: %w", err)
	}
	return s, nil
}

func decodeAuthority(k AuthorityKind, r io.Reader) (Authority, *certs.KeyPair, error) {
	var e Authority
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return e, nil, fmt.Errorf("the request body: %w", err)
	}
	ca, err := e.parse(k)
	return e, ca, err
}

// loadAuthorities makes the authorities a rotation last set on this
// machine, if any, override the bootstrap data's. A file that does not
// parse fails the start: issuing from the bootstrap data's authority
// instead could leave the machine trusting an authority the rest of the
// cluster no longer uses.
func (a *machineCtx) loadAuthorities() error {
	for _, k := range AuthorityKinds {
		path := filepath.Join(a.dir, k.File())
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		e, _, err := decodeAuthority(k, bytes.NewReader(data))
		if err != nil {
			return fmt.Errorf("%s, which a CA rotation wrote, is invalid (%w): restore it, or replace the machine", path, err)
		}
		c := &a.doc.Certificates
		switch k {
		case EtcdAuthorityKind:
			c.EtcdCA, c.EtcdTrust = &e.CA, e.Trust
		case ClusterAuthorityKind:
			c.ClusterCA, c.ClusterTrust, c.ClusterSigner = &e.CA, e.Trust, e.Signer
		case FrontProxyAuthorityKind:
			c.FrontProxyCA, c.FrontProxyTrust = &e.CA, e.Trust
		case ServiceAccountAuthorityKind:
			c.ServiceAccount = &bootstrap.ServiceAccountKP{PrivateKey: e.CA.Key, PublicKey: e.Trust}
		}
		a.log.Info("the authority of a CA rotation overrides the bootstrap data's", "file", path)
	}
	return nil
}

// putAuthority sets the machine's authority of kind k. Like a renewal, it
// is refused while another renewal or authority change runs, and runs
// under the endpoint's ctx.
func (a *machineCtx) putAuthority(ctx context.Context, k AuthorityKind, w http.ResponseWriter, r *http.Request) {
	want, ca, err := decodeAuthority(k, http.MaxBytesReader(w, r.Body, maxAuthorityBody))
	if err != nil {
		http.Error(w, "invalid "+string(k)+" authority: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !a.renewing.TryLock() {
		http.Error(w, "a renewal of this machine's certificates is already running: retry once it has finished", http.StatusConflict)
		return
	}
	defer a.renewing.Unlock()
	res, err := a.setAuthority(ctx, k, want, ca, time.Now())
	if err != nil {
		a.log.Error("changing an authority failed", "kind", k, "err", err, "moved", res.Moved, "restarted", res.Restarted, "client", clientName(r))
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	a.log.Info("authority set", "kind", k, "authority", certs.KeyID(ca.Cert), "moved", res.Moved, "restarted", res.Restarted, "client", clientName(r))
	writeJSON(w, res)
}

// setAuthority saves the authority of kind k, then moves the leaves of
// that kind to the new issuer and writes the new trust bundle, whichever
// changed, and makes the components use them. Hold a.renewing.
//
// etcd: when the trust changed, kube-apiserver and then etcd restart, each
// healthy before the next: both read their trusted authorities once, at
// start (etcd's transport builds its pools once; the leaves it reads at
// every handshake). kube-apiserver goes first because from its first
// restart on it lists every voter among its etcd servers, and keeps
// serving while its own member restarts. A restart of etcd is a member
// disruption, which the manager plans as one.
//
// front-proxy: kube-apiserver restarts (it would reload its request
// header client CA bundle and its front-proxy client certificate, but at a
// moment nothing reports); when the trust changed, kube-controller-manager
// and kube-scheduler, which take request header clients of the same
// bundle, restart too. etcd is not touched.
//
// service-account: kube-apiserver restarts (it reads both key files once,
// at start), and kube-controller-manager too when the signer changed (it
// signs legacy token Secrets with the private key). etcd is not touched.
//
// cluster: kube-controller-manager's signer (Signer, or the CA) is written
// last, when it changed. kube-apiserver restarts when the trust changed (it would
// reload its client CA bundle, but at a moment nothing reports) and
// reloads its serving certificate; kube-controller-manager and
// kube-scheduler, whose
// kubeconfigs embed the bundle and their client certificates (and the
// controller manager's --root-ca-file, which it publishes as
// kube-root-ca.crt), restart one after the other; the agent's own clients
// are built again. etcd is not touched.
func (a *machineCtx) setAuthority(ctx context.Context, k AuthorityKind, want Authority, ca *certs.KeyPair, now time.Time) (AuthorityResult, error) {
	res := AuthorityResult{Moved: []string{}, Restarted: []string{}}
	fail := func(what string, err error) (AuthorityResult, error) {
		return res, fmt.Errorf("machine %s: setting the %s authority: %s: %w", a.machine, k, what, err)
	}
	p := a.pki
	slot, _, _ := p.slots(k)
	from := *slot
	if from == nil || k == EtcdAuthorityKind && !a.doc.Runs(bootstrap.Etcd) {
		return fail("checking the machine", fmt.Errorf("it issues no certificate of the %s authority", k))
	}
	had, err := certs.BundleKeyIDs(p.trustOf(k))
	if err != nil {
		return fail("reading the trust it has", err)
	}
	wants, _ := certs.BundleKeyIDs([]byte(want.Trust))
	trustChanged, signerChanged := had != wants, !from.Cert.Equal(ca.Cert)
	csr, err := want.signer(k, ca)
	if err != nil {
		return fail("reading the signer", err)
	}
	csrChanged := k == ClusterAuthorityKind && !p.clusterSigner.Cert.Equal(csr.Cert)
	if !trustChanged && !signerChanged && !csrChanged {
		if res.Report, err = p.Report(); err != nil {
			return fail("reporting", err)
		}
		return res, nil
	}
	data, err := json.Marshal(want)
	if err != nil {
		return fail("encoding", err)
	}
	// The file first: a machine that restarts comes back with it.
	if err := atomicfile.Write(filepath.Join(a.dir, k.File()), data, 0o600); err != nil {
		return fail("saving "+k.File(), err)
	}
	ca.LeafValidity = a.doc.LeafValidity()
	if trustChanged {
		if err := p.setTrust(k, []byte(want.Trust)); err != nil {
			return fail("writing the trust bundle", err)
		}
	}
	if signerChanged {
		if res.Moved, err = p.moveLeaves(k, ca, now); err != nil {
			return fail("issuing the leaves again", err)
		}
	} else if k == ClusterAuthorityKind {
		// The kubeconfigs embed the bundle.
		if err := p.rewriteKubeconfigs(); err != nil {
			return fail("writing the kubeconfigs", err)
		}
	}
	if csrChanged {
		// Last: kube-controller-manager, restarted below, signs with it.
		if err := p.setClusterSigner(csr); err != nil {
			return fail("writing the signer", err)
		}
		res.Moved = append(res.Moved, "ca.crt")
	}
	if a.adminPair != nil {
		if err := a.adminPair.load(); err != nil {
			return fail("loading the endpoint's serving certificate", err)
		}
	}
	restart := []bootstrap.Component{bootstrap.KubeAPIServer, bootstrap.Etcd}
	why := "the etcd authorities it trusts changed"
	switch {
	case k == FrontProxyAuthorityKind:
		restart, why = []bootstrap.Component{bootstrap.KubeAPIServer}, "its front-proxy client certificate or the front-proxy authorities it trusts changed"
		if trustChanged {
			restart = append(restart, kubeconfigReaders...)
		}
	case k == ServiceAccountAuthorityKind:
		restart, why = []bootstrap.Component{bootstrap.KubeAPIServer}, "the service-account keys it signs or verifies tokens with changed"
		if signerChanged {
			restart = append(restart, bootstrap.KubeControllerManager)
		}
	case k == ClusterAuthorityKind:
		if n := a.node.Load(); n != nil {
			if err := n.newClients(); err != nil {
				return fail("building the Node's clients", err)
			}
		}
		restart, why = kubeconfigReaders, "the cluster authorities its kubeconfig trusts or its certificate changed"
		if trustChanged {
			// kube-apiserver watches its client CA file, but nothing says
			// when it has read it again; restarted, it has, before the
			// step ends and the next machine's clients move.
			restart = append([]bootstrap.Component{bootstrap.KubeAPIServer}, restart...)
		}
	case !trustChanged:
		restart = nil
	}
	if res.Restarted, err = a.restartInTurn(ctx, restart, why); err != nil {
		return fail("restarting", err)
	}
	if res.Report, err = p.Report(); err != nil {
		return fail("reporting", err)
	}
	return res, nil
}

// restartInTurn restarts each of comps the machine runs, one after the
// other, each healthy again before the next, and returns those it
// restarted.
func (a *machineCtx) restartInTurn(ctx context.Context, comps []bootstrap.Component, why string) ([]string, error) {
	restarted := []string{}
	for _, c := range comps {
		requested := time.Now()
		if !a.doc.Runs(c) || !a.sup.Restart(c, why) {
			// Not started yet (its start reads the new files), or a
			// restart is already pending.
			continue
		}
		restarted = append(restarted, string(c))
		if err := a.waitRestarted(ctx, c, requested); err != nil {
			return restarted, fmt.Errorf("%s: %w", c, err)
		}
	}
	return restarted, nil
}

// setTrust writes the trust bundle of kind k to its file and makes the
// agent trust it from now on.
func (p *PKI) setTrust(k AuthorityKind, bundle []byte) error {
	_, trust, file := p.slots(k)
	w := &pkiWriter{dir: p.Dir}
	w.cert(file, bundle)
	if w.err != nil {
		return w.err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	*trust = bundle
	return nil
}

// slots are, for kind k, the fields that hold the authority the machine
// issues its leaves from (nil if it issues none) and its trust bundle
// (guarded by p.mu), and the file that holds the bundle.
func (p *PKI) slots(k AuthorityKind) (**certs.KeyPair, *[]byte, string) {
	switch k {
	case ClusterAuthorityKind:
		return &p.clusterCA, &p.clusterTrust, ClusterTrustFile
	case FrontProxyAuthorityKind:
		return &p.frontProxyCA, &p.frontProxyTrust, FrontProxyTrustFile
	case ServiceAccountAuthorityKind:
		return &p.serviceAccount, &p.serviceAccountTrust, ServiceAccountTrustFile
	}
	return &p.etcdCA, &p.etcdTrust, "etcd/ca.crt"
}

// trustOf is the trust bundle of kind k now.
func (p *PKI) trustOf(k AuthorityKind) []byte {
	_, trust, _ := p.slots(k)
	p.mu.Lock()
	defer p.mu.Unlock()
	return *trust
}

// moveLeaves issues every leaf of the authority of kind k again from ca,
// for its own key, and puts it in place; it returns their names. It stops
// at the first failure; the leaves moved before it are valid under the
// trust the manager set first, which holds both authorities. The
// service-account key's pair has no leaves: its private key is written.
func (p *PKI) moveLeaves(k AuthorityKind, ca *certs.KeyPair, now time.Time) ([]string, error) {
	slot, _, _ := p.slots(k)
	from := *slot
	moved := []string{}
	for _, l := range p.leaves {
		if l.ca != from {
			continue
		}
		kp, err := ca.ReissueFrom(l.ca, l.kp, now)
		if err != nil {
			return moved, fmt.Errorf("%s: %w", l.name, err)
		}
		w := &pkiWriter{dir: p.Dir}
		l.put(w, kp)
		if w.err != nil {
			return moved, fmt.Errorf("%s: %w", l.name, w.err)
		}
		l.ca, l.kp = ca, kp
		moved = append(moved, l.name)
	}
	// The service-account key, which signs tokens, is written under pki;
	// of the authorities only the cluster CA's signer is (setClusterSigner):
	// the agent keeps the others in memory, and the machine holds no
	// front-proxy CA key file, as on kubeadm's nodes.
	if k == ServiceAccountAuthorityKind {
		w := &pkiWriter{dir: p.Dir}
		w.key(ServiceAccountKeyFile, ca.KeyPEM)
		if w.err != nil {
			return moved, w.err
		}
		moved = append(moved, ServiceAccountKeyFile)
	}
	*slot = ca
	return moved, nil
}

// setClusterSigner writes the authority kube-controller-manager signs
// certificate requests with: pki/ca.crt and ca.key.
func (p *PKI) setClusterSigner(ca *certs.KeyPair) error {
	w := &pkiWriter{dir: p.Dir}
	w.pair("ca", ca)
	if w.err != nil {
		return w.err
	}
	p.clusterSigner = ca
	return nil
}

// rewriteKubeconfigs writes each kubeconfig again, with the trust bundle
// of the moment and its certificate unchanged.
func (p *PKI) rewriteKubeconfigs() error {
	w := &pkiWriter{dir: p.Dir}
	for _, l := range p.leaves {
		if l.kubeconfig {
			l.put(w, l.kp)
		}
	}
	return w.err
}

// SetAuthority sets the authority of kind k on the machine at host (its
// IP address) and returns once its components use it. tlsCfg is as for
// GetPKI, and trusts the authorities of the stage.
//
// A machine whose agent does not serve k's path (one started before QCP
// rotated authorities of that kind) answers 404; the error then says how
// to go on: its components cannot take the stage in place.
func SetAuthority(ctx context.Context, tlsCfg *tls.Config, host string, k AuthorityKind, e Authority) (AuthorityResult, error) {
	var res AuthorityResult
	err := sendAgent(ctx, tlsCfg, host, http.MethodPut, k.Path(), pkiRenewTimeout, e, &res)
	if se := (*StatusError)(nil); errors.As(err, &se) && se.Code == http.StatusNotFound {
		return res, fmt.Errorf("%w: the machine's agent predates rotations of the %s authority; roll the machine out (spec.rollout.after) and the rotation goes on with its replacement", err, k)
	}
	return res, err
}
