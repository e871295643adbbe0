package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/qcp-dev/qcp/internal/backup"
	"github.com/qcp-dev/qcp/internal/certs"
)

// BackupVerifyPath restores a stored snapshot into a scratch etcd on the
// machine (POST, a BackupVerifyRequest), on machines that run etcd.
const BackupVerifyPath = "/backup/verify"

// backupVerifyTimeout bounds a verification: the download, the restore,
// and the scratch etcd's answer.
const backupVerifyTimeout = 10 * time.Minute

// maxBackupVerifyBody bounds the request: a URL, a manifest, a CA and a key.
const maxBackupVerifyBody = 256 << 10

// BackupVerifyRequest asks the agent to prove that a stored snapshot
// restores. It carries no store credentials: URL is presigned, and valid
// only for minutes.
type BackupVerifyRequest struct {
	// URL reads the snapshot object (a presigned GET).
	URL string `json:"url"`
	// CA is the PEM bundle to trust for the store's certificate, if the
	// host's roots do not cover it.
	CA []byte `json:"ca,omitempty"`
	// Manifest is the snapshot's manifest: its size and SHA-256 are
	// checked on the download, and its revision, if set, against the
	// restore (0: the agent reports what it finds).
	Manifest backup.Manifest `json:"manifest"`
	// Key is the age identity of an encrypted snapshot.
	Key []byte `json:"key,omitempty"`
}

// BackupVerifyResult is what the scratch restore found.
type BackupVerifyResult struct {
	Revision int64 `json:"revision"`
	Keys     int64 `json:"keys"`
	// Machine is the machine whose disk held the scratch restore.
	Machine string `json:"machine"`
}

// scratchDir holds a verification's files, below the machine's directory
// (the etcd data directory's disk); the agent removes it before it
// answers, and before each verification (one a crash cut short).
const scratchDir = "backup-scratch"

// verifying serializes verifications: each uses about twice the
// snapshot's size on disk.
var verifying sync.Mutex

