package cloudinit_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/cloudinit"
)

// cases are the bootstrap documents QCP writes, built as its controllers
// build them: a control plane's first machine, its n-th machine joining n-1
// members during a rollout's surge (n endpoints), a machine on external
// etcd, and an etcd-only machine of an EtcdCluster. During a CA rotation
// each trust bundle holds two authorities, the largest a document gets.
func cases(t *testing.T) map[string][]byte {
	t.Helper()
	now := time.Now()
	cas, err := certs.NewClusterCAs(now)
	if err != nil {
		t.Fatal(err)
	}
	next, err := certs.NewClusterCAs(now)
	if err != nil {
		t.Fatal(err)
	}
	rotating := *cas
	rotating.ClusterTrust = slices.Concat(cas.Cluster.CertPEM, next.Cluster.CertPEM)
	rotating.ClusterSigner = next.Cluster
	rotating.EtcdTrust = slices.Concat(cas.Etcd.CertPEM, next.Etcd.CertPEM)
	rotating.FrontProxyTrust = slices.Concat(cas.FrontProxy.CertPEM, next.FrontProxy.CertPEM)
	rotating.ServiceAccountTrust = slices.Concat(cas.ServiceAccount.CertPEM, next.ServiceAccount.CertPEM)
	endpoints := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("https://10.0.0.%d:2379", 10+i))
		}
		return out
	}
	client, err := certs.IssueEtcdClient(cas.Etcd, "apiserver-etcd-client", now)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]*bootstrap.Document{
		"1 replica (first machine)": bootstrap.NewStacked("demo", cas, "10.0.0.1:6443", bootstrap.NewMember()),
		"3 replicas (joining)":      bootstrap.NewStacked("demo", &rotating, "10.0.0.1:6443", bootstrap.JoinMember(endpoints(3)...)),
		"5 replicas (joining)":      bootstrap.NewStacked("demo", &rotating, "10.0.0.1:6443", bootstrap.JoinMember(endpoints(5)...)),
		"external etcd": bootstrap.NewExternal("demo", &rotating, "10.0.0.1:6443", bootstrap.ExternalEtcd{
			Endpoints: endpoints(5), FollowMembership: true, CACert: string(rotating.EtcdTrust),
			ClientCert: string(client.CertPEM), ClientKey: string(client.KeyPEM),
		}),
		"etcd-only (joining)": bootstrap.NewEtcdOnly("demo-etcd", cas.Etcd, bootstrap.JoinMember(endpoints(5)...)),
	}
	out := map[string][]byte{}
	for name, doc := range docs {
		doc.Tunables.CertificateValidityDays = 365
		doc.Tunables.ServiceClusterIPRange = "10.128.0.0/12"
		doc.Tunables.PodCIDR = "192.168.0.0/16"
		doc.Tunables.DNSDomain = "cluster.local"
		if doc.RunsKubernetes() {
			doc.CertSANs = []string{"demo.example.com"}
		}
		data, err := bootstrap.Marshal(doc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = data
	}
	return out
}

var facts = map[string]string{cloudinit.HostnameKey: "demo-cp-abcde"}

// TestBuildThenParse: what Build writes, Parse reads back: the bootstrap
// document byte for byte, 0600 root:root, the unit with the machine's host
// name rendered into its command line, and runcmd starting it.
func TestBuildThenParse(t *testing.T) {
	for name, doc := range cases(t) {
		data, err := cloudinit.Build(doc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		cfg, err := cloudinit.Parse(data, facts)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, data)
		}
		files := map[string]cloudinit.File{}
		for _, f := range cfg.WriteFiles {
			files[f.Path] = f
		}
		boot, ok := files[cloudinit.BootstrapPath]
		if !ok {
			t.Fatalf("%s: no %s among %v", name, cloudinit.BootstrapPath, cfg.WriteFiles)
		}
		if got, err := boot.Decode(); err != nil || !bytes.Equal(got, doc) {
			t.Errorf("%s: the bootstrap file decodes to %d bytes (%v), want the document's %d", name, len(got), err, len(doc))
		}
		if mode, err := boot.Mode(); err != nil || mode != 0o600 || boot.Owner != "root:root" {
			t.Errorf("%s: the bootstrap file is %v %q (%v); it holds private keys, want 0600 root:root", name, mode, boot.Owner, err)
		}
		if strings.Contains(string(data), "PRIVATE KEY") {
			t.Errorf("%s: a private key is readable in the user data; the bootstrap file must be encoded", name)
		}
		unit, err := files[cloudinit.UnitPath].Decode()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(unit), "ExecStart="+cloudinit.AgentPath+" run ") || !strings.Contains(string(unit), "--node-name=demo-cp-abcde") {
			t.Errorf("%s: the unit does not start the agent for the machine's host name:\n%s", name, unit)
		}
		want := [][]string{{"systemctl", "daemon-reload"}, {"systemctl", "enable", "--now", cloudinit.UnitName}}
		if !slices.EqualFunc(cfg.RunCmd, want, slices.Equal) {
			t.Errorf("%s: runcmd %v, want %v", name, cfg.RunCmd, want)
		}
	}
}

