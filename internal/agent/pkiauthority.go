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

// PKIEtcdAuthorityPath sets the etcd authority of a machine that runs an
// etcd member: a step of an etcd CA rotation.
const PKIEtcdAuthorityPath = "/pki/etcd-authority"

// EtcdAuthorityFile, in the machine directory, holds the etcd authority
// the manager set on the running machine (0600: it holds the CA's key).
// It overrides the bootstrap data's, which is read once at boot, so that a
// machine that restarts in the middle of a rotation comes back where the
// rotation left it.
const EtcdAuthorityFile = "etcd-authority.json"

// EtcdAuthority is what a machine's etcd certificates come from: the
// authority that issues its etcd leaves and the bundle of authorities it
// trusts, which holds it.
type EtcdAuthority struct {
	CA bootstrap.CertKey `json:"ca"`
	// Trust is a PEM bundle of authorities.
	Trust string `json:"trust"`
}

// EtcdAuthorityResult answers PUT PKIEtcdAuthorityPath: the machine's
// certificates after it, and what changed.
type EtcdAuthorityResult struct {
	Report PKIReport `json:"report"`
	// Moved names the leaves issued again from the new authority.
	Moved []string `json:"moved"`
	// Restarted names the components restarted to read the new trust, in
	// order: kube-apiserver and etcd read it once, at their start.
	Restarted []string `json:"restarted"`
}

// maxAuthorityBody bounds the body of PUT PKIEtcdAuthorityPath.
const maxAuthorityBody = 64 << 10

// parse checks the authority: the CA's certificate and key match and it is
// an authority, and the trust bundle holds only authorities, among them
// the CA.
func (e EtcdAuthority) parse() (*certs.KeyPair, error) {
	ca, err := certs.ParseKeyPair([]byte(e.CA.Cert), []byte(e.CA.Key))
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	if !ca.Cert.IsCA {
		return nil, errors.New("ca: the certificate is not an authority")
	}
	if err := certs.CheckBundle([]byte(e.Trust), ca); err != nil {
		return nil, fmt.Errorf("trust: %w", err)
	}
	return ca, nil
}

func decodeEtcdAuthority(r io.Reader) (EtcdAuthority, *certs.KeyPair, error) {
	var e EtcdAuthority
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return e, nil, fmt.Errorf("the request body: %w", err)
	}
	ca, err := e.parse()
	return e, ca, err
}

