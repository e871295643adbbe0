package agent

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/qcp-dev/qcp/internal/certs"
)

// PKIPath lists the machine's certificates; PKIRenewPath renews the ones
// the agent issued. Both are on the agent endpoint (serveAgentEndpoint),
// on every machine that runs etcd or kube-apiserver.
const (
	PKIPath      = "/pki"
	PKIRenewPath = "/pki/renew"
)

// PKICertificate is one certificate of the machine.
type PKICertificate struct {
	// Name is the file under the machine's pki directory, or
	// memory:<identity> for an identity the agent keeps in memory.
	Name         string    `json:"name"`
	Subject      string    `json:"subject"`
	Issuer       string    `json:"issuer"`
	SerialNumber string    `json:"serialNumber"`
	NotBefore    time.Time `json:"notBefore"`
	NotAfter     time.Time `json:"notAfter"`
	IsCA         bool      `json:"isCA"`
	// KeyID is the subject key identifier (hexadecimal) and IssuerKeyID
	// the issuer's: what tells two authorities of a rotation apart, which
	// may share a name.
	KeyID       string `json:"keyID,omitempty"`
	IssuerKeyID string `json:"issuerKeyID,omitempty"`
	// Renewable says that POST /pki/renew issues it again: false for the
	// authorities and for what came issued with the bootstrap data.
	Renewable bool `json:"renewable"`
}

// PKIReport is what GET /pki answers: every certificate the machine's
// components and agent use, by name.
type PKIReport struct {
	Certificates []PKICertificate `json:"certificates"`
	// ServiceAccountKeys are the machine's service-account keys, which are
	// no certificates; nil on a machine without them.
	ServiceAccountKeys *PKIKeys `json:"serviceAccountKeys,omitempty"`
}

// PKIKeys names keys by their identifiers (certs.KeyID of
// certs.ServiceAccountKeyPair's stand-in): the one that signs, and those
// whose signatures are taken.
type PKIKeys struct {
	Signer  string   `json:"signer"`
	Trusted []string `json:"trusted"`
}

// Leaves are the certificates that are not authorities.
func (r PKIReport) Leaves() []PKICertificate {
	var out []PKICertificate
	for _, c := range r.Certificates {
		if !c.IsCA {
			out = append(out, c)
		}
	}
	return out
}

// EarliestLeaf is the leaf that expires first; false if there is none.
func (r PKIReport) EarliestLeaf() (PKICertificate, bool) {
	leaves := r.Leaves()
	if len(leaves) == 0 {
		return PKICertificate{}, false
	}
	return slices.MinFunc(leaves, func(a, b PKICertificate) int { return a.NotAfter.Compare(b.NotAfter) }), true
}

// All returns every certificate named name: a trust bundle's several.
func (r PKIReport) All(name string) []PKICertificate {
	var out []PKICertificate
	for _, c := range r.Certificates {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

// Find returns the certificate named name.
func (r PKIReport) Find(name string) (PKICertificate, bool) {
	i := slices.IndexFunc(r.Certificates, func(c PKICertificate) bool { return c.Name == name })
	if i < 0 {
		return PKICertificate{}, false
	}
	return r.Certificates[i], true
}

func describe(name string, c *x509.Certificate, renewable bool) PKICertificate {
	return PKICertificate{
		Name: name, Subject: c.Subject.CommonName, Issuer: c.Issuer.CommonName,
		SerialNumber: c.SerialNumber.Text(16), NotBefore: c.NotBefore, NotAfter: c.NotAfter,
		IsCA: c.IsCA, Renewable: renewable, KeyID: certs.KeyID(c), IssuerKeyID: certs.IssuerKeyID(c),
	}
}

// Report lists the certificates under the PKI directory (every *.crt and
// the client certificates of the *.conf kubeconfigs), then the identities
// in memory. A file that does not parse fails the report, naming it: a
// report that left it out would hide the certificate most in need of a
// look.
func (p *PKI) Report() (PKIReport, error) {
	var r PKIReport
	err := filepath.WalkDir(p.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name, err := filepath.Rel(p.Dir, path)
		if err != nil {
			return err
		}
		var found []*x509.Certificate
		switch {
		case strings.HasSuffix(name, ".crt"):
			found, err = readCertFile(path)
		case strings.HasSuffix(name, ".conf"):
			found, err = readKubeconfigCerts(path)
		default:
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, c := range found {
			r.Certificates = append(r.Certificates, describe(filepath.ToSlash(name), c, p.Renewable(name)))
		}
		return nil
	})
	if err != nil {
		return r, fmt.Errorf("listing the certificates under %s: %w", p.Dir, err)
	}
	if r.ServiceAccountKeys, err = p.serviceAccountKeys(); err != nil {
		return r, err
	}
	for _, id := range []struct {
		name string
		kp   *certs.KeyPair
	}{{memoryNode, p.Node()}, {memoryAdmin, p.Admin()}, {memoryEtcdClient, p.EtcdClient()}} {
		if id.kp != nil {
			r.Certificates = append(r.Certificates, describe(id.name, id.kp.Cert, p.Renewable(id.name)))
		}
	}
	return r, nil
}

// readCertFile returns every certificate of a file: a trust bundle holds
// several.
func readCertFile(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return certs.ParseCerts(data)
}

// readKubeconfigCerts returns the client certificates a kubeconfig embeds.
func readKubeconfigCerts(path string) ([]*x509.Certificate, error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for _, user := range slices.Sorted(maps.Keys(cfg.AuthInfos)) {
		if data := cfg.AuthInfos[user].ClientCertificateData; len(data) > 0 {
			c, err := certs.ParseCert(data)
			if err != nil {
				return nil, fmt.Errorf("user %s: %w", user, err)
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// serviceAccountKeys reads the service-account keys the components read:
// sa.key and sa.pub. nil when the machine has none.
func (p *PKI) serviceAccountKeys() (*PKIKeys, error) {
	path := filepath.Join(p.Dir, ServiceAccountKeyFile)
	keyPEM, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	signer, err := certs.ServiceAccountKeyPair(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	path = filepath.Join(p.Dir, ServiceAccountTrustFile)
	pub, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	ids, err := certs.BundleKeyIDs(pub)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &PKIKeys{Signer: certs.KeyID(signer.Cert), Trusted: strings.Split(ids, ",")}, nil
}
