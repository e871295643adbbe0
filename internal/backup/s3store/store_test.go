package s3store_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/objectstore"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestStoreAgainstVersitygw: objects stream in and out of a real S3
// server over TLS, a presigned URL reads one without credentials, and a
// wrong bucket, wrong keys or an untrusted certificate are refused with
// the store's reason.
func TestStoreAgainstVersitygw(t *testing.T) {
	srv := startServer(t)
	ctx := t.Context()
	target := s3store.Target{Endpoint: srv.Endpoint, Bucket: "backups", Prefix: "qcp/", AccessKeyID: srv.AccessKeyID, SecretAccessKey: srv.SecretAccessKey, CA: srv.CA}
	st, err := s3store.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(ctx); err == nil || !strings.Contains(err.Error(), `bucket "backups" does not exist`) {
		t.Fatalf("check before the bucket exists: %v", err)
	}
	if err := st.MakeBucket(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Check(ctx); err != nil {
		t.Fatal(err)
	}
	// Larger than a part, so that the upload is multipart.
	body := strings.Repeat("0123456789abcdef", (s3store.PartSize+1000)/16)
	n, err := st.Put(ctx, "ns/c1/a.db", strings.NewReader(body), "application/octet-stream")
	if err != nil || n != int64(len(body)) {
		t.Fatalf("put: %d bytes, %v", n, err)
	}
	if err := st.PutSmall(ctx, "ns/c1/a.json", []byte(`{}`), "application/json"); err != nil {
		t.Fatal(err)
	}
	r, err := st.Get(ctx, "ns/c1/a.db")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(got) != body {
		t.Fatalf("read back %d bytes (want %d): %v", len(got), len(body), err)
	}
	objs, err := st.List(ctx, "ns/c1/")
	if err != nil || len(objs) != 2 || objs[0].Name != "ns/c1/a.db" || objs[1].Name != "ns/c1/a.json" {
		t.Fatalf("list: %+v, %v", objs, err)
	}
	if _, err := st.Get(ctx, "ns/c1/missing.db"); err == nil || !strings.Contains(err.Error(), "NoSuchKey") {
		t.Fatalf("get of a missing object: %v", err)
	}

	u, err := st.PresignGet(ctx, "ns/c1/a.json", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := certs.CertPool(srv.CA)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig(pool)}}
	resp, err := hc.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "{}" {
		t.Fatalf("presigned GET: %d %q", resp.StatusCode, b)
	}

	if err := st.Remove(ctx, "ns/c1/a.db"); err != nil {
		t.Fatal(err)
	}
	if objs, err := st.List(ctx, "ns/c1/"); err != nil || len(objs) != 1 {
		t.Fatalf("list after remove: %+v, %v", objs, err)
	}

	wrong := target
	wrong.Bucket = "nope"
	assertRefused(t, wrong, `bucket "nope" does not exist`)
	wrong = target
	wrong.SecretAccessKey = "not-the-secret"
	assertRefused(t, wrong, "SignatureDoesNotMatch")
	wrong = target
	wrong.CA = nil
	assertRefused(t, wrong, "certificate")
	for _, bad := range []s3store.Target{{Endpoint: "s3://x", Bucket: "b", AccessKeyID: "a", SecretAccessKey: "s"}, {Endpoint: srv.Endpoint, AccessKeyID: "a", SecretAccessKey: "s"}, {Endpoint: srv.Endpoint, Bucket: "b"}} {
		if _, err := s3store.Open(bad); err == nil {
			t.Errorf("Open(%+v) took a bad target", bad)
		}
	}
}

func assertRefused(t *testing.T, target s3store.Target, want string) {
	t.Helper()
	st, err := s3store.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := st.Check(ctx); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("check of %s/%s: %v, want %q", target.Endpoint, target.Bucket, err, want)
	}
}

func startServer(t *testing.T) *objectstore.Server {
	t.Helper()
	if testing.Short() {
		t.Skip("starts versitygw; not run with -short")
	}
	testkit.RequireBinaries(t, "versitygw")
	srv, err := objectstore.Start(t.Context(), objectstore.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

func tlsConfig(pool *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}
