package certs

import (
	"crypto/tls"
	"fmt"
	"sync"
	"time"
)

// RenewFraction is the part of a leaf's life after which QCP issues it
// again: two thirds, as kubelet's and OpenShift's rotation do, so that a
// renewal that fails has a third of the life left to be retried.
const RenewFraction = 2.0 / 3

// Renewing is a client certificate that issues itself again once
// RenewFraction of its life has passed. Its Certificate method serves as a
// tls.Config's GetClientCertificate, which TLS calls at every handshake: a
// long-lived client presents a current certificate on each new connection
// and never needs a restart for it. A connection already open keeps the
// certificate it was made with, which TLS checks only at the handshake.
type Renewing struct {
	issue func(now time.Time) (*KeyPair, error)
	now   func() time.Time

	mu      sync.Mutex
	cert    *tls.Certificate
	renewAt time.Time
	issued  int
}

// NewRenewing issues the first certificate with issue, so that a CA that
// cannot issue fails here, and issues again on demand once due. now is the
// clock; nil means time.Now.
func NewRenewing(issue func(now time.Time) (*KeyPair, error), now func() time.Time) (*Renewing, error) {
	if now == nil {
		now = time.Now
	}
	r := &Renewing{issue: issue, now: now}
	if _, err := r.Certificate(); err != nil {
		return nil, err
	}
	return r, nil
}

// Certificate returns the current certificate, issuing a new one first when
// the current one is due. When issuing fails, the current certificate is
// returned while it is still valid, and the next call tries again.
func (r *Renewing) Certificate() (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if r.cert != nil && now.Before(r.renewAt) {
		return r.cert, nil
	}
	cert, err := r.renew(now)
	if err != nil {
		if r.cert != nil && now.Before(r.cert.Leaf.NotAfter) {
			return r.cert, nil
		}
		return nil, err
	}
	r.cert = cert
	r.renewAt = now.Add(time.Duration(float64(cert.Leaf.NotAfter.Sub(now)) * RenewFraction))
	r.issued++
	return cert, nil
}

func (r *Renewing) renew(now time.Time) (*tls.Certificate, error) {
	pair, err := r.issue(now)
	if err != nil {
		return nil, fmt.Errorf("issuing a client certificate: %w", err)
	}
	cert, err := tls.X509KeyPair(pair.CertPEM, pair.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading the client certificate just issued: %w", err)
	}
	return &cert, nil
}

// ClientCertificate adapts Certificate to tls.Config.GetClientCertificate.
func (r *Renewing) ClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.Certificate()
}

// Issued is how many certificates have been issued so far.
func (r *Renewing) Issued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.issued
}

// RenewAt is when a leaf QCP issued, valid from notBefore to notAfter, is
// due to be issued again: once RenewFraction of its life has passed,
// counted from when it was issued, not from its notBefore, which is
// back-dated by a few minutes (a leaf living minutes in a test would
// otherwise be due at once).
func RenewAt(notBefore, notAfter time.Time) time.Time {
	issued := notBefore.Add(clockSkew)
	if issued.After(notAfter) {
		issued = notBefore
	}
	return issued.Add(time.Duration(float64(notAfter.Sub(issued)) * RenewFraction))
}
