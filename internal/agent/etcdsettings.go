package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/qcp-dev/qcp/internal/atomicfile"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// EtcdSettingsFile, in the machine directory, holds the etcd settings the
// manager set on the running machine. They override the bootstrap data's,
// which is read once at boot and never changes.
const EtcdSettingsFile = "etcd-settings.json"

// EtcdSettingsPath is the path of the agent's etcd settings endpoint.
const EtcdSettingsPath = "/etcd/settings"

// EtcdSettings are the settings of a machine's etcd member that the manager
// may change without replacing the machine.
type EtcdSettings struct {
	// QuotaBackendBytes is etcd's --quota-backend-bytes; 0 is etcd's
	// default (2 GiB), which only a machine never changed reports.
	QuotaBackendBytes int64 `json:"quotaBackendBytes"`
}

// EtcdSettingsResult answers a change of the settings.
type EtcdSettingsResult struct {
	// Restarted says that this request restarted etcd. It is false when
	// the settings were already in effect, and also when etcd has not
	// started yet or a restart was pending: its next start uses them.
	Restarted bool         `json:"restarted"`
	Settings  EtcdSettings `json:"settings"`
}

// maxSettingsBody bounds a request body: the settings are a few bytes.
const maxSettingsBody = 4 << 10

// etcdSettingsTimeout bounds a call of the endpoint: the agent answers once
// the file is written and etcd is told to restart, not once it is back.
const etcdSettingsTimeout = 10 * time.Second

// etcdSettingsState is what the settings file says, over the document.
type etcdSettingsState struct {
	// mu serializes changes, from reading the value to restarting etcd.
	mu sync.Mutex
	// saved is the settings file's content, nil while there is none.
	saved *EtcdSettings
}

// effectiveLocked is the settings etcd runs with; hold mu.
func (a *machineCtx) effectiveLocked() EtcdSettings {
	if s := a.etcdSettings.saved; s != nil {
		return *s
	}
	var s EtcdSettings
	if local := a.doc.Etcd.Local; local != nil {
		s.QuotaBackendBytes = local.QuotaBackendBytes
	}
	return s
}

func (a *machineCtx) effectiveEtcdSettings() EtcdSettings {
	a.etcdSettings.mu.Lock()
	defer a.etcdSettings.mu.Unlock()
	return a.effectiveLocked()
}

// etcdSettingsArgs are etcd's flags for its settings, computed at each start.
func (a *machineCtx) etcdSettingsArgs() []string {
	if q := a.effectiveEtcdSettings().QuotaBackendBytes; q > 0 {
		return []string{"--quota-backend-bytes=" + strconv.FormatInt(q, 10)}
	}
	return nil
}

// validate returns a message naming the field, for a client to fix.
func (s EtcdSettings) validate() error {
	if s.QuotaBackendBytes <= 0 {
		return fmt.Errorf("quotaBackendBytes: %d is not a positive number of bytes; set etcd's backend quota in bytes, e.g. 8589934592 for 8 GiB", s.QuotaBackendBytes)
	}
	return nil
}

// decodeEtcdSettings decodes one JSON object strictly.
func decodeEtcdSettings(r io.Reader) (EtcdSettings, error) {
	var s EtcdSettings
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); errors.Is(err, io.EOF) {
		return s, errors.New(`no settings: send a JSON object such as {"quotaBackendBytes": 8589934592}`)
	} else if err != nil {
		return s, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return s, errors.New("data after the JSON object")
	}
	return s, s.validate()
}

// loadEtcdSettings reads the settings file, if there is one. A file that
// cannot be read is an error rather than a silent return to the document's
// settings, which may be what filled etcd's database in the first place.
func (a *machineCtx) loadEtcdSettings() error {
	path := filepath.Join(a.dir, EtcdSettingsFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		var s EtcdSettings
		if s, err = decodeEtcdSettings(bytes.NewReader(data)); err == nil {
			a.etcdSettings.saved = &s
			a.log.Info("etcd settings from the settings file override the bootstrap data's", "file", path, "quotaBackendBytes", s.QuotaBackendBytes)
			return nil
		}
	}
	return fmt.Errorf("machine %s: etcd settings file %s: %w: correct it, or delete it to use etcd.local.quotaBackendBytes of the bootstrap data",
		a.machine, path, err)
}

// ManagerCommonName is the common name the agent of a control plane
// machine without an etcd member requires of its endpoint's clients: its
// client CA is the cluster CA, which Nodes' kubelet certificates chain to
// as well, and only the name keeps them out.
const ManagerCommonName = "qcp-manager"

