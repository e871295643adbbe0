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
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/qcp-dev/qcp/internal/atomicfile"
	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// EtcdRecoverPath turns the machine's etcd data into a new single-member
// cluster (POST, an EtcdRecoverRequest), on machines that run etcd: the
// manager's way back when a majority of the members is lost for good, on
// the survivor that applied the most.
const EtcdRecoverPath = "/etcd/recover"

// EtcdRecoveryFile, in the machine directory, records the last recovery
// that finished. A request with its token, which the manager sends again
// when it does not know whether the first one finished, is answered from
// it without touching etcd.
const EtcdRecoveryFile = "etcd-recovery.json"

const (
	// recoveryWorkDir holds the copy of etcd's database while it is
	// restored; it is removed before each recovery and after it.
	recoveryWorkDir = "etcd-recovery"
	// beforeRecoveryDir keeps the data directory the last recovery
	// replaced, for whoever investigates the loss, until the next one.
	beforeRecoveryDir = "etcd-before-recovery"
)

// recoverWorkTimeout bounds the work while etcd is stopped: the copy and
// the restore of its database (a couple of seconds for 100 MB).
const recoverWorkTimeout = 3 * time.Minute

// etcdRecoverTimeout bounds a call of the endpoint: etcd's stop (up to
// stopGrace), the work, and the answer.
const etcdRecoverTimeout = stopGrace + recoverWorkTimeout + time.Minute

// maxRecoverBody bounds a request: a token and a number.
const maxRecoverBody = 4 << 10

// maxTokenLength bounds a token, which names the cluster in etcd's data.
const maxTokenLength = 128

// EtcdRecoverRequest asks the agent to turn its etcd member's data into a
// new cluster of that member alone.
type EtcdRecoverRequest struct {
	// Token is the new cluster's --initial-cluster-token. A new token
	// gives the cluster and its member new IDs, so that the lost members
	// can never talk to it. It also names the recovery: a request with
	// the token of the last finished one is answered with its result.
	Token string `json:"token"`
	// BumpRevision is how far past the kept revision the new cluster's
	// starts (backup.BumpRevision), which is marked compacted: a client
	// that watched the lost cluster relists instead of missing events.
	BumpRevision int64 `json:"bumpRevision"`
}

// EtcdRecoverResult answers a recovery.
type EtcdRecoverResult struct {
	Token string `json:"token"`
	// Revision is the revision of the database kept, before the bump.
	Revision int64 `json:"revision"`
	// Recovered says that this request did the recovery. It is false when
	// the token's recovery was done already: the rest is what that one
	// recorded.
	Recovered bool `json:"recovered"`
	// At is when the recovery finished.
	At time.Time `json:"at"`
}

// validate returns a message naming the field, for a client to fix.
func (req EtcdRecoverRequest) validate() error {
	var errs []error
	if req.Token == "" || len(req.Token) > maxTokenLength || strings.ContainsFunc(req.Token, func(r rune) bool {
		return unicode.IsSpace(r) || !unicode.IsPrint(r)
	}) {
		errs = append(errs, fmt.Errorf("token: %q is not an etcd cluster token: give 1 to %d printable characters without spaces, new for each recovery", req.Token, maxTokenLength))
	}
	if req.BumpRevision <= 0 {
		errs = append(errs, fmt.Errorf("bumpRevision: %d is not positive; give how far the new cluster's revision starts past the kept one, e.g. %d", req.BumpRevision, backup.BumpRevision))
	}
	return errors.Join(errs...)
}

// decodeEtcdRecover decodes one JSON object strictly.
func decodeEtcdRecover(r io.Reader) (EtcdRecoverRequest, error) {
	var req EtcdRecoverRequest
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); errors.Is(err, io.EOF) {
		return req, fmt.Errorf(`no request: send a JSON object such as {"token": "c1-recovered-1", "bumpRevision": %d}`, backup.BumpRevision)
	} else if err != nil {
		return req, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return req, errors.New("data after the JSON object")
	}
	return req, req.validate()
}

