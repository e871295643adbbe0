package bootstrap

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/certs"
)

func testCAs(t testing.TB) *certs.ClusterCAs {
	t.Helper()
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return cas
}

func TestStackedRoundTrips(t *testing.T) {
	cas := testCAs(t)
	for name, d := range map[string]*Document{
		"new":      NewStacked("c1", cas, "127.0.200.1:6443", NewMember()),
		"join":     NewStacked("c1", cas, "127.0.200.1:6443", JoinMember("https://127.0.200.2:2379")),
		"external": NewExternal("c1", cas, "", ExternalEtcd{Endpoints: []string{"https://127.0.200.9:2379"}, CACert: string(cas.Etcd.CertPEM), ClientCert: mustClient(t, cas), ClientKey: lastKey}),
		"etcdonly": NewEtcdOnly("e1", cas.Etcd, NewMember()),
		"quota":    NewEtcdOnly("e1", cas.Etcd, LocalEtcd{Mode: EtcdModeNew, QuotaBackendBytes: 8 << 30}),
	} {
		t.Run(name, func(t *testing.T) {
			roundTrip(t, d)
			// JSON is accepted as well as YAML.
			a, _ := json.Marshal(d)
			if _, err := Parse(a); err != nil {
				t.Errorf("JSON form rejected: %v", err)
			}
		})
	}
}

// lastKey carries the key of the last client issued by mustClient; tests
// in this file run sequentially.
var lastKey string

