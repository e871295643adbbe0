// Package certs generates the PKI of a QCP cluster: certificate authorities,
// the service-account key pair, serving and client certificates, and
// kubeconfigs. It uses only the standard library's crypto.
package certs

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

const (
	// CAValidity matches kubeadm's ten-year CA lifetime.
	CAValidity = 10 * 365 * 24 * time.Hour
	// LeafValidity matches kubeadm's one-year leaf certificate lifetime.
	LeafValidity = 365 * 24 * time.Hour
	// clockSkew back-dates certificates so a peer whose clock is a little
	// behind does not reject a certificate issued a moment ago.
	clockSkew = 5 * time.Minute
)

// KeyPair is a certificate with its private key, in parsed and PEM form.
type KeyPair struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
	// LeafValidity is how long the leaves this CA issues are valid when a
	// request names no validity; 0 means the package's LeafValidity.
	LeafValidity time.Duration
}

// Request describes a leaf certificate to issue.
type Request struct {
	CommonName   string
	Organization []string
	DNSNames     []string
	IPs          []net.IP
	// Usages is ServerAuth, ClientAuth or both (etcd peers need both).
	Usages   []x509.ExtKeyUsage
	Validity time.Duration
}

// NewCA creates a self-signed certificate authority.
func NewCA(commonName string, now time.Time) (*KeyPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	return sign(tmpl, tmpl, key, key)
}

// WithLeafValidity is a copy of ca whose leaves are valid for validity
// when a request names none; 0 keeps ca's.
func (ca *KeyPair) WithLeafValidity(validity time.Duration) *KeyPair {
	c := *ca
	c.LeafValidity = cmp.Or(validity, ca.LeafValidity)
	return &c
}

// Issue signs a leaf certificate with this CA.
func (ca *KeyPair) Issue(req Request, now time.Time) (*KeyPair, error) {
	if req.CommonName == "" {
		return nil, errors.New("certificate request needs a common name")
	}
	if len(req.Usages) == 0 {
		return nil, fmt.Errorf("certificate request for %q needs at least one extended key usage", req.CommonName)
	}
	validity := cmp.Or(req.Validity, ca.LeafValidity, LeafValidity)
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: req.CommonName, Organization: req.Organization},
		DNSNames:    req.DNSNames,
		IPAddresses: req.IPs,
		NotBefore:   now.Add(-clockSkew),
		NotAfter:    now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: req.Usages,
	}
	return sign(tmpl, ca.Cert, key, ca.Key)
}

// ParseKeyPair parses a PEM certificate and its PEM private key and checks
// that they belong together.
func ParseKeyPair(certPEM, keyPEM []byte) (*KeyPair, error) {
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, err
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("private key does not match certificate %q", cert.Subject.CommonName)
	}
	return &KeyPair{Cert: cert, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// ParseCert parses the first PEM certificate in data.
func ParseCert(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("certificate is not PEM encoded")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate: %w", err)
	}
	return cert, nil
}

// CertPool returns a pool holding the CA certificates in caPEM.
func CertPool(caPEM []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no CA certificate found in PEM data")
	}
	return pool, nil
}

func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key: %w", err)
	}
	return key, nil
}

func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, signer crypto.Signer) (*KeyPair, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		return nil, fmt.Errorf("signing certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return &KeyPair{Cert: cert, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// parseKeyPEM parses the first PEM block of keyPEM as a private key.
func parseKeyPEM(keyPEM []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("private key is not PEM encoded")
	}
	return parseKey(block)
}

func parseKey(block *pem.Block) (crypto.Signer, error) {
	switch block.Type {
	case "EC PRIVATE KEY":
		return x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		return x509.ParsePKCS1PrivateKey(block.Bytes)
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing private key: %w", err)
		}
		signer, ok := k.(crypto.Signer)
		if !ok {
			return nil, errors.New("private key cannot sign")
		}
		return signer, nil
	}
	return nil, fmt.Errorf("unsupported private key type %q", block.Type)
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	e, ok := a.(equaler)
	return ok && e.Equal(b)
}
