package certs

import (
	"cmp"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"time"
)

// Reissue signs leaf's certificate again, for leaf's own key, with its
// subject, names and usages, valid from now for the CA's leaf validity, as
// kubeadm's `certs renew` does. The key stays: a component that reads the
// key file and the certificate file at separate moments never pairs a new
// certificate with an old key, and the key's PEM is returned unchanged.
// Only a leaf this CA signed can be reissued, so a renewal cannot move a
// certificate to another authority.
func (ca *KeyPair) Reissue(leaf *KeyPair, now time.Time) (*KeyPair, error) {
	return ca.reissue(leaf, now, ca.Cert)
}

// reissue is Reissue, with parent as the issuer the new certificate names
// (ca.Cert, unless ReissueFrom moves the leaf to another authority).
func (ca *KeyPair) reissue(leaf *KeyPair, now time.Time, parent *x509.Certificate) (*KeyPair, error) {
	old := leaf.Cert
	if leaf.Key == nil || leaf.KeyPEM == nil {
		return nil, fmt.Errorf("certificate %q: reissuing needs its private key", old.Subject.CommonName)
	}
	if old.IsCA {
		return nil, fmt.Errorf("certificate %q is a CA: only leaves are reissued", old.Subject.CommonName)
	}
	if err := old.CheckSignatureFrom(ca.Cert); err != nil {
		return nil, fmt.Errorf("certificate %q was not signed by CA %q: %w", old.Subject.CommonName, ca.Cert.Subject.CommonName, err)
	}
	if !publicKeysEqual(old.PublicKey, leaf.Key.Public()) {
		return nil, fmt.Errorf("private key does not match certificate %q", old.Subject.CommonName)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:   serial,
		Subject:        old.Subject,
		DNSNames:       old.DNSNames,
		IPAddresses:    old.IPAddresses,
		EmailAddresses: old.EmailAddresses,
		URIs:           old.URIs,
		NotBefore:      now.Add(-clockSkew),
		NotAfter:       now.Add(cmp.Or(ca.LeafValidity, LeafValidity)),
		KeyUsage:       old.KeyUsage,
		ExtKeyUsage:    old.ExtKeyUsage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, leaf.Key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing certificate %q again: %w", old.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate %q: %w", old.Subject.CommonName, err)
	}
	return &KeyPair{Cert: cert, Key: leaf.Key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: leaf.KeyPEM}, nil
}
