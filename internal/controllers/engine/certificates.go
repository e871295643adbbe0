package engine

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// MachineIP is machine's internal IP, or "" while it has none.
func MachineIP(machine *clusterv1.Machine) string {
	for _, a := range machine.Status.Addresses {
		if a.Type == clusterv1.MachineInternalIP && net.ParseIP(a.Address) != nil {
			return a.Address
		}
	}
	return ""
}

// PKIRecords are what a machine's certificates tell the planner: when the
// first of its leaves is due for renewal, and when the first expires.
type PKIRecords struct {
	RenewAt, Expiry time.Time
	// EtcdClientSerial is the serial number (hexadecimal) of the API
	// server's etcd client certificate, "" if the machine has none.
	EtcdClientSerial string
	// Authorities are, by kind, AuthorityAnnotation's values.
	Authorities map[agent.AuthorityKind]string
}

// authorityLeaves are, by kind, the leaves a machine issues from that
// authority, as the agent's report names them, the trust bundle it keeps,
// the annotation that records them (AuthorityAnnotation), and the
// authority kube-controller-manager signs certificate requests with ("" for
// none); a machine without the first leaf has none of that kind.
var authorityLeaves = map[agent.AuthorityKind]struct {
	leaves     []string
	trust      string
	annotation string
	signer     string
}{
	agent.EtcdAuthorityKind: {[]string{"etcd/server.crt", "etcd/peer.crt", etcdClientFile, "memory:etcd-client"}, "etcd/ca.crt", EtcdAuthorityAnnotation, ""},
	agent.ClusterAuthorityKind: {[]string{"memory:node", "memory:admin", "apiserver.crt", "apiserver-kubelet-client.crt",
		"controller-manager.conf", "controller-manager-serving.crt", "scheduler.conf", "scheduler-serving.crt", "agent-serving.crt"}, agent.ClusterTrustFile, ClusterAuthorityAnnotation, "ca.crt"},
	agent.FrontProxyAuthorityKind: {[]string{"front-proxy-client.crt"}, agent.FrontProxyTrustFile, FrontProxyAuthorityAnnotation, ""},
	// No certificates: the report names the keys apart.
	agent.ServiceAccountAuthorityKind: {nil, "", ServiceAccountAuthorityAnnotation, ""},
}

// NoAuthority is AuthorityAnnotation on a machine without leaves of the
// kind.
const NoAuthority = "none"

// AuthorityOf is what a machine's report says of its authorities of kind
// k (AuthorityAnnotation): "<issuer>/<trusted>", and of the cluster kind
// "<issuer>/<trusted>/<kube-controller-manager's signer>".
func AuthorityOf(rep agent.PKIReport, k agent.AuthorityKind) string {
	if k == agent.ServiceAccountAuthorityKind {
		keys := rep.ServiceAccountKeys
		if keys == nil {
			return NoAuthority
		}
		trusted := slices.Sorted(slices.Values(keys.Trusted))
		return keys.Signer + "/" + strings.Join(slices.Compact(trusted), ",")
	}
	kind := authorityLeaves[k]
	if _, ok := rep.Find(kind.leaves[0]); !ok {
		return NoAuthority
	}
	issuer := ""
	for _, name := range kind.leaves {
		c, ok := rep.Find(name)
		switch {
		case !ok:
		case issuer == "":
			issuer = c.IssuerKeyID
		case issuer != c.IssuerKeyID:
			issuer = "mixed"
		}
	}
	var trusted []string
	for _, c := range rep.All(kind.trust) {
		trusted = append(trusted, c.KeyID)
	}
	slices.Sort(trusted)
	rec := issuer + "/" + strings.Join(slices.Compact(trusted), ",")
	if kind.signer != "" {
		c, _ := rep.Find(kind.signer)
		rec += "/" + c.KeyID
	}
	return rec
}

// AuthorityUpdate is what machine lacks of the authority of kind k that
// want names ("<issuer>/<trusted>", as AuthorityAnnotation; "" when no
// rotation runs): nothing while its record is unknown. Only a change of
// the etcd trust restarts the member; every cluster authority change is a
// move that restarts no member.
func AuthorityUpdate(machine *clusterv1.Machine, k agent.AuthorityKind, want string) quorum.AuthorityUpdate {
	rec := machine.Annotations[AuthorityAnnotation(k)]
	if want == "" || rec == "" || rec == NoAuthority || rec == want {
		return quorum.AuthorityCurrent
	}
	_, trusted, _ := strings.Cut(rec, "/")
	_, wantTrusted, _ := strings.Cut(want, "/")
	if k == agent.EtcdAuthorityKind && trusted != wantTrusted {
		return quorum.AuthorityTrust
	}
	return quorum.AuthorityLeaves
}

// etcdClientFile is the API server's etcd client certificate, as the
// agent's report names it.
const etcdClientFile = "apiserver-etcd-client.crt"

// SerialOf is how the records write a certificate's serial number.
func SerialOf(kp *certs.KeyPair) string { return kp.Cert.SerialNumber.Text(16) }