func mustClient(t *testing.T, cas *certs.ClusterCAs) string {
	kp, err := certs.IssueEtcdClient(cas.Etcd, "apiserver-etcd-client", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	lastKey = string(kp.KeyPEM)
	return string(kp.CertPEM)
}

func TestParseRejects(t *testing.T) {
	cas := testCAs(t)
	valid, err := Marshal(NewStacked("c1", cas, "127.0.200.1:6443", NewMember()))
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(d *Document)) []byte {
		d, err := Parse(valid)
		if err != nil {
			t.Fatal(err)
		}
		f(d)
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	cases := []struct {
		name string
		data []byte
		want []string // every substring must appear in the error
	}{
		{"empty", nil, []string{"empty", APIVersion}},
		{"garbage", []byte("\x00\x01{["), []string{"not valid YAML or JSON"}},
		{"unknown version", []byte(strings.Replace(string(valid), APIVersion, "bootstrap.qcp.dev/v9", 1)), []string{"apiVersion", `unknown version "bootstrap.qcp.dev/v9"`, "upgrade qcp-agent"}},
		{"wrong kind", []byte(strings.Replace(string(valid), "kind: "+Kind, "kind: Other", 1)), []string{"kind", "Other"}},
		{"unknown field", append(append([]byte{}, valid...), []byte("extra: 1\n")...), []string{`unknown field "extra"`, "remove it"}},
		{"unknown nested field", []byte(strings.Replace(string(valid), "  mode: new", "  mode: new\n    flavour: x", 1)), []string{`unknown field "etcd.local.flavour"`}},
		{"bad cluster name", edit(func(d *Document) { d.ClusterName = "Bad_Name" }), []string{"clusterName", "not a DNS label"}},
		{"bad endpoint", edit(func(d *Document) { d.ControlPlaneEndpoint = "nohost" }), []string{"controlPlaneEndpoint", "host:port"}},
		{"no components", edit(func(d *Document) { d.Components = nil }), []string{"components", "no component"}},
		{"unknown component", edit(func(d *Document) { d.Components = append(d.Components, "kubelet") }), []string{"components[4]", `unknown component "kubelet"`}},
		{"duplicate component", edit(func(d *Document) { d.Components = append(d.Components, Etcd) }), []string{"components[4]", "twice"}},
		{"bad kube version", edit(func(d *Document) { d.Versions.Kubernetes = "1.36" }), []string{"versions.kubernetes", "v1.36.3"}},
		{"bad etcd mode", edit(func(d *Document) { d.Etcd.Local.Mode = "join" }), []string{"etcd.local.mode", `unknown mode "join"`, "new"}},
		{"existing without endpoints", edit(func(d *Document) { d.Etcd.Local.Mode = EtcdModeExisting }), []string{"etcd.local.existingEndpoints", "mode existing"}},
		{"http endpoint", edit(func(d *Document) { *d.Etcd.Local = JoinMember("http://127.0.0.1:2379") }), []string{"etcd.local.existingEndpoints[0]", "https://"}},
		{"negative quota", edit(func(d *Document) { d.Etcd.Local.QuotaBackendBytes = -1 }), []string{"etcd.local.quotaBackendBytes", "-1 is negative", "8589934592"}},
		{"a restore without its checksum", edit(func(d *Document) {
			d.Etcd.Local.Restore = &EtcdRestore{URL: "https://s3.example.com/b/x.db?X-Amz-Signature=1", Snapshot: "x.db", Size: 10, Revision: 5, BumpRevision: 1_000_000_000}
		}), []string{"etcd.local.restore", "size and sha256 are required", "copy both from the snapshot's manifest"}},
		{"a restore that is not a URL", edit(func(d *Document) {
			d.Etcd.Local.Restore = &EtcdRestore{URL: "s3.example.com/x.db", Snapshot: "x.db", Size: 10, SHA256: strings.Repeat("a", 64), Revision: 5, BumpRevision: 1_000_000_000}
		}), []string{"etcd.local.restore.url", "not an http(s) URL"}},
		{"bad initial cluster", edit(func(d *Document) { d.Etcd.Local.InitialCluster = "m1" }), []string{"etcd.local.initialCluster", "name=peerURL"}},
		{"etcd without local", edit(func(d *Document) { d.Etcd.Local = nil }), []string{"etcd.local", "components include etcd"}},
		{"no etcd at all", edit(func(d *Document) { d.Etcd.Local = nil; d.Components = d.Components[1:] }), []string{"kube-apiserver needs etcd"}},
		{"both etcds", edit(func(d *Document) { d.Etcd.External = &ExternalEtcd{} }), []string{"both local and external"}},
		{"missing cluster CA", edit(func(d *Document) { d.Certificates.ClusterCA = nil }), []string{"certificates.clusterCA", "missing"}},
		{"corrupt etcd CA", edit(func(d *Document) { d.Certificates.EtcdCA.Key = "junk" }), []string{"certificates.etcdCA", "not a valid PEM"}},
		{"etcd trust without its CA", edit(func(d *Document) { d.Certificates.EtcdTrust = d.Certificates.ClusterCA.Cert }), []string{"certificates.etcdTrust", "holds certificates.etcdCA", "leave it empty"}},
		{"etcd trust not PEM", edit(func(d *Document) { d.Certificates.EtcdTrust = "junk" }), []string{"certificates.etcdTrust", "not PEM"}},
		{"mismatched CA key", edit(func(d *Document) { d.Certificates.FrontProxyCA.Key = d.Certificates.ClusterCA.Key }), []string{"certificates.frontProxyCA", "does not match"}},
		{"missing SA", edit(func(d *Document) { d.Certificates.ServiceAccount = nil }), []string{"certificates.serviceAccount", "<cluster>-sa"}},
		{"cluster signer not trusted", edit(func(d *Document) { d.Certificates.ClusterSigner = d.Certificates.FrontProxyCA }),
			[]string{"certificates.clusterTrust", "holds certificates.clusterSigner"}},
		{"corrupt cluster signer", edit(func(d *Document) { d.Certificates.ClusterSigner = &CertKey{Cert: "junk", Key: "junk"} }),
			[]string{"certificates.clusterSigner", "not a valid PEM"}},
		{"bad grace period", edit(func(d *Document) { d.Tunables.NodeMonitorGracePeriod = "soon" }), []string{"tunables.nodeMonitorGracePeriod", "duration"}},
		{"bad certificate validity", edit(func(d *Document) { d.Tunables.CertificateValidity = "30s" }), []string{"tunables.certificateValidity", "at least a minute", "720h"}},
		{"bad service range", edit(func(d *Document) { d.Tunables.ServiceClusterIPRange = "10.96.0.0" }), []string{"tunables.serviceClusterIPRange", "CIDR"}},
		{"IPv6 service range", edit(func(d *Document) { d.Tunables.ServiceClusterIPRange = "fd00::/108" }), []string{"tunables.serviceClusterIPRange", "IPv4 CIDR"}},
		{"bad pod range", edit(func(d *Document) { d.Tunables.PodCIDR = "192.168.0.0/33" }), []string{"tunables.podCIDR", "CIDR"}},
		{"bad DNS domain", edit(func(d *Document) { d.Tunables.DNSDomain = "Cluster_Local" }), []string{"tunables.dnsDomain", "not a DNS domain", "cluster.local"}},
		{"external without certs", edit(func(d *Document) {
			d.Components = d.Components[1:]
			d.Etcd.Local = nil
			d.Etcd.External = &ExternalEtcd{Endpoints: []string{"https://127.0.0.1:2379"}}
		}), []string{"etcd.external.caCert", "etcd.external.clientCert"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.data)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Errorf("error leaks key material: %q", err)
			}
		})
	}
}

