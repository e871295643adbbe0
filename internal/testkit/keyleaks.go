package testkit

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KeyLeakCheck looks for every private key QCP created where none may be:
// in any file except a machine's own 0600 files that are not logs, in events,
// and in the status and conditions of every Cluster API object. It knows
// a key in its PEM, base64 (a kubeconfig's client-key-data, a Secret's
// .data, a logged []byte, base64 of base64) and DER-hex forms.
//
// Keys accumulate over runs: a key seen in one run is still looked for in
// the next, after its machine and Secret are gone.
type KeyLeakCheck struct {
	// Client reaches the management cluster: its Secrets say which keys
	// QCP created, its events and statuses are searched.
	Client client.Client
	// Dirs are searched file by file.
	Dirs []string
	// MachineDirs hold machines' own files, which may hold keys if their
	// mode is 0600 and they are not logs. Keys found there are looked for
	// everywhere else.
	MachineDirs []string

	keys   map[string]*leakKey // by hex of the secret
	finder *leakFinder
}

// CheckNoKeyLeaks runs a KeyLeakCheck once: what every end-to-end scenario
// does when it ends.
func CheckNoKeyLeaks(ctx context.Context, t testing.TB, c client.Client, dirs, machineDirs []string) {
	t.Helper()
	(&KeyLeakCheck{Client: c, Dirs: dirs, MachineDirs: machineDirs}).Run(ctx, t)
}

// Run collects the keys that exist now and searches for all keys known so
// far, failing t for each leak. It also fails t if it found no key or no
// machine key file: then it would have inspected nothing.
func (k *KeyLeakCheck) Run(ctx context.Context, t testing.TB) {
	t.Helper()
	if k.keys == nil {
		k.keys = map[string]*leakKey{}
	}
	keyFiles, err := k.collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if keyFiles == 0 {
		t.Fatalf("no key file in %v: the check inspected nothing", k.MachineDirs)
	}
	k.finder = newLeakFinder(k.keys)
	leaks, err := k.search(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leaks {
		t.Errorf("private key %s leaked: %s", l.key, l.where)
	}
}

// collect adds the keys in every Secret and in the machines' files, and
// returns how many machine files hold keys.
func (k *KeyLeakCheck) collect(ctx context.Context) (int, error) {
	secrets := &corev1.SecretList{}
	if err := k.Client.List(ctx, secrets); err != nil {
		return 0, fmt.Errorf("listing Secrets: %w", err)
	}
	for _, s := range secrets.Items {
		for field, v := range s.Data {
			k.addKeys(fmt.Sprintf("Secret %s/%s %s", s.Namespace, s.Name, field), v)
		}
	}
	return k.collectFiles()
}

// collectFiles adds the keys in the machines' files, and returns how many
// files hold keys.
func (k *KeyLeakCheck) collectFiles() (int, error) {
	files := 0
	small := func(_ string, info fs.FileInfo) bool { return info.Size() <= maxKeyFile }
	for _, dir := range k.MachineDirs {
		err := walkFiles(dir, small, func(path string, _ fs.FileMode, data []byte) {
			if k.addKeys(path, data) > 0 {
				files++
			}
		})
		if err != nil {
			return 0, err
		}
	}
	return files, nil
}

// allowed reports whether a file may hold keys: a machine's own file, not
// a log, that only its owner can read.
func (k *KeyLeakCheck) allowed(path string, mode fs.FileMode) bool {
	for _, dir := range k.MachineDirs {
		if rel, err := filepath.Rel(dir, path); err == nil && !strings.HasPrefix(rel, "..") {
			return mode.Perm()&0o077 == 0 && !isLog(path)
		}
	}
	return false
}

// addKeys records the private keys in data, PEM or in a kubeconfig, and
// returns how many it found.
func (k *KeyLeakCheck) addKeys(origin string, data []byte) int {
	found := 0
	add := func(der []byte, block *pem.Block) {
		secret := keySecret(block.Type, der)
		if secret == nil {
			return
		}
		found++
		id := hex.EncodeToString(secret)
		if _, ok := k.keys[id]; !ok {
			k.keys[id] = &leakKey{origin: origin, secret: secret}
		}
	}
	for _, block := range pemBlocks(data) {
		add(block.Bytes, block)
	}
	if cfg, err := clientcmd.Load(data); err == nil {
		for _, auth := range cfg.AuthInfos {
			for _, block := range pemBlocks(auth.ClientKeyData) {
				add(block.Bytes, block)
			}
		}
	}
	return found
}

func pemBlocks(data []byte) []*pem.Block {
	var out []*pem.Block
	for {
		i := bytes.Index(data, []byte("-----BEGIN "))
		if i < 0 {
			return out
		}
		block, rest := pem.Decode(data[i:])
		if block == nil {
			data = data[i+1:]
			continue
		}
		if strings.HasSuffix(block.Type, "PRIVATE KEY") {
			out = append(out, block)
		}
		data = rest
	}
}

// keySecret returns the bytes that make the key secret (the private scalar
// or exponent), which every encoding of the key contains.
func keySecret(pemType string, der []byte) []byte {
	var key any
	var err error
	switch pemType {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(der)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(der)
	default:
		key, err = x509.ParsePKCS8PrivateKey(der)
	}
	if err != nil {
		return nil
	}
	switch key := key.(type) {
	case *ecdsa.PrivateKey:
		b, err := key.Bytes()
		if err != nil {
			return nil
		}
		return b
	case *rsa.PrivateKey:
		return key.D.Bytes()
	case ed25519.PrivateKey:
		return key.Seed()
	}
	return nil
}

// isProgram reports whether path is an executable ELF file: a build output
// (the machine image's etcd, Kubernetes and agent binaries, hundreds of
// megabytes in every management cluster's directory), written before any
// key the check looks for existed. Reading them took 2 of a scenario's 13
// CPU-seconds in its test binary (docs/measurements.md, stop 63).
func isProgram(path string, info fs.FileInfo) bool {
	if info.Mode().Perm()&0o111 == 0 {
		return false
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	magic := make([]byte, 4)
	_, err = io.ReadFull(f, magic)
	return err == nil && string(magic) == "\x7fELF"
}

func isLog(path string) bool {
	return strings.HasSuffix(path, ".log") || slices.Contains(strings.Split(filepath.ToSlash(path), "/"), "logs")
}

// maxKeyFile is the largest machine file keys are collected from. Key,
// certificate and kubeconfig files are a few KiB; what is larger is etcd's
// write-ahead log and database (64 MB and more per machine), which hold the
// workload's own data, not keys QCP created, and which reading on every
// scenario's end took minutes on a loaded machine.
const maxKeyFile = 1 << 20

// walkFiles calls fn with every regular file under dir that can still be
// read (files vanish while machines run) and that want accepts; a file want
// refuses is not read.
func walkFiles(dir string, want func(path string, info fs.FileInfo) bool, fn func(path string, mode fs.FileMode, data []byte)) error {
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil || !want(path, info) {
			return nil //nolint:nilerr // removed meanwhile, or not wanted
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil //nolint:nilerr // removed meanwhile
		}
		fn(path, info.Mode(), data)
		return nil
	})
	if err != nil {
		return fmt.Errorf("searching %s for private keys: %w", dir, err)
	}
	return nil
}