// TestParseNamesTheLineAtFault: a provider that executes cloud-config
// refuses what it cannot carry out, naming the line of the document as
// the Secret holds it (the jinja header counted).
func TestParseNamesTheLineAtFault(t *testing.T) {
	const good = "## template: jinja\n#cloud-config\nwrite_files:\n- path: /etc/x\n  content: hi\nruncmd:\n- [systemctl, start, x]\n"
	if _, err := cloudinit.Parse([]byte(good), facts); err != nil {
		t.Fatalf("the reference document: %v", err)
	}
	for _, tc := range []struct {
		name, doc string
		line      int
		says      string
	}{
		{"malformed YAML", "## template: jinja\n#cloud-config\nwrite_files:\n- path: /etc/x\n  content: [a\nruncmd: []\n", 5, "did not find expected"},
		{"not cloud-config", "## template: jinja\n#!/bin/sh\necho hi\n", 2, "#cloud-config"},
		{"an unknown placeholder", "## template: jinja\n#cloud-config\nwrite_files:\n- path: /etc/{{ v1.region }}\n  content: hi\n", 4, "v1.region"},
		{"a jinja statement", "## template: jinja\n#cloud-config\n{% if true %}\nruncmd: []\n", 3, "{% if true %}"},
		{"an unsupported module", "#cloud-config\nwrite_files: []\npackages: [etcd]\n", 3, `"packages"`},
		{"an unknown write_files field", "#cloud-config\nwrite_files:\n- path: /etc/x\n  content: hi\n  defer: true\n", 3, "defer"},
		{"an unknown encoding", "#cloud-config\nwrite_files:\n- path: /etc/x\n  encoding: zstd\n  content: hi\n", 3, "zstd"},
		{"content that is not gzip", "#cloud-config\nwrite_files:\n- path: /etc/x\n  encoding: gz+b64\n  content: aGk=\n", 3, "gzip"},
		{"a relative path", "#cloud-config\nwrite_files:\n- path: etc/x\n  content: hi\n", 3, "absolute"},
		{"bad permissions", "#cloud-config\nwrite_files:\n- path: /etc/x\n  permissions: rw\n  content: hi\n", 3, "octal"},
		{"another owner", "#cloud-config\nwrite_files:\n- path: /etc/x\n  owner: etcd:etcd\n  content: hi\n", 3, "etcd:etcd"},
		{"a runcmd that is a map", "#cloud-config\nruncmd:\n- {a: b}\n", 3, "runcmd"},
	} {
		_, err := cloudinit.Parse([]byte(tc.doc), facts)
		var e *cloudinit.Error
		if !errors.As(err, &e) {
			t.Errorf("%s: Parse returned %v, want a *cloudinit.Error", tc.name, err)
			continue
		}
		if e.Line != tc.line || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), fmt.Sprintf("line %d", tc.line)) {
			t.Errorf("%s: %q, want line %d naming %q", tc.name, err, tc.line, tc.says)
		}
	}
}

// userDataLimit is the smallest user data limit of the clouds CAPI runs
// on: AWS's 16 KB, counted before base64.
const userDataLimit = 16 << 10

// TestUserDataFitsEveryCloud: the cloud-config of each case stays under
// 16 KB; the sizes are in docs/measurements.md (-v prints them).
func TestUserDataFitsEveryCloud(t *testing.T) {
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range cases(t) {
			if !yield(n) {
				return
			}
		}
	})
	docs := cases(t)
	for _, name := range names {
		data, err := cloudinit.Build(docs[name])
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%-26s document %5d B, user data %5d B", name, len(docs[name]), len(data))
		if len(data) >= userDataLimit {
			t.Errorf("%s: user data is %d bytes, over the %d-byte limit of AWS", name, len(data), userDataLimit)
		}
	}
}

// TestCloudInitSchemaAcceptsEveryDocument runs cloud-init's own schema
// check (Debian's cloud-init, which `make test` installs) on each case,
// rendered as cloud-init renders it: the check rejects a jinja header.
// It also shows the check can fail, on a document it must reject.
func TestCloudInitSchemaAcceptsEveryDocument(t *testing.T) {
	if testing.Short() {
		t.Skip("runs cloud-init; not run with -short")
	}
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Fatalf("cloud-init is not installed: run `make cloud-init` (apt-get install cloud-init): %v", err)
	}
	dir := t.TempDir()
	check := func(name string, data []byte) (string, error) {
		path := filepath.Join(dir, strings.NewReplacer(" ", "-", "(", "", ")", "").Replace(name)+".yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, "schema", "--config-file", path).CombinedOutput()
		return string(out), err
	}
	for name, doc := range cases(t) {
		data, err := cloudinit.Build(doc)
		if err != nil {
			t.Fatal(err)
		}
		rendered, err := cloudinit.Render(data, facts)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := check(name, rendered); err != nil || !strings.Contains(out, "Valid cloud-config") {
			t.Errorf("%s: cloud-init schema: %v\n%s\n%s", name, err, out, rendered)
		}
	}
	if out, err := check("invalid", []byte("#cloud-config\nwrite_files: 3\n")); err == nil {
		t.Errorf("cloud-init schema accepted write_files: 3:\n%s", out)
	}
}