// pkiRecords reads a PKI report of the machine's agent. Each leaf the
// agent can issue again is due once it has lived certs.RenewFraction of
// its life (certs.RenewAt); the expiry is the earliest of all leaves,
// renewable or not (an external etcd's pair, which only its owner
// renews). A report without a renewable leaf is an error: the planner
// must not take a machine it cannot read for one with nothing to renew.
func pkiRecords(rep agent.PKIReport) (PKIRecords, error) {
	var r PKIRecords
	for _, c := range rep.Leaves() {
		if due := certs.RenewAt(c.NotBefore, c.NotAfter); c.Renewable && (r.RenewAt.IsZero() || due.Before(r.RenewAt)) {
			r.RenewAt = due
		}
		if r.Expiry.IsZero() || c.NotAfter.Before(r.Expiry) {
			r.Expiry = c.NotAfter
		}
	}
	if r.RenewAt.IsZero() {
		return r, errors.New("its agent reported no certificate it can issue again")
	}
	if c, ok := rep.Find(etcdClientFile); ok {
		r.EtcdClientSerial = c.SerialNumber
	}
	r.Authorities = map[agent.AuthorityKind]string{}
	for _, k := range agent.AuthorityKinds {
		r.Authorities[k] = AuthorityOf(rep, k)
	}
	return r, nil
}

// Set writes the records on machine (the caller writes it): QCP's own
// renewal time, CAPI's certificates-expiry annotation, which
// rollout.before.certificatesExpiryDays reads, and with delivered the
// serial of the etcd client pair the machine holds.
func (r PKIRecords) Set(machine *clusterv1.Machine, delivered bool) {
	if machine.Annotations == nil {
		machine.Annotations = map[string]string{}
	}
	r.set(machine.Annotations, delivered)
}

func (r PKIRecords) set(a map[string]string, delivered bool) {
	a[CertificatesRenewAtAnnotation] = FormatTime(r.RenewAt)
	a[clusterv1.MachineCertificatesExpiryDateAnnotation] = FormatTime(r.Expiry)
	if delivered && r.EtcdClientSerial != "" {
		a[EtcdClientSerialAnnotation] = r.EtcdClientSerial
	}
	for k, rec := range r.Authorities {
		if rec != "" {
			a[AuthorityAnnotation(k)] = rec
		}
	}
}

// EtcdClientStale reports whether machine holds another etcd client pair
// than want, by its record; a machine without a record is not known to.
func EtcdClientStale(machine *clusterv1.Machine, want *certs.KeyPair) bool {
	held, ok := machine.Annotations[EtcdClientSerialAnnotation]
	return want != nil && ok && held != SerialOf(want)
}

// NeedsPKIRead reports whether QCP has yet to read machine's certificates:
// it has no renewal record, or one that does not parse, or no record of its
// authorities.
func NeedsPKIRead(machine *clusterv1.Machine) bool {
	for _, k := range agent.AuthorityKinds {
		if _, ok := machine.Annotations[AuthorityAnnotation(k)]; !ok {
			return true
		}
	}
	return ReadRecords(machine).CertificatesRenewAt.IsZero()
}

// MemberServes reports whether machine hosts a healthy, started etcd
// member: its agent's endpoint then answers.
func (o *Observation) MemberServes(machine *clusterv1.Machine) bool {
	mb, found := o.MemberOn(machine)
	return found && mb.Healthy && mb.Started()
}

// ReadPKI reads the certificates of machine, which the caller knows to be
// running, if QCP has not read them yet (GET /pki on its agent's
// endpoint, with AgentTLS). ok is false when there was nothing to read, or
// it could not be read yet (err says why; the caller tries again next
// time).
func (o *Observation) ReadPKI(ctx context.Context, machine *clusterv1.Machine) (rec PKIRecords, ok bool, err error) {
	if o.AgentTLS == nil || !machine.DeletionTimestamp.IsZero() || !NeedsPKIRead(machine) {
		return rec, false, nil
	}
	host := MachineIP(machine)
	if host == "" {
		return rec, false, errors.New("the machine has no address yet")
	}
	rep, err := agent.GetPKI(ctx, o.AgentTLS, host)
	if err == nil {
		rec, err = pkiRecords(rep)
	}
	return rec, err == nil, err
}

