package testkit

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/qcp-dev/qcp/internal/certs"
)

// TestLeakFinderFindsEveryForm plants one client key, from a kubeconfig,
// in every form a leak takes, and checks that each is found and named, and
// that certificates and keys QCP did not create are not mistaken for it.
func TestLeakFinderFindsEveryForm(t *testing.T) {
	now := time.Now()
	ca, err := certs.NewCA("kubernetes", now)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(certs.Request{CommonName: "admin", Usages: certs.ClientUsage}, now)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := certs.Kubeconfig("c1", "https://127.0.0.1:6443", ca.CertPEM, "admin", kp)
	if err != nil {
		t.Fatal(err)
	}
	k := &KeyLeakCheck{keys: map[string]*leakKey{}}
	if n := k.addKeys("kubeconfig", kubeconfig); n != 1 {
		t.Fatalf("found %d keys in a kubeconfig, want its client key", n)
	}
	if n := k.addKeys("certificate", append(ca.CertPEM, kp.CertPEM...)); n != 0 {
		t.Fatalf("found %d keys in certificates", n)
	}
	finder := newLeakFinder(k.keys)
	block, _ := pem.Decode(kp.KeyPEM)
	der := block.Bytes
	marshal := func(v any) string {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	cases := []struct {
		name, data, form string
	}{
		{"PEM in a log", "level=info msg=writing key=" + string(kp.KeyPEM), base64Forms[0]},
		{"PEM in a JSON log", marshal(map[string]string{"key": string(kp.KeyPEM)}), base64Forms[0]},
		{"a []byte in a JSON log", marshal(map[string][]byte{"key": der}), base64Forms[0]},
		{"a kubeconfig", string(kubeconfig), base64Forms[1]},
		{"a Secret's data", marshal(corev1.Secret{Data: map[string][]byte{"tls.key": kp.KeyPEM}}), base64Forms[1]},
		{"base64 at another alignment", base64.StdEncoding.EncodeToString([]byte("ab" + string(kp.KeyPEM))), base64Forms[1]},
		{"a kubeconfig in a Secret's data", marshal(corev1.Secret{Data: map[string][]byte{"value": kubeconfig}}), base64Forms[2]},
		{"DER in hex", "key " + hex.EncodeToString(der), "DER-hex"},
		{"DER in upper-case hex", fmt.Sprintf("key %X", der), "DER-hex"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hits := finder.find([]byte(tc.data))
			if len(hits) != 1 || hits[0].key.origin != "kubeconfig" || hits[0].form != tc.form {
				t.Errorf("hits %v, want the kubeconfig's key in %s form", hits, tc.form)
			}
		})
	}

	other, err := certs.NewCA("other", now)
	if err != nil {
		t.Fatal(err)
	}
	innocent := strings.Join([]string{
		string(ca.CertPEM), string(kp.CertPEM), string(other.KeyPEM),
		hex.EncodeToString(kp.Cert.Raw), base64.StdEncoding.EncodeToString(kp.CertPEM),
	}, "\n")
	if hits := finder.find([]byte(innocent)); len(hits) != 0 {
		t.Errorf("certificates and an unknown key were taken for a leak: %v", hits)
	}
}

// TestKeyLeakFilesCheck lays out a machine directory and a log directory:
// keys are collected from a machine's small files, not from etcd's large
// data files, and found in logs and in files others can read, wherever
// those are, but not in a machine's own 0600 files.
func TestKeyLeakFilesCheck(t *testing.T) {
	now := time.Now()
	a, err := certs.NewCA("a", now)
	if err != nil {
		t.Fatal(err)
	}
	b, err := certs.NewCA("b", now)
	if err != nil {
		t.Fatal(err)
	}
	machines, logs := t.TempDir(), t.TempDir()
	write := func(path string, mode os.FileMode, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	m := filepath.Join(machines, "default", "m1")
	write(filepath.Join(m, "pki", "etcd-ca.key"), 0o600, a.KeyPEM)
	// etcd's database holds the workload's data, key b among it: it is
	// neither collected nor searched.
	write(filepath.Join(m, "etcd", "member", "snap", "db"), 0o600, append(bytes.Repeat([]byte{0}, maxKeyFile), b.KeyPEM...))
	write(filepath.Join(m, "logs", "agent.log"), 0o600, []byte("key="+base64.StdEncoding.EncodeToString(a.KeyPEM)))
	write(filepath.Join(m, "copy.pem"), 0o644, a.KeyPEM)
	block, _ := pem.Decode(a.KeyPEM)
	write(filepath.Join(logs, "qcp-manager.log"), 0o644, []byte("key "+hex.EncodeToString(keySecret(block.Type, block.Bytes))))
	write(filepath.Join(logs, "b.log"), 0o644, b.KeyPEM)
	// A program is a build output, not read; a file that only looks
	// like one, or a script, is.
	elf := []byte("\x7fELF")
	write(filepath.Join(logs, "bin", "program"), 0o755, append(slices.Clone(elf), a.KeyPEM...))
	write(filepath.Join(logs, "bin", "not-executable"), 0o644, append(slices.Clone(elf), a.KeyPEM...))
	write(filepath.Join(logs, "bin", "script"), 0o755, append([]byte("#!/bin/sh\n"), a.KeyPEM...))

	k := &KeyLeakCheck{Dirs: []string{logs, machines}, MachineDirs: []string{machines}, keys: map[string]*leakKey{}}
	files, err := k.collectFiles()
	if err != nil {
		t.Fatal(err)
	}
	if files != 2 || len(k.keys) != 1 {
		t.Fatalf("%d files with keys and %d keys collected, want key a from 2 files (not key b, from etcd's database)", files, len(k.keys))
	}
	k.finder = newLeakFinder(k.keys)
	var found []string
	err = k.searchFiles(func(where string, data []byte) {
		if len(k.finder.find(data)) > 0 {
			found = append(found, strings.TrimPrefix(strings.Fields(where)[1], filepath.Dir(machines)))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		strings.TrimPrefix(filepath.Join(logs, "bin", "not-executable"), filepath.Dir(machines)),
		strings.TrimPrefix(filepath.Join(logs, "bin", "script"), filepath.Dir(machines)),
		strings.TrimPrefix(filepath.Join(logs, "qcp-manager.log"), filepath.Dir(machines)),
		strings.TrimPrefix(filepath.Join(m, "copy.pem"), filepath.Dir(machines)),
		strings.TrimPrefix(filepath.Join(m, "logs", "agent.log"), filepath.Dir(machines)),
	}
	if !slices.Equal(found, want) {
		t.Errorf("leaks found in %v, want %v: each once, none in the machine's 0600 key file", found, want)
	}
}
