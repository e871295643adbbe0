package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// PKIRenewResult answers a renewal: the machine's certificates after it,
// what was renewed, and the components restarted to use it.
type PKIRenewResult struct {
	Report PKIReport `json:"report"`
	// Renewed names the leaves issued again, as the report names them.
	Renewed []string `json:"renewed"`
	// Restarted names the components restarted, in order.
	Restarted []string `json:"restarted"`
}

// pkiRenewTimeout bounds a call of POST /pki/renew or PUT of an
// authority: the agent answers once the components it restarts are
// healthy again, and a front-proxy trust change restarts three.
const pkiRenewTimeout = 5 * time.Minute

// restartHealthyTimeout bounds the wait for a restarted component to pass
// its probe again. A kube-apiserver on a busy host, or with large watch
// caches to fill, can take more than a minute to be ready again (kubeadm
// waits up to four for one); 50 s failed a restart that was merely slow
// on a loaded CI host, and the step then failed with it.
const restartHealthyTimeout = 90 * time.Second

// restartPoll is how often the wait reads the supervisor's and the
// prober's state; the prober itself checks every probeEvery.
const restartPoll = 250 * time.Millisecond

// kubeconfigReaders are the components that read their client certificate
// once, from a kubeconfig that embeds it, and are restarted to read the
// renewed one. Each is leader-elected, so a restart moves leadership at
// worst. The others reload: etcd reads its server and peer certificates at
// every handshake, kube-apiserver watches its serving certificate
// (dynamiccertificates) and reads its etcd client pair at every etcd
// handshake, and the agent's identities are swapped in memory. See
// TestPKIRenewal in internal/machinehost for each.
var kubeconfigReaders = []bootstrap.Component{bootstrap.KubeControllerManager, bootstrap.KubeScheduler}

// servingPair is a certificate pair served from files, read again after a
// renewal rather than at each handshake.
type servingPair struct {
	certFile, keyFile string

	mu   sync.Mutex
	cert *tls.Certificate
}

func (s *servingPair) load() error {
	pair, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cert = &pair
	return nil
}

func (s *servingPair) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert, nil
}

func (a *machineCtx) getPKI(w http.ResponseWriter, _ *http.Request) {
	r, err := a.pki.Report()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	writeJSON(w, r)
}

// postRenewPKI renews the machine's leaves. A renewal asked for while one
// runs is refused with 409 rather than queued: the caller's own timeout
// would often end before its turn came, and the running one renews the
// same certificates. The renewal runs under ctx, the endpoint's, not the
// request's: a caller that gives up does not leave the restarts half done.
func (a *machineCtx) postRenewPKI(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	req, err := decodeRenewRequest(http.MaxBytesReader(w, r.Body, maxRenewBody))
	if err != nil {
		http.Error(w, "invalid renewal: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !a.renewing.TryLock() {
		http.Error(w, "a renewal of this machine's certificates is already running: retry once it has finished", http.StatusConflict)
		return
	}
	defer a.renewing.Unlock()
	res, err := a.renewPKI(ctx, time.Now(), req)
	if err != nil {
		a.log.Error("certificate renewal failed", "err", err, "renewed", res.Renewed, "restarted", res.Restarted, "client", clientName(r))
		status := http.StatusInternalServerError
		if errors.As(err, new(invalidMaterial)) {
			status = http.StatusBadRequest
		}
		http.Error(w, err.Error(), status)
		return
	}
	earliest, _ := res.Report.EarliestLeaf()
	a.log.Info("certificates renewed", "renewed", res.Renewed, "restarted", res.Restarted,
		"earliestNotAfter", earliest.NotAfter, "client", clientName(r))
	writeJSON(w, res)
}

// renewPKI issues the leaves again, then makes each reader use them: the
// endpoint's own serving pair and the node agent's clients at once, and
// the components that cannot reload one at a time, each healthy again
// before the next restarts. Hold a.renewing.
func (a *machineCtx) renewPKI(ctx context.Context, now time.Time, req PKIRenewRequest) (PKIRenewResult, error) {
	res := PKIRenewResult{Restarted: []string{}}
	var err error
	fail := func(what string, err error) (PKIRenewResult, error) {
		return res, fmt.Errorf("machine %s: renewing certificates: %s: %w", a.machine, what, err)
	}
	delivered, err := a.pki.deliverEtcdClient(req, now)
	if err != nil {
		return fail("the etcd client pair sent", err)
	}
	if res.Renewed, err = a.pki.Renew(now); err != nil {
		return fail("issuing", err)
	}
	if delivered {
		res.Renewed = append(res.Renewed, "apiserver-etcd-client.crt")
	}
	if a.adminPair != nil {
		if err := a.adminPair.load(); err != nil {
			return fail("loading the endpoint's renewed serving certificate", err)
		}
	}
	if n := a.node.Load(); n != nil {
		if err := n.newClients(); err != nil {
			return fail("building the Node's clients", err)
		}
	}
	if res.Restarted, err = a.restartInTurn(ctx, kubeconfigReaders, "its kubeconfig's client certificate was renewed"); err != nil {
		return fail("restarting", err)
	}
	if res.Report, err = a.pki.Report(); err != nil {
		return fail("reporting", err)
	}
	return res, nil
}

// waitRestarted waits until component c runs as a process started after
// since and has passed a probe made after that start.
func (a *machineCtx) waitRestarted(ctx context.Context, c bootstrap.Component, since time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, restartHealthyTimeout)
	defer cancel()
	tick := time.NewTicker(restartPoll)
	defer tick.Stop()
	for {
		st, pr := a.sup.Snapshot()[c], a.prober.snapshot()[c]
		if st.Running && st.StartedAt.After(since) && pr.OK && pr.Time.After(st.StartedAt) {
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("not healthy %v after its restart (running %v since %v; last probe %+v): see its log", restartHealthyTimeout, st.Running, st.StartedAt, pr)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// GetPKI lists the certificates of the machine at host (its IP address).
// On a machine that runs etcd, tlsCfg trusts the etcd CA and holds a
// client certificate of it; on a control plane machine without a member,
// it trusts the cluster CA and holds a client certificate of it named
// ManagerCommonName (engine.AgentClients).
func GetPKI(ctx context.Context, tlsCfg *tls.Config, host string) (PKIReport, error) {
	var r PKIReport
	err := callAgent(ctx, tlsCfg, host, http.MethodGet, PKIPath, etcdSettingsTimeout, nil, &r)
	return r, err
}

// RenewPKI renews the certificates the agent of the machine at host issued,
// puts in place the material req carries, and returns once every component
// uses them, restarting the ones that cannot reload them. tlsCfg is as for
// GetPKI.
func RenewPKI(ctx context.Context, tlsCfg *tls.Config, host string, req PKIRenewRequest) (PKIRenewResult, error) {
	var res PKIRenewResult
	err := sendAgent(ctx, tlsCfg, host, http.MethodPost, PKIRenewPath, pkiRenewTimeout, req, &res)
	return res, err
}