// renewCertificates records the start on the machine, has its agent issue
// its leaves again (the agent rewrites the files and makes each component
// use them, restarting only those that cannot reload), and records the new
// renewal time and expiry. A failure leaves the start recorded: the
// planner counts the renewal as in flight until its RenewTimeout, then
// tries again.
func (x Executor) renewCertificates(ctx context.Context, d quorum.Decision, machine *clusterv1.Machine) error {
	host := MachineIP(machine)
	if host == "" {
		return fmt.Errorf("renewing the certificates of machine %s: it has no address", machine.Name)
	}
	if x.AgentTLS == nil {
		return fmt.Errorf("renewing the certificates of machine %s: qcp-manager has no client certificate for its agent yet", machine.Name)
	}
	if err := x.annotate(ctx, machine, func(a map[string]string) { a[RenewStartedAnnotation] = FormatTime(x.Now()) }); err != nil {
		return err
	}
	var req agent.PKIRenewRequest
	if pair := x.EtcdClientPair; pair != nil {
		req.EtcdClientCert, req.EtcdClientKey = pair.CertPEM, pair.KeyPEM
	}
	res, err := agent.RenewPKI(ctx, x.AgentTLS, host, req)
	if err != nil {
		return fmt.Errorf("renewing the certificates of machine %s: %w", machine.Name, err)
	}
	rec, err := pkiRecords(res.Report)
	if err != nil {
		return fmt.Errorf("machine %s renewed its certificates, but %w", machine.Name, err)
	}
	return x.recordOwn(ctx, machine, func(a map[string]string) {
		delete(a, RenewStartedAnnotation)
		rec.set(a, x.EtcdClientPair != nil)
	})
}

// setAuthority records the start on the machine (a restart's record when
// the step restarts its member, a renewal's otherwise), has its agent take
// the authority of the rotation's stage, and records what the machine then
// reports. A failure leaves the start recorded, as a
// renewal's or a restart's does.
func (x Executor) setAuthority(ctx context.Context, d quorum.Decision, machine *clusterv1.Machine) error {
	host := MachineIP(machine)
	switch {
	case host == "":
		return fmt.Errorf("setting the %s authority of machine %s: it has no address", x.AuthorityKind, machine.Name)
	case x.AgentTLS == nil:
		return fmt.Errorf("setting the %s authority of machine %s: qcp-manager has no client certificate for its agent yet", x.AuthorityKind, machine.Name)
	case x.Authority == nil:
		return fmt.Errorf("setting the %s authority of machine %s: no CA rotation runs", x.AuthorityKind, machine.Name)
	}
	started := RenewStartedAnnotation
	if d.RestartsMember {
		started = RestartStartedAnnotation
	}
	if err := x.annotate(ctx, machine, func(a map[string]string) { a[started] = FormatTime(x.Now()) }); err != nil {
		return err
	}
	res, err := agent.SetAuthority(ctx, x.AgentTLS, host, x.AuthorityKind, *x.Authority)
	if err != nil {
		return fmt.Errorf("setting the %s authority of machine %s: %w", x.AuthorityKind, machine.Name, err)
	}
	rec, err := pkiRecords(res.Report)
	if err != nil {
		return fmt.Errorf("machine %s took the %s authority, but %w", machine.Name, x.AuthorityKind, err)
	}
	return x.recordOwn(ctx, machine, func(a map[string]string) {
		delete(a, started)
		rec.set(a, false)
	})
}

// AgentClients are qcp-manager's client certificates for the agents of
// control plane machines that run no etcd member (on an external etcd or
// an EtcdCluster): such an agent has no etcd CA to trust, and takes a
// certificate of the cluster CA with the common name
// agent.ManagerCommonName instead, which no Node's certificate has. Like
// the pooled etcd clients', each renews itself after two thirds of its
// life, without a restart. One is kept per cluster, and made again when
// the cluster's CA changes.
type AgentClients struct {
	mu      sync.Mutex
	clients map[string]agentClient
}

type agentClient struct {
	caPEM, trust []byte
	tls          *tls.Config
}

// TLSConfig returns the client configuration for the agents of the
// cluster named key, whose CA is ca, with a certificate valid for lifetime
// (0: certs.LeafValidity), trusting the PEM bundle trust (nil: ca alone;
// a cluster CA rotation trusts two).
func (a *AgentClients) TLSConfig(key string, ca *certs.KeyPair, trust []byte, lifetime time.Duration) (*tls.Config, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if trust == nil {
		trust = ca.CertPEM
	}
	if c, ok := a.clients[key]; ok && bytes.Equal(c.caPEM, ca.CertPEM) && bytes.Equal(c.trust, trust) {
		return c.tls.Clone(), nil
	}
	roots, err := certs.CertPool(trust)
	if err != nil {
		return nil, fmt.Errorf("the cluster CA: %w", err)
	}
	cert, err := certs.NewRenewing(func(at time.Time) (*certs.KeyPair, error) {
		return ca.Issue(certs.Request{CommonName: agent.ManagerCommonName, Usages: certs.ClientUsage, Validity: lifetime}, at)
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("issuing qcp-manager's client certificate for the machines' agents: %w", err)
	}
	cfg := &tls.Config{RootCAs: roots, GetClientCertificate: cert.ClientCertificate, MinVersion: tls.VersionTLS12}
	if a.clients == nil {
		a.clients = map[string]agentClient{}
	}
	a.clients[key] = agentClient{caPEM: ca.CertPEM, trust: trust, tls: cfg}
	return cfg.Clone(), nil
}

// Forget drops the client of the cluster named key, once it is deleted.
func (a *AgentClients) Forget(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.clients, key)
}