func (a *machineCtx) postBackupVerify(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	var req BackupVerifyRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBackupVerifyBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		http.Error(w, "invalid backup verification: the request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := req.check(); err != nil {
		http.Error(w, "invalid backup verification: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !verifying.TryLock() {
		http.Error(w, "another backup verification runs on this machine; ask again when it is done", http.StatusConflict)
		return
	}
	defer verifying.Unlock()
	ctx, cancel := context.WithTimeout(ctx, backupVerifyTimeout)
	defer cancel()
	res, err := a.verifyBackup(ctx, req)
	if err != nil {
		a.log.Error("backup verification failed", "snapshot", req.Manifest.Snapshot, "err", err, "client", clientName(r))
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	a.log.Info("backup verified", "snapshot", req.Manifest.Snapshot, "revision", res.Revision, "client", clientName(r))
	writeJSON(w, res)
}

func (req *BackupVerifyRequest) check() error {
	u, err := url.Parse(req.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return errors.New("url: an http(s) URL of the snapshot object is required")
	}
	if len(req.CA) > 0 {
		if _, err := certs.CertPool(req.CA); err != nil {
			return fmt.Errorf("ca: %w", err)
		}
	}
	if req.Manifest.Size <= 0 || len(req.Manifest.SHA256) != 64 || req.Manifest.Revision < 0 {
		return errors.New("manifest: its size and sha256 are required, and a revision cannot be negative")
	}
	if req.Manifest.Encrypted && len(req.Key) == 0 {
		return errors.New("key: the snapshot is encrypted, and no key was given")
	}
	return nil
}

// verifyBackup downloads the snapshot through its checksum and the
// decryption into the scratch directory, and restores it there.
func (a *machineCtx) verifyBackup(ctx context.Context, req BackupVerifyRequest) (BackupVerifyResult, error) {
	var enc *backup.Encryption
	if len(req.Key) > 0 {
		var err error
		if enc, err = backup.ParseKey(req.Key); err != nil {
			return BackupVerifyResult{}, fmt.Errorf("key: %w", err)
		}
	}
	dir := filepath.Join(a.dir, scratchDir)
	if err := os.RemoveAll(dir); err != nil {
		return BackupVerifyResult{}, err
	}
	snap, body, err := openStored(ctx, a.dir, req.URL, req.CA, req.Manifest, enc)
	if err != nil {
		return BackupVerifyResult{}, err
	}
	defer body.Close()
	restored, err := backup.ScratchRestore(ctx, a.bins["etcd"], dir, snap)
	if err != nil {
		return BackupVerifyResult{}, err
	}
	if req.Manifest.Revision > 0 && restored.Revision != req.Manifest.Revision {
		return BackupVerifyResult{}, fmt.Errorf("snapshot %s restored at revision %d; its manifest says %d", req.Manifest.Snapshot, restored.Revision, req.Manifest.Revision)
	}
	return BackupVerifyResult{Revision: restored.Revision, Keys: restored.Keys, Machine: a.machine.Name}, nil
}

// openStored checks that the disk of dir has room for a snapshot of m and
// its restored copy, and opens a GET of u (trusting ca): the returned
// reader is the plaintext (decrypted with enc), which fails at its end
// unless the object's size and SHA-256 are m's. Close body when done.
func openStored(ctx context.Context, dir, u string, ca []byte, m backup.Manifest, enc *backup.Encryption) (io.Reader, io.Closer, error) {
	if err := checkScratchSpace(dir, m.Size); err != nil {
		return nil, nil, err
	}
	body, err := download(ctx, u, ca)
	if err != nil {
		return nil, nil, err
	}
	counted := backup.NewCounter(body)
	plain, err := backup.Open(counted, m, enc)
	if err != nil {
		body.Close()
		return nil, nil, err
	}
	return &checkAtEOF{r: plain, counted: counted, m: m}, body, nil
}

// checkAtEOF reads the plaintext, and at its end reads what is left of the
// stored object and fails unless its size and SHA-256 are the manifest's:
// the restore then never takes a snapshot that differs from what was
// written.
type checkAtEOF struct {
	r       io.Reader
	counted *backup.Counter
	m       backup.Manifest
}

func (c *checkAtEOF) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if errors.Is(err, io.EOF) {
		if _, cerr := io.Copy(io.Discard, c.counted); cerr != nil {
			return n, cerr
		}
		if cerr := c.counted.Check(c.m); cerr != nil {
			return n, cerr
		}
	}
	return n, err
}

// download opens a GET of u, trusting ca besides the host's roots.
func download(ctx context.Context, u string, ca []byte) (io.ReadCloser, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if len(ca) > 0 {
		pool, err := certs.CertPool(ca)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		// Not the URL: its signature reads the snapshot, and the error
		// ends up in the owner's status.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("downloading the snapshot from %s: %w", req.URL.Host, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("downloading the snapshot: the store answered %s: %s", resp.Status, b)
	}
	return resp.Body, nil
}

// checkScratchSpace refuses a verification the disk of dir cannot hold:
// the snapshot and its restored copy, with room to spare.
func checkScratchSpace(dir string, size int64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return err
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if need := 3 * size; free < need {
		return fmt.Errorf("the machine's disk has %d MiB free; a scratch restore of this %d MiB snapshot needs %d MiB", free>>20, size>>20, need>>20)
	}
	return nil
}

// VerifyBackup asks the agent of the machine at host to restore a stored
// snapshot into a scratch etcd and report its revision. tlsCfg is as for
// GetPKI on a machine that runs etcd.
func VerifyBackup(ctx context.Context, tlsCfg *tls.Config, host string, req BackupVerifyRequest) (BackupVerifyResult, error) {
	var res BackupVerifyResult
	err := sendAgent(ctx, tlsCfg, host, http.MethodPost, BackupVerifyPath, backupVerifyTimeout, req, &res)
	return res, err
}