// serveAgentEndpoint serves the agent's endpoint on EtcdAdminPort until
// ctx ends: the machine's certificates (PKIPath, PKIRenewPath) and, on a
// machine that runs etcd, the etcd settings. The serving certificate is
// the file read again after each renewal.
//
// On a machine that runs etcd it serves etcd's server certificate and
// asks for a client certificate of the etcd CA, as etcd's client port
// does: whoever has one can already do anything to etcd's data. On a
// control plane machine without a member (an external etcd, an
// EtcdCluster) it serves agent-serving.crt, which the agent issues from
// the cluster CA, and asks for a client certificate of the cluster CA
// whose common name is ManagerCommonName; the handshake of any other is
// refused.
func (a *machineCtx) serveAgentEndpoint(ctx context.Context) error {
	withEtcd := a.doc.Runs(bootstrap.Etcd)
	pairBase, what := "agent-serving", "agent endpoint"
	// The trust changes during a CA rotation: it is read at each
	// handshake.
	trust := a.pki.ClusterTrust
	if withEtcd {
		pairBase, what, trust = "etcd/server", "etcd settings endpoint", a.pki.EtcdTrust
	}
	a.adminPair = &servingPair{certFile: a.pki.File(pairBase + ".crt"), keyFile: a.pki.File(pairBase + ".key")}
	if err := a.adminPair.load(); err != nil {
		return fmt.Errorf("machine %s: %s: loading %s.crt: %w", a.machine, what, pairBase, err)
	}
	if _, err := certs.CertPool(trust()); err != nil {
		return fmt.Errorf("machine %s: %s: client CA: %w", a.machine, what, err)
	}
	ln, err := a.listen(EtcdAdminPort, what)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	if withEtcd {
		mux.HandleFunc("GET "+EtcdSettingsPath, func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, a.effectiveEtcdSettings())
		})
		mux.HandleFunc("PUT "+EtcdSettingsPath, a.putEtcdSettings)
		mux.HandleFunc("PUT "+EtcdAuthorityKind.Path(), func(w http.ResponseWriter, r *http.Request) { a.putAuthority(ctx, EtcdAuthorityKind, w, r) })
		mux.HandleFunc("POST "+BackupVerifyPath, func(w http.ResponseWriter, r *http.Request) { a.postBackupVerify(ctx, w, r) })
		mux.HandleFunc("POST "+EtcdRecoverPath, a.etcdRecoverHandler(ctx))
	}
	mux.HandleFunc("GET "+PKIPath, a.getPKI)
	if a.doc.RunsKubernetes() {
		mux.HandleFunc("PUT "+ClusterAuthorityKind.Path(), func(w http.ResponseWriter, r *http.Request) { a.putAuthority(ctx, ClusterAuthorityKind, w, r) })
	}
	if a.doc.Runs(bootstrap.KubeAPIServer) {
		mux.HandleFunc("PUT "+FrontProxyAuthorityKind.Path(), func(w http.ResponseWriter, r *http.Request) { a.putAuthority(ctx, FrontProxyAuthorityKind, w, r) })
	}
	if a.doc.Runs(bootstrap.KubeAPIServer) || a.doc.Runs(bootstrap.KubeControllerManager) {
		mux.HandleFunc("PUT "+ServiceAccountAuthorityKind.Path(), func(w http.ResponseWriter, r *http.Request) {
			a.putAuthority(ctx, ServiceAccountAuthorityKind, w, r)
		})
	}
	if withEtcd && a.registersNode() {
		mux.HandleFunc("PUT "+NodeRegistrationPath, func(w http.ResponseWriter, r *http.Request) { a.putNodeRegistration(ctx, w, r) })
	}
	mux.HandleFunc("POST "+PKIRenewPath, func(w http.ResponseWriter, r *http.Request) { a.postRenewPKI(ctx, w, r) })
	tlsCfg := &tls.Config{
		GetCertificate: a.adminPair.getCertificate,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		MinVersion:     tls.VersionTLS12,
	}
	if !withEtcd {
		tlsCfg.VerifyConnection = requireManager
	}
	base := tlsCfg.Clone()
	tlsCfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		clientCAs, err := certs.CertPool(trust())
		if err != nil {
			return nil, err
		}
		c := base.Clone()
		c.ClientCAs = clientCAs
		return c, nil
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		TLSConfig:         tlsCfg,
		// Refused handshakes are logged as the agent's other messages are.
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	a.serve(ctx, srv, what, func() error { return srv.ServeTLS(ln, "", "") })
	return nil
}

// requireManager refuses a client certificate, already verified against
// the cluster CA, whose common name is not ManagerCommonName.
func requireManager(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no client certificate")
	}
	if cn := cs.PeerCertificates[0].Subject.CommonName; cn != ManagerCommonName {
		return fmt.Errorf("client certificate %q refused: this endpoint takes only %q", cn, ManagerCommonName)
	}
	return nil
}