// etcdRecoverHandler serves EtcdRecoverPath until ctx ends. Recoveries run
// one at a time: a second request waits for the first, so that the
// manager's retry of one still running is answered from its record.
func (a *machineCtx) etcdRecoverHandler(ctx context.Context) http.HandlerFunc {
	one := make(chan struct{}, 1)
	return func(w http.ResponseWriter, r *http.Request) {
		req, err := decodeEtcdRecover(http.MaxBytesReader(w, r.Body, maxRecoverBody))
		if err != nil {
			http.Error(w, "invalid etcd recovery: "+err.Error(), http.StatusBadRequest)
			return
		}
		select {
		case one <- struct{}{}:
			defer func() { <-one }()
		case <-r.Context().Done():
			return
		}
		res, code, err := a.recoverEtcd(ctx, req, clientName(r))
		if err != nil {
			http.Error(w, err.Error(), code)
			return
		}
		writeJSON(w, res)
	}
}

// recoverEtcd recovers etcd through a restart, unless req's token was
// done already, and returns the HTTP status of a failure.
func (a *machineCtx) recoverEtcd(ctx context.Context, req EtcdRecoverRequest, client string) (EtcdRecoverResult, int, error) {
	rc := a.etcdRecovery(req)
	if res, ok, err := rc.recorded(); err != nil {
		return res, http.StatusInternalServerError, err
	} else if ok {
		a.log.Info("etcd recovery already done", "token", req.Token, "revision", res.Revision, "at", res.At, "client", client)
		return res, http.StatusOK, nil
	}
	a.log.Warn("recovering etcd from its own data as a new single-member cluster", "token", req.Token, "bumpRevision", req.BumpRevision, "client", client)
	var res EtcdRecoverResult
	done, ok := a.sup.RestartWith(bootstrap.Etcd, "recovering etcd as a new cluster", func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, recoverWorkTimeout)
		defer cancel()
		var err error
		res, err = rc.run(ctx)
		return err
	})
	if !ok {
		return res, http.StatusConflict, errors.New("etcd is not running under qcp-agent yet, or a restart of it is pending: ask again")
	}
	select {
	case err := <-done:
		if err != nil {
			return res, http.StatusInternalServerError, fmt.Errorf("machine %s: etcd recovery failed, and etcd starts again on its old data: %w", a.machine, err)
		}
	case <-ctx.Done():
		return res, http.StatusServiceUnavailable, errors.New("qcp-agent is stopping; ask again once it is back")
	}
	a.log.Info("etcd recovered as a new single-member cluster", "token", res.Token, "revision", res.Revision, "bumpRevision", req.BumpRevision)
	return res, http.StatusOK, nil
}

func (a *machineCtx) etcdRecovery(req EtcdRecoverRequest) etcdRecovery {
	peer := a.url("https", EtcdPeerPort)
	return etcdRecovery{
		etcdBin: a.bins["etcd"], dir: a.dir, dataDir: filepath.Join(a.dir, "etcd"),
		member: backup.Member{Name: a.machine.Name, InitialCluster: a.machine.Name + "=" + peer, Token: req.Token, PeerURL: peer},
		bump:   req.BumpRevision, now: time.Now, log: a.log,
	}
}

// etcdRecovery turns the data directory of a stopped etcd member into that
// of a new cluster of the member alone.
type etcdRecovery struct {
	etcdBin string
	// dir is the machine directory, which holds the work, the record and
	// the replaced data; dataDir is the member's data directory, on the
	// same filesystem.
	dir, dataDir string
	// member is the member of the new cluster; its token names the
	// recovery.
	member backup.Member
	bump   int64
	now    func() time.Time
	log    *slog.Logger
}

