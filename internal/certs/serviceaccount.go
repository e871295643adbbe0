package certs

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// publicKeyBlock is the PEM type of a PKIX public key: what CAPI's
// <cluster>-sa Secret holds under tls.crt, and kube-apiserver's
// --service-account-key-file.
const publicKeyBlock = "PUBLIC KEY"

// The service-account key is no certificate, yet a rotation treats it as
// an authority: trusted beside its successor, then replaced as the signer,
// then distrusted. So that one set of records serves both, the key is a
// KeyPair whose Cert is not a signed certificate but stands for the public
// key: Raw is its PKIX DER (so Equal compares keys), SubjectKeyId the
// SHA-256 of that DER (so KeyID names it), IsCA true, and PublicKey the
// key. CertPEM is the PEM public key and KeyPEM the PEM private key, as
// the <cluster>-sa Secret holds them. Nothing may sign with such a pair's
// Cert as a parent: only service-account paths handle it.

// publicKeyCert stands for the public key whose PKIX DER is der.
func publicKeyCert(der []byte) (*x509.Certificate, error) {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("parsing public key: %w", err)
	}
	id := sha256.Sum256(der)
	return &x509.Certificate{Raw: der, RawSubjectPublicKeyInfo: der, PublicKey: pub, SubjectKeyId: id[:], IsCA: true}, nil
}

// ServiceAccountKeyPair makes the service-account pair of a PEM private
// key: its public key is derived.
func ServiceAccountKeyPair(keyPEM []byte) (*KeyPair, error) {
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, fmt.Errorf("encoding the public key: %w", err)
	}
	cert, err := publicKeyCert(der)
	if err != nil {
		return nil, err
	}
	return &KeyPair{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: publicKeyBlock, Bytes: der}), KeyPEM: keyPEM}, nil
}

// ParseServiceAccountKeyPair parses a PEM public key and its PEM private
// key, as the <cluster>-sa Secret holds them, and checks that they belong
// together. CertPEM keeps pubPEM as it is.
func ParseServiceAccountKeyPair(pubPEM, keyPEM []byte) (*KeyPair, error) {
	kp, err := ServiceAccountKeyPair(keyPEM)
	if err != nil {
		return nil, err
	}
	keys, err := parseAuthorities(pubPEM)
	if err != nil {
		return nil, err
	}
	if len(keys) != 1 || !keys[0].Equal(kp.Cert) {
		return nil, errors.New("the public key is not the private key's")
	}
	kp.CertPEM = pubPEM
	return kp, nil
}

// NewServiceAccountKeyPair generates a service-account key pair.
func NewServiceAccountKeyPair() (*KeyPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return ServiceAccountKeyPair(keyPEM)
}

// parseAuthorities parses every PEM block of a trust bundle, in order: a
// certificate, or a public key (a service-account key bundle), which
// stands for itself as described above. Anything else fails.
func parseAuthorities(data []byte) ([]*x509.Certificate, error) {
	return parseBundle(data, "certificate or public key", map[string]func([]byte) (*x509.Certificate, error){
		"CERTIFICATE": x509.ParseCertificate, publicKeyBlock: publicKeyCert})
}
