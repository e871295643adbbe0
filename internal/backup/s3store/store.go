// Package s3store is QCP's client of an S3-compatible object store, where
// etcd snapshots and their manifests go. It streams: an upload holds one
// part (PartSize) in memory, never a whole snapshot.
package s3store

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/qcp-dev/qcp/internal/certs"
)

// PartSize is the size of one part of a multipart upload, and so the
// memory an upload holds.
const PartSize = 16 << 20

// Target is where objects go, and the credentials to reach it.
type Target struct {
	// Endpoint is the store's URL, https://host[:port] (http:// only if
	// the store has no TLS).
	Endpoint string
	// Bucket holds the objects; it must exist.
	Bucket string
	// Prefix is put before every object name.
	Prefix string
	// Region is the bucket's region; us-east-1 if empty.
	Region string
	// AccessKeyID and SecretAccessKey sign every request.
	AccessKeyID, SecretAccessKey string
	// CA is a PEM bundle to trust for the store's certificate, besides
	// the host's roots.
	CA []byte
}

// Store is a bucket and prefix of one store.
type Store struct {
	c              *minio.Client
	bucket, prefix string
}

// Object is one stored object.
type Object struct {
	// Name is its name below the store's prefix.
	Name         string
	Size         int64
	LastModified time.Time
}

// Open checks the target's form and returns a client; it sends no request.
func Open(t Target) (*Store, error) {
	u, err := url.Parse(t.Endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("endpoint %q is not an object store URL: give https://host[:port], without a path", t.Endpoint)
	}
	if t.Bucket == "" {
		return nil, errors.New("no bucket given")
	}
	if t.AccessKeyID == "" || t.SecretAccessKey == "" {
		return nil, errors.New("the credentials need both an access key ID and a secret access key")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if len(t.CA) > 0 {
		pool, err := certs.CertPool(t.CA)
		if err != nil {
			return nil, fmt.Errorf("the store's CA: %w", err)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	c, err := minio.New(u.Host, &minio.Options{
		Creds:        credentials.NewStaticV4(t.AccessKeyID, t.SecretAccessKey, ""),
		Secure:       u.Scheme == "https",
		Region:       t.Region,
		Transport:    tr,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, err
	}
	return &Store{c: c, bucket: t.Bucket, prefix: strings.Trim(t.Prefix, "/")}, nil
}

// Check reports whether the bucket exists and the credentials may read it,
// with an error that names the fault.
func (s *Store) Check(ctx context.Context) error {
	ok, err := s.c.BucketExists(ctx, s.bucket)
	switch {
	case err != nil:
		return fmt.Errorf("cannot reach bucket %q: %s", s.bucket, describe(err))
	case !ok:
		return fmt.Errorf("bucket %q does not exist: create it, or name an existing one", s.bucket)
	}
	return nil
}

// MakeBucket creates the bucket (the local environment's store starts
// empty); one that exists already is left as it is.
func (s *Store) MakeBucket(ctx context.Context) error {
	if ok, err := s.c.BucketExists(ctx, s.bucket); err == nil && ok {
		return nil
	}
	if err := s.c.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{}); err != nil {
		return fmt.Errorf("creating bucket %q: %s", s.bucket, describe(err))
	}
	return nil
}

func (s *Store) key(name string) string { return path.Join(s.prefix, name) }

// Put streams r into object name, one part at a time, and returns the
// bytes stored.
func (s *Store) Put(ctx context.Context, name string, r io.Reader, contentType string) (int64, error) {
	info, err := s.c.PutObject(ctx, s.bucket, s.key(name), r, -1, minio.PutObjectOptions{PartSize: PartSize, ContentType: contentType})
	if err != nil {
		return 0, fmt.Errorf("storing %s in bucket %q: %s", s.key(name), s.bucket, describe(err))
	}
	return info.Size, nil
}

// PutSmall stores b, which is small enough to send in one request.
func (s *Store) PutSmall(ctx context.Context, name string, b []byte, contentType string) error {
	_, err := s.c.PutObject(ctx, s.bucket, s.key(name), bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{ContentType: contentType, DisableMultipart: true})
	if err != nil {
		return fmt.Errorf("storing %s in bucket %q: %s", s.key(name), s.bucket, describe(err))
	}
	return nil
}

// Get opens object name for reading.
func (s *Store) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	o, err := s.c.GetObject(ctx, s.bucket, s.key(name), minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading %s from bucket %q: %s", s.key(name), s.bucket, describe(err))
	}
	// GetObject sends nothing until the first read: Stat finds a missing
	// object here rather than in the middle of the caller's copy.
	if _, err := o.Stat(); err != nil {
		o.Close()
		return nil, fmt.Errorf("reading %s from bucket %q: %s", s.key(name), s.bucket, describe(err))
	}
	return o, nil
}

// List returns the objects whose names start with prefix (below the
// store's own prefix), in name order.
func (s *Store) List(ctx context.Context, prefix string) ([]Object, error) {
	full := s.key(prefix)
	if strings.HasSuffix(prefix, "/") {
		full += "/"
	}
	var out []Object
	for o := range s.c.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: full, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("listing %s in bucket %q: %s", full, s.bucket, describe(o.Err))
		}
		name := strings.TrimPrefix(strings.TrimPrefix(o.Key, s.prefix), "/")
		out = append(out, Object{Name: name, Size: o.Size, LastModified: o.LastModified})
	}
	return out, nil
}

// Remove deletes object name; a missing object is not an error.
func (s *Store) Remove(ctx context.Context, name string) error {
	if err := s.c.RemoveObject(ctx, s.bucket, s.key(name), minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("deleting %s from bucket %q: %s", s.key(name), s.bucket, describe(err))
	}
	return nil
}

// PresignGet returns a URL that reads object name without credentials
// until ttl has passed: what a machine gets instead of the store's keys.
func (s *Store) PresignGet(ctx context.Context, name string, ttl time.Duration) (string, error) {
	u, err := s.c.PresignedGetObject(ctx, s.bucket, s.key(name), ttl, nil)
	if err != nil {
		return "", fmt.Errorf("signing a URL for %s: %s", s.key(name), describe(err))
	}
	return u.String(), nil
}

// describe is the store's own error code and message, which name the
// fault (NoSuchBucket, InvalidAccessKeyId, SignatureDoesNotMatch, ...).
func describe(err error) string {
	resp := minio.ToErrorResponse(err)
	if resp.Code != "" {
		return fmt.Sprintf("%s: %s", resp.Code, resp.Message)
	}
	return err.Error()
}