// loadEtcdAuthority makes the authority a rotation last set on this
// machine, if any, override the bootstrap data's. A file that does not
// parse fails the start: issuing from the bootstrap data's authority
// instead could leave the machine trusting an authority the rest of the
// cluster no longer uses.
func (a *machineCtx) loadEtcdAuthority() error {
	path := filepath.Join(a.dir, EtcdAuthorityFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	e, _, err := decodeEtcdAuthority(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s, which an etcd CA rotation wrote, is invalid (%w): restore it, or replace the machine", path, err)
	}
	a.doc.Certificates.EtcdCA = &e.CA
	a.doc.Certificates.EtcdTrust = e.Trust
	a.log.Info("the etcd authority of an etcd CA rotation overrides the bootstrap data's", "file", path)
	return nil
}

// putEtcdAuthority sets the machine's etcd authority. Like a renewal, it
// is refused while another renewal or authority change runs, and runs
// under the endpoint's ctx.
func (a *machineCtx) putEtcdAuthority(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	want, ca, err := decodeEtcdAuthority(http.MaxBytesReader(w, r.Body, maxAuthorityBody))
	if err != nil {
		http.Error(w, "invalid etcd authority: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !a.renewing.TryLock() {
		http.Error(w, "a renewal of this machine's certificates is already running: retry once it has finished", http.StatusConflict)
		return
	}
	defer a.renewing.Unlock()
	res, err := a.setEtcdAuthority(ctx, want, ca, time.Now())
	if err != nil {
		a.log.Error("changing the etcd authority failed", "err", err, "moved", res.Moved, "restarted", res.Restarted, "client", clientName(r))
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	a.log.Info("etcd authority set", "authority", certs.KeyID(ca.Cert), "moved", res.Moved, "restarted", res.Restarted, "client", clientName(r))
	writeJSON(w, res)
}

// setEtcdAuthority saves the authority, then moves the etcd leaves to the
// new issuer and writes the new trust bundle, whichever changed, and
// restarts kube-apiserver and then etcd, each healthy before the next, if
// the trust changed: both read their trusted authorities once, at start
// (etcd's transport builds its pools once; the leaves it reads at every
// handshake). A restart of etcd is a member disruption, which the manager
// plans as one. Hold a.renewing.
func (a *machineCtx) setEtcdAuthority(ctx context.Context, want EtcdAuthority, ca *certs.KeyPair, now time.Time) (EtcdAuthorityResult, error) {
	res := EtcdAuthorityResult{Moved: []string{}, Restarted: []string{}}
	fail := func(what string, err error) (EtcdAuthorityResult, error) {
		return res, fmt.Errorf("machine %s/%s: setting the etcd authority: %s: %w", a.machine.Namespace, a.machine.Name, what, err)
	}
	p := a.pki
	if p.etcdCA == nil || !a.doc.Runs(bootstrap.Etcd) {
		return fail("checking the machine", errors.New("it runs no etcd member, so it issues no etcd certificate"))
	}
	had, err := certs.BundleKeyIDs(p.EtcdTrust())
	if err != nil {
		return fail("reading the trust it has", err)
	}
	wants, _ := certs.BundleKeyIDs([]byte(want.Trust))
	trustChanged, signerChanged := had != wants, !p.etcdCA.Cert.Equal(ca.Cert)
	if trustChanged || signerChanged {
		data, err := json.Marshal(want)
		if err != nil {
			return fail("encoding", err)
		}
		// The file first: a machine that restarts comes back with it.
		if err := atomicfile.Write(filepath.Join(a.dir, EtcdAuthorityFile), data, 0o600); err != nil {
			return fail("saving "+EtcdAuthorityFile, err)
		}
	}
	ca.LeafValidity = a.doc.LeafValidity()
	if trustChanged {
		if err := p.setEtcdTrust([]byte(want.Trust)); err != nil {
			return fail("writing etcd/ca.crt", err)
		}
	}
	if signerChanged {
		if res.Moved, err = p.moveEtcdLeaves(ca, now); err != nil {
			return fail("issuing the etcd leaves again", err)
		}
		if err := a.adminPair.load(); err != nil {
			return fail("loading the endpoint's serving certificate", err)
		}
	}
	if trustChanged {
		// kube-apiserver first: restarted, it lists every voter among its
		// etcd servers (apiserverEtcdServers), so it keeps serving while
		// its local member restarts after it.
		for _, c := range []bootstrap.Component{bootstrap.KubeAPIServer, bootstrap.Etcd} {
			requested := time.Now()
			if !a.doc.Runs(c) || !a.sup.Restart(c, "the etcd authorities it trusts changed") {
				continue
			}
			res.Restarted = append(res.Restarted, string(c))
			if err := a.waitRestarted(ctx, c, requested); err != nil {
				return fail("restarting "+string(c), err)
			}
		}
	}
	if res.Report, err = p.Report(); err != nil {
		return fail("reporting", err)
	}
	return res, nil
}

// setEtcdTrust writes etcd/ca.crt and makes the agent's etcd clients and
// its endpoint trust bundle from now on.
func (p *PKI) setEtcdTrust(bundle []byte) error {
	w := &pkiWriter{dir: p.Dir}
	w.cert("etcd/ca.crt", bundle)
	if w.err != nil {
		return w.err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.etcdTrust = bundle
	return nil
}

// moveEtcdLeaves issues every leaf of the etcd authority again from ca,
// for its own key, and puts it in place; it returns their names. It stops
// at the first failure; the leaves moved before it are valid under the
// trust the manager set first, which holds both authorities.
func (p *PKI) moveEtcdLeaves(ca *certs.KeyPair, now time.Time) ([]string, error) {
	moved := []string{}
	for _, l := range p.leaves {
		if l.ca != p.etcdCA {
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
	p.etcdCA = ca
	return moved, nil
}

// SetEtcdAuthority sets the etcd authority of the machine at host (its IP
// address), which runs an etcd member, and returns once its components use
// it. tlsCfg trusts the machine's etcd authorities and holds a client
// certificate one of them issued.
func SetEtcdAuthority(ctx context.Context, tlsCfg *tls.Config, host string, e EtcdAuthority) (EtcdAuthorityResult, error) {
	var res EtcdAuthorityResult
	err := sendAgent(ctx, tlsCfg, host, http.MethodPut, PKIEtcdAuthorityPath, pkiRenewTimeout, e, &res)
	return res, err
}