// recorded returns the recorded result if the last finished recovery had
// this recovery's token.
func (rc etcdRecovery) recorded() (EtcdRecoverResult, bool, error) {
	path := filepath.Join(rc.dir, EtcdRecoveryFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return EtcdRecoverResult{}, false, nil
	}
	var res EtcdRecoverResult
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		err = dec.Decode(&res)
	}
	if err != nil {
		return EtcdRecoverResult{}, false, fmt.Errorf("etcd recovery record %s: %w: if no recovery with this token finished, move it away and ask again", path, err)
	}
	if res.Token != rc.member.Token {
		return EtcdRecoverResult{}, false, nil
	}
	res.Recovered = false
	return res, true, nil
}

// run does the recovery unless its token's is recorded. It copies etcd's
// database and restores the copy into beforeRecoveryDir, then exchanges
// that directory with the data directory in one step, and records the
// result. Until the exchange the data directory is untouched, and a
// failure leaves etcd to start on it again.
//
// etcd must have stopped as asked (SIGTERM), which commits its database:
// one killed leaves a database that may lack the writes of its last
// backend batches, which only its WAL holds. The result's revision shows
// what was kept.
//
// A crash between the exchange and the record leaves the new data in
// place unrecorded: the manager's retry recovers again from it, which
// bumps the revision once more and replaces the data kept from before the
// first recovery.
func (rc etcdRecovery) run(ctx context.Context) (EtcdRecoverResult, error) {
	if res, ok, err := rc.recorded(); err != nil || ok {
		return res, err
	}
	work := filepath.Join(rc.dir, recoveryWorkDir)
	before := filepath.Join(rc.dir, beforeRecoveryDir)
	for _, d := range []string{work, before} {
		if err := os.RemoveAll(d); err != nil {
			return EtcdRecoverResult{}, err
		}
	}
	defer os.RemoveAll(work)
	db := filepath.Join(rc.dataDir, "member", "snap", "db")
	fi, err := os.Stat(db)
	if err != nil {
		return EtcdRecoverResult{}, fmt.Errorf("etcd's database: %w", err)
	}
	// The copy and the restored data.
	if err := checkScratchSpace(rc.dir, fi.Size()); err != nil {
		return EtcdRecoverResult{}, fmt.Errorf("no room to copy and restore etcd's database %s: %w", db, err)
	}
	st, err := backup.RestoreDB(ctx, rc.etcdBin, db, work, before, rc.member, rc.bump)
	if err != nil {
		return EtcdRecoverResult{}, fmt.Errorf("restoring etcd's database %s: %w", db, err)
	}
	// One exchange rather than two renames: at every moment there is a
	// whole data directory in place, old or new. Were there none, etcd
	// would start as a new, empty cluster.
	if err := unix.Renameat2(unix.AT_FDCWD, before, unix.AT_FDCWD, rc.dataDir, unix.RENAME_EXCHANGE); err != nil {
		_ = os.RemoveAll(before)
		return EtcdRecoverResult{}, fmt.Errorf("exchanging %s with the restored data (renameat2 RENAME_EXCHANGE, which the filesystem must support): %w", rc.dataDir, err)
	}
	res := EtcdRecoverResult{Token: rc.member.Token, Revision: st.Revision, Recovered: true, At: rc.now().UTC()}
	data, err := json.Marshal(res)
	if err == nil {
		err = atomicfile.Write(filepath.Join(rc.dir, EtcdRecoveryFile), data, 0o600)
	}
	if err != nil {
		// The new data is in place and etcd starts on it: the recovery
		// happened, and only its repeat is not recognized.
		rc.log.Error("etcd recovered, but its record could not be written: a repeat of the request recovers again", "err", err)
	}
	return res, nil
}

// RecoverEtcd asks the agent of the machine at host (its IP address) to
// turn its etcd member's data into a new single-member cluster, and waits
// until the data is in place and etcd starting on it; its health says when
// it serves. tlsCfg trusts the etcd CA and holds a client certificate of
// it.
func RecoverEtcd(ctx context.Context, tlsCfg *tls.Config, host string, req EtcdRecoverRequest) (EtcdRecoverResult, error) {
	var res EtcdRecoverResult
	err := sendAgent(ctx, tlsCfg, host, http.MethodPost, EtcdRecoverPath, etcdRecoverTimeout, req, &res)
	return res, err
}
