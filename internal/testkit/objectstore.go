package testkit

import (
	"testing"

	"github.com/qcp-dev/qcp/internal/backup/s3store"
	"github.com/qcp-dev/qcp/internal/objectstore"
)

// StartObjectStore starts a real S3 store (versitygw) for t, stopped when
// t ends, and returns it with a client of its bucket, created.
func StartObjectStore(t testing.TB, bucket string) (*objectstore.Server, *s3store.Store) {
	t.Helper()
	return StartObjectStoreAt(t, bucket, "")
}

// StartObjectStoreAt is StartObjectStore serving on the host address addr
// (127.0.0.1 if empty): the address of a bridge, for machines that are
// network hosts of their own, whose 127.0.0.1 is their own.
func StartObjectStoreAt(t testing.TB, bucket, addr string) (*objectstore.Server, *s3store.Store) {
	t.Helper()
	RequireBinaries(t, "versitygw")
	srv, err := objectstore.Start(t.Context(), objectstore.Options{Dir: t.TempDir(), Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	store, err := s3store.Open(StoreTarget(srv, bucket))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.MakeBucket(t.Context()); err != nil {
		t.Fatal(err)
	}
	return srv, store
}

// StoreTarget is bucket of srv, with its root credentials and CA.
func StoreTarget(srv *objectstore.Server, bucket string) s3store.Target {
	return s3store.Target{Endpoint: srv.Endpoint, Bucket: bucket, AccessKeyID: srv.AccessKeyID, SecretAccessKey: srv.SecretAccessKey, CA: srv.CA}
}