func TestCheckBinaries(t *testing.T) {
	dir := t.TempDir()
	d := NewStacked("c1", testCAs(t), "", NewMember())
	err := d.CheckBinaries(dir)
	if !IsMissingBinary(err) || !strings.Contains(err.Error(), "etcd-v3.6.16") || !strings.Contains(err.Error(), "make binaries") {
		t.Fatalf("want missing etcd naming the fix, got %v", err)
	}
	for _, b := range []string{"etcd-" + d.Versions.Etcd, "kube-" + d.Versions.Kubernetes} {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.CheckBinaries(dir); err != nil {
		t.Fatal(err)
	}
	d.Versions.Kubernetes = "v1.99.0"
	if err := d.CheckBinaries(dir); !IsMissingBinary(err) || !strings.Contains(err.Error(), "kube v1.99.0") {
		t.Fatalf("want missing kube v1.99.0, got %v", err)
	}
}

func FuzzParse(f *testing.F) {
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		f.Fatal(err)
	}
	valid, _ := Marshal(NewStacked("c1", cas, "127.0.200.1:6443", NewMember()))
	f.Add(valid)
	f.Add([]byte(`{"apiVersion":"` + APIVersion + `","kind":"` + Kind + `","components":["etcd"]}`))
	f.Add([]byte("apiVersion: x\n"))
	f.Add([]byte("- 1\n- 2"))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse(data)
		if err == nil && d.Validate() != nil {
			t.Fatal("Parse accepted a document Validate rejects")
		}
	})
}

// roundTrip checks that d survives Marshal and Parse unchanged.
func roundTrip(t *testing.T, d *Document) {
	t.Helper()
	data, err := Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(d)
	b, _ := json.Marshal(got)
	if string(a) != string(b) {
		t.Errorf("round trip changed the document:\n%s\n%s", a, b)
	}
}

func TestLeafValidity(t *testing.T) {
	d := NewStacked("c1", testCAs(t), "", NewMember())
	if got := d.LeafValidity(); got != 0 {
		t.Errorf("no tunable: got %s, want 0 (the certificate package's default)", got)
	}
	d.Tunables.CertificateValidityDays = 30
	if got := d.LeafValidity(); got != 30*24*time.Hour {
		t.Errorf("30 days: got %s", got)
	}
	d.Tunables.CertificateValidity = "10m"
	if got := d.LeafValidity(); got != 10*time.Minute {
		t.Errorf("the duration overrides the days: got %s, want 10m", got)
	}
}
