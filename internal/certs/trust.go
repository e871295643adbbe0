package certs

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ParseCerts parses every PEM certificate in data, in order, and fails on
// anything else: a trust bundle with a stray block is not what its writer
// meant.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	return parseBundle(data, "certificate", map[string]func([]byte) (*x509.Certificate, error){"CERTIFICATE": x509.ParseCertificate})
}

// parseBundle parses every PEM block of data, in order, with the parser
// of its type; a block of another type, or data that is not PEM, fails.
// what names the entries in errors.
func parseBundle(data []byte, what string, parsers map[string]func([]byte) (*x509.Certificate, error)) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for rest := bytes.TrimSpace(data); len(rest) > 0; rest = bytes.TrimSpace(rest) {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		var parse func([]byte) (*x509.Certificate, error)
		if block != nil {
			parse = parsers[block.Type]
		}
		if parse == nil {
			return nil, fmt.Errorf("%s %d is not PEM encoded", what, len(out)+1)
		}
		c, err := parse(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s %d: %w", what, len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no PEM %s found", what)
	}
	return out, nil
}

// KeyID names an authority by its subject key identifier, in hexadecimal,
// the way leaves name their issuer (AuthorityKeyId): two authorities of a
// rotation may share a common name, never a key.
func KeyID(c *x509.Certificate) string { return hex.EncodeToString(c.SubjectKeyId) }

// IssuerKeyID is the key identifier of the authority that signed c.
func IssuerKeyID(c *x509.Certificate) string { return hex.EncodeToString(c.AuthorityKeyId) }

// Bundle is the PEM trust bundle of the authorities cas, in order,
// skipping repeats.
func Bundle(cas ...*KeyPair) []byte {
	var out []byte
	var seen []string
	for _, ca := range cas {
		if id := KeyID(ca.Cert); !slices.Contains(seen, id) {
			seen = append(seen, id)
			out = append(out, ca.CertPEM...)
		}
	}
	return out
}

// BundleKeyIDs lists the key identifiers of the authorities in a PEM
// bundle (certificates, or service-account public keys), sorted, joined
// with commas: the form the records compare.
func BundleKeyIDs(bundle []byte) (string, error) {
	cs, err := parseAuthorities(bundle)
	if err != nil {
		return "", err
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, KeyID(c))
	}
	slices.Sort(ids)
	return strings.Join(slices.Compact(ids), ","), nil
}

// WithoutAuthority is bundle without the certificates of the authority
// ca (those with its key), in order, and whether any was removed. A
// bundle that does not parse is an error: what it meant to trust cannot
// be told.
func WithoutAuthority(bundle []byte, ca *x509.Certificate) ([]byte, bool, error) {
	cs, err := ParseCerts(bundle)
	if err != nil {
		return nil, false, err
	}
	var out []byte
	removed := false
	for _, c := range cs {
		if KeyID(c) == KeyID(ca) {
			removed = true
			continue
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out, removed, nil
}

// CheckBundle checks that bundle parses, holds only authorities, and
// holds signer's certificate (a service-account bundle: public keys, and
// signer's): a machine must trust the authority it issues its
// certificates from.
func CheckBundle(bundle []byte, signer *KeyPair) error {
	cs, err := parseAuthorities(bundle)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if !c.IsCA {
			return fmt.Errorf("certificate %q is not an authority", c.Subject.CommonName)
		}
	}
	if !slices.ContainsFunc(cs, func(c *x509.Certificate) bool { return c.Equal(signer.Cert) }) {
		return fmt.Errorf("it does not hold the issuing authority %q (%s)", signer.Cert.Subject.CommonName, KeyID(signer.Cert))
	}
	return nil
}

// ReissueFrom signs leaf, which prev signed, again from ca for leaf's own
// key, as Reissue does: how a leaf moves to the new authority of a
// rotation. It refuses a leaf prev did not sign.
func (ca *KeyPair) ReissueFrom(prev, leaf *KeyPair, now time.Time) (*KeyPair, error) {
	if prev.Cert.Equal(ca.Cert) {
		return ca.Reissue(leaf, now)
	}
	// reissue checks the leaf against its receiver's certificate and signs
	// with its key: a copy of ca naming prev's certificate does both.
	signer := *ca
	signer.Cert = prev.Cert
	return signer.reissue(leaf, now, ca.Cert)
}

// DynamicRootsConfig is a client TLS configuration that verifies servers
// against the PEM bundle trust returns at each handshake (the standard
// library's own checks, with the server's name), so that a trust bundle a
// rotation replaces takes effect without building the client again.
func DynamicRootsConfig(trust func() []byte) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verified below, against the bundle of the moment.
		InsecureSkipVerify: true, //nolint:gosec
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the server presented no certificate")
			}
			roots, err := CertPool(trust())
			if err != nil {
				return err
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: cs.ServerName})
			return err
		},
	}
}
