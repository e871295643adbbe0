package agent

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/qcp-dev/qcp/internal/certs"
)

// PKIRenewRequest is the optional body of POST /pki/renew: material only
// the manager has, which the renewal puts in place besides the leaves the
// agent issues itself.
type PKIRenewRequest struct {
	// EtcdClientCert and EtcdClientKey (PEM) are the API server's etcd
	// client pair, on a machine of an external etcd or an EtcdCluster:
	// the <cluster>-apiserver-etcd-client Secret's, renewed by its owner.
	EtcdClientCert []byte `json:"etcdClientCert,omitempty"`
	EtcdClientKey  []byte `json:"etcdClientKey,omitempty"`
}

// maxRenewBody bounds a renewal's body: a certificate and a key.
const maxRenewBody = 64 << 10

// invalidMaterial is material the manager sent that the agent refuses; the
// endpoint answers 400 with it, and nothing was written.
type invalidMaterial struct{ err error }

func (e invalidMaterial) Error() string { return e.err.Error() }
func (e invalidMaterial) Unwrap() error { return e.err }

// decodeRenewRequest reads an optional JSON body: none is a renewal of the
// agent's own leaves only.
func decodeRenewRequest(r io.Reader) (PKIRenewRequest, error) {
	var req PKIRenewRequest
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		return req, invalidMaterial{fmt.Errorf("the request body: %w", err)}
	}
	if (len(req.EtcdClientCert) == 0) != (len(req.EtcdClientKey) == 0) {
		return req, invalidMaterial{errors.New("etcdClientCert and etcdClientKey: send both or neither")}
	}
	return req, nil
}

// deliverEtcdClient puts the API server's etcd client pair in place, if
// req carries one, after checking it: the machine must hold a pair it did
// not issue (an external etcd's), the key must match the certificate, and
// the certificate must be valid now for client authentication and chain
// to the etcd CA the machine trusts. A pair that fails a check is refused
// (invalidMaterial, naming the check) and nothing is written. It reports
// whether the pair changed.
//
// kube-apiserver reads the pair's files at every etcd handshake, and the
// agent's own etcd client is swapped in memory. The key is written first,
// then the certificate: a renewal by the EtcdCluster keeps the key, so only
// the certificate changes; a new key (a user's replaced Secret) leaves a
// moment in which a handshake can find a new key beside the old
// certificate, fail, and be retried by the API server's etcd client.
func (p *PKI) deliverEtcdClient(req PKIRenewRequest, now time.Time) (bool, error) {
	if len(req.EtcdClientCert) == 0 {
		return false, nil
	}
	if _, err := os.Stat(p.File("apiserver-etcd-client.crt")); err != nil || p.Renewable("apiserver-etcd-client.crt") {
		return false, invalidMaterial{errors.New("etcdClientCert: this machine issues its own etcd client certificate; only a machine of an external etcd or an EtcdCluster takes one")}
	}
	pair, err := certs.ParseKeyPair(req.EtcdClientCert, req.EtcdClientKey)
	if err != nil {
		return false, invalidMaterial{fmt.Errorf("etcdClientCert and etcdClientKey: %w", err)}
	}
	roots, err := certs.CertPool(p.EtcdTrust())
	if err != nil {
		return false, fmt.Errorf("the machine's etcd CA: %w", err)
	}
	if _, err := pair.Cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return false, invalidMaterial{fmt.Errorf("etcdClientCert is not a client certificate of the etcd CA this machine trusts, valid now: %w", err)}
	}
	if bytes.Equal(pair.CertPEM, p.EtcdClient().CertPEM) {
		return false, nil
	}
	w := &pkiWriter{dir: p.Dir}
	if current, err := os.ReadFile(p.File("apiserver-etcd-client.key")); err != nil || !bytes.Equal(current, pair.KeyPEM) {
		w.key("apiserver-etcd-client.key", pair.KeyPEM)
	}
	w.cert("apiserver-etcd-client.crt", pair.CertPEM)
	if w.err != nil {
		return false, w.err
	}
	p.mu.Lock()
	p.etcdClient = pair
	p.mu.Unlock()
	return true, nil
}