func (a *machineCtx) putEtcdSettings(w http.ResponseWriter, r *http.Request) {
	want, err := decodeEtcdSettings(http.MaxBytesReader(w, r.Body, maxSettingsBody))
	if err != nil {
		http.Error(w, "invalid etcd settings: "+err.Error(), http.StatusBadRequest)
		return
	}
	a.etcdSettings.mu.Lock()
	defer a.etcdSettings.mu.Unlock()
	if a.extraArgsSetQuota() {
		// A flag of the document's extraArgs comes last and wins: a change
		// here would restart etcd and change nothing.
		http.Error(w, "the bootstrap data's extraArgs set etcd's --quota-backend-bytes, which overrides this setting: replace the machine to change it", http.StatusConflict)
		return
	}
	had := a.effectiveLocked()
	if had == want {
		writeJSON(w, EtcdSettingsResult{Settings: had})
		return
	}
	data, err := json.Marshal(want)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	// The file first: etcd restarted with a value the next boot forgets
	// would quietly return to the old one.
	if err := atomicfile.Write(filepath.Join(a.dir, EtcdSettingsFile), data, 0o600); err != nil {
		a.log.Error("cannot save etcd settings; nothing changed", "err", err)
		http.Error(w, "saving etcd settings: "+err.Error(), http.StatusInternalServerError)
		return
	}
	a.etcdSettings.saved = &want
	why := fmt.Sprintf("quota-backend-bytes changed from %d to %d by qcp-manager", had.QuotaBackendBytes, want.QuotaBackendBytes)
	restarted := a.sup.Restart(bootstrap.Etcd, why)
	a.log.Info("etcd settings changed", "quotaBackendBytesFrom", had.QuotaBackendBytes, "quotaBackendBytesTo", want.QuotaBackendBytes,
		"client", clientName(r), "etcdRestarted", restarted)
	writeJSON(w, EtcdSettingsResult{Restarted: restarted, Settings: want})
}

func (a *machineCtx) extraArgsSetQuota() bool {
	return slices.ContainsFunc(a.doc.ExtraArgs[bootstrap.Etcd], func(arg bootstrap.Arg) bool {
		return arg.Name == "quota-backend-bytes"
	})
}

// clientName is the common name of the client's certificate, for the log.
func clientName(r *http.Request) string {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return ""
	}
	return r.TLS.PeerCertificates[0].Subject.CommonName
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// GetEtcdSettings reads the etcd settings of the machine at host (its IP
// address). tlsCfg trusts the etcd CA and holds a client certificate of it.
func GetEtcdSettings(ctx context.Context, tlsCfg *tls.Config, host string) (EtcdSettings, error) {
	var s EtcdSettings
	err := callAgent(ctx, tlsCfg, host, http.MethodGet, EtcdSettingsPath, etcdSettingsTimeout, nil, &s)
	return s, err
}

// PutEtcdSettings sets the etcd settings of the machine at host (its IP
// address), which restarts its etcd member if they change. tlsCfg trusts
// the etcd CA and holds a client certificate of it.
func PutEtcdSettings(ctx context.Context, tlsCfg *tls.Config, host string, s EtcdSettings) (EtcdSettingsResult, error) {
	var res EtcdSettingsResult
	err := sendAgent(ctx, tlsCfg, host, http.MethodPut, EtcdSettingsPath, etcdSettingsTimeout, s, &res)
	return res, err
}

// maxAnswer bounds an answer of the endpoint: a certificate report is a
// few kilobytes.
const maxAnswer = 1 << 20

// sendAgent is callAgent with in, encoded as JSON, for the body.
func sendAgent(ctx context.Context, tlsCfg *tls.Config, host, method, path string, timeout time.Duration, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return callAgent(ctx, tlsCfg, host, method, path, timeout, body, out)
}

// StatusError is an answer of the agent endpoint other than 200 OK.
type StatusError struct {
	Method, URL string
	Code        int
	// Status is the status line's text, Body the answer's.
	Status, Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Method, e.URL, e.Status, e.Body)
}

// callAgent calls path on the agent endpoint of the machine at host and
// decodes the answer into out.
func callAgent(ctx context.Context, tlsCfg *tls.Config, host, method, path string, timeout time.Duration, body []byte, out any) error {
	u := "https://" + net.JoinHostPort(host, strconv.Itoa(EtcdAdminPort)) + path
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{TLSClientConfig: tlsCfg.Clone(), DisableKeepAlives: true},
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return &StatusError{Method: method, URL: u, Code: resp.StatusCode, Status: resp.Status, Body: strings.TrimSpace(string(data))}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decoding the answer: %w", method, u, err)
	}
	return nil
}
