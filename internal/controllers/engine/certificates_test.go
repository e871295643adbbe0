package engine

import (
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/certs"
)

func TestPKIRecords(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	leaf := func(name string, issued time.Time, life time.Duration, renewable bool) agent.PKICertificate {
		// As QCP issues them: notBefore back-dated by the certs package's skew.
		nb := issued.Add(-5 * time.Minute)
		return agent.PKICertificate{Name: name, NotBefore: nb, NotAfter: issued.Add(life), Renewable: renewable}
	}
	rep := agent.PKIReport{Certificates: []agent.PKICertificate{
		{Name: "ca.crt", NotBefore: t0, NotAfter: t0.Add(time.Minute), IsCA: true}, // authorities never count
		leaf("apiserver.crt", t0, 9*time.Minute, true),
		leaf("etcd/server.crt", t0.Add(time.Minute), 6*time.Minute, true),
		// Not the agent's to renew: it expires first, but sets no renewal time.
		leaf("apiserver-etcd-client.crt", t0, 3*time.Minute, false),
	}}
	got, err := pkiRecords(rep)
	if err != nil {
		t.Fatal(err)
	}
	if want := certs.RenewAt(rep.Certificates[2].NotBefore, rep.Certificates[2].NotAfter); !got.RenewAt.Equal(want) || !want.Equal(t0.Add(5*time.Minute)) {
		t.Errorf("renew at %s, want %s (two thirds into etcd/server.crt's six minutes)", got.RenewAt, want)
	}
	if want := t0.Add(3 * time.Minute); !got.Expiry.Equal(want) {
		t.Errorf("expiry %s, want the external pair's %s", got.Expiry, want)
	}
	if _, err := pkiRecords(agent.PKIReport{Certificates: []agent.PKICertificate{rep.Certificates[0], rep.Certificates[3]}}); err == nil {
		t.Error("a report with nothing the agent can renew gave records; want an error")
	}
}
