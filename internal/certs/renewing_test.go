package certs

import (
	"errors"
	"testing"
	"time"
)

// TestRenewing: the first certificate is issued at once; the same one is
// served until two thirds of its life have passed, then a new one; a failed
// renewal keeps serving the current certificate while it is valid and is
// retried at the next call, and fails once that certificate has expired.
func TestRenewing(t *testing.T) {
	ca, err := NewCA("etcd-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca.LeafValidity = 30 * time.Minute
	now := time.Now()
	broken := false
	r, err := NewRenewing(func(at time.Time) (*KeyPair, error) {
		if broken {
			return nil, errors.New("the CA is gone")
		}
		return IssueEtcdClient(ca, "qcp-manager", at)
	}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	first, err := r.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	// x509 keeps whole seconds.
	if life := first.Leaf.NotAfter.Sub(now); life <= 30*time.Minute-time.Second || life > 30*time.Minute {
		t.Errorf("first certificate lives %s; want the CA's leaf validity, 30m", life)
	}

	now = now.Add(19 * time.Minute)
	if c, _ := r.Certificate(); c != first {
		t.Error("a certificate with more than a third of its life left was issued again")
	}
	now = now.Add(2 * time.Minute) // 21 of 30 minutes: past two thirds
	second, err := r.Certificate()
	if err != nil || second == first || !second.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Fatalf("past two thirds of its life: got %v (err %v); want a new certificate that lives longer", second, err)
	}
	if r.Issued() != 2 {
		t.Errorf("issued %d certificates, want 2", r.Issued())
	}

	broken = true
	now = now.Add(21 * time.Minute) // the second is due, and still valid
	if c, err := r.Certificate(); err != nil || c != second {
		t.Errorf("renewal failed while the current certificate is valid: got %v, %v; want the current one", c, err)
	}
	now = now.Add(10 * time.Minute) // the second has expired
	if _, err := r.Certificate(); err == nil {
		t.Error("renewal failed and the current certificate has expired, yet no error")
	}
	broken = false
	if c, err := r.Certificate(); err != nil || c == second {
		t.Errorf("renewal works again: got %v, %v; want a new certificate", c, err)
	}
}

func TestRenewAt(t *testing.T) {
	ca, err := NewCA("test-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	issued := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	leaf, err := ca.Issue(Request{CommonName: "leaf", Usages: ClientUsage, Validity: 6 * time.Minute}, issued)
	if err != nil {
		t.Fatal(err)
	}
	// Two thirds of six minutes after issue, not of the back-dated life.
	if got, want := RenewAt(leaf.Cert.NotBefore, leaf.Cert.NotAfter), issued.Add(4*time.Minute); !got.Equal(want) {
		t.Errorf("RenewAt = %s, want %s", got, want)
	}
}