type leak struct{ key, where string }

// search looks for every known key in the files (but those allowed to
// hold keys), the events and the statuses of Cluster API objects.
func (k *KeyLeakCheck) search(ctx context.Context) ([]leak, error) {
	var leaks []leak
	report := func(where string, data []byte) {
		for _, l := range k.finder.find(data) {
			leaks = append(leaks, leak{key: l.key.origin, where: fmt.Sprintf("%s, in %s form", where, l.form)})
		}
	}
	if err := k.searchFiles(report); err != nil {
		return nil, err
	}
	events := &corev1.EventList{}
	if err := k.Client.List(ctx, events); err != nil {
		return nil, fmt.Errorf("listing events: %w", err)
	}
	for _, e := range events.Items {
		data, _ := json.Marshal(e)
		report(fmt.Sprintf("event %s/%s", e.Namespace, e.Name), data)
	}
	return leaks, k.searchStatuses(ctx, report)
}

// searchFiles reports the keys in every file but those allowed to hold
// keys and programs, which are not read. A file under two of the
// directories is searched once.
func (k *KeyLeakCheck) searchFiles(report func(string, []byte)) error {
	seen := map[string]bool{}
	want := func(path string, info fs.FileInfo) bool {
		searched := seen[path]
		seen[path] = true
		return !searched && !k.allowed(path, info.Mode()) && !isProgram(path, info)
	}
	for _, dir := range append(slices.Clone(k.Dirs), k.MachineDirs...) {
		err := walkFiles(dir, want, func(path string, mode fs.FileMode, data []byte) {
			report(fmt.Sprintf("file %s (mode %v)", path, mode.Perm()), data)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// searchStatuses searches the status, conditions included, of every object
// of every Cluster API kind the client knows (QCP's own among them).
func (k *KeyLeakCheck) searchStatuses(ctx context.Context, report func(string, []byte)) error {
	for gvk := range k.Client.Scheme().AllKnownTypes() {
		if !strings.HasSuffix(gvk.Group, "cluster.x-k8s.io") || !strings.HasSuffix(gvk.Kind, "List") {
			continue
		}
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(schema.GroupVersionKind{Group: gvk.Group, Version: gvk.Version, Kind: gvk.Kind})
		if err := k.Client.List(ctx, list); err != nil {
			if meta.IsNoMatchError(err) {
				continue // not installed in this environment
			}
			return fmt.Errorf("listing %s: %w", gvk.Kind, err)
		}
		for _, item := range list.Items {
			status, _ := json.Marshal(item.Object["status"])
			report(fmt.Sprintf("status of %s %s/%s", item.GetKind(), item.GetNamespace(), item.GetName()), status)
		}
	}
	return nil
}
