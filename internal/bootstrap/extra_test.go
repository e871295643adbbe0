package bootstrap

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestExtraArgsAndCertSANsAccepted(t *testing.T) {
	cas := testCAs(t)
	cases := []struct {
		name string
		edit func(d *Document)
	}{
		{"none", func(d *Document) {}},
		{"a flag per component", func(d *Document) {
			d.ExtraArgs = map[Component][]Arg{
				Etcd:                  {{Name: "quota-backend-bytes", Value: "8589934592"}},
				KubeAPIServer:         {{Name: "audit-log-path", Value: "-"}},
				KubeControllerManager: {{Name: "cluster-signing-duration", Value: "720h"}},
				KubeScheduler:         {{Name: "v", Value: "2"}},
			}
		}},
		// Names that share a prefix with an owned flag are the user's.
		{"near an owned name", func(d *Document) {
			d.ExtraArgs = map[Component][]Arg{
				Etcd:          {{Name: "peer-cert-allowed-cn", Value: "etcd"}, {Name: "log-level", Value: "info"}},
				KubeAPIServer: {{Name: "etcd-servers-overrides", Value: "/events#https://127.0.0.1:2379"}, {Name: "tls-min-version", Value: "VersionTLS13"}},
			}
		}},
		{"repeated flag and empty value", func(d *Document) {
			d.ExtraArgs = map[Component][]Arg{KubeAPIServer: {
				{Name: "feature-gates", Value: "A=true"}, {Name: "feature-gates", Value: "B=false"}, {Name: "audit-policy-file", Value: ""},
			}}
		}},
		{"an empty list for a component not run", func(d *Document) {
			d.Components = d.Components[:3]
			d.ExtraArgs = map[Component][]Arg{KubeScheduler: {}}
		}},
		{"certSANs", func(d *Document) {
			d.CertSANs = []string{"api.example.com", "*.api.example.com", "192.0.2.10", "2001:db8::1"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := NewStacked("c1", cas, "127.0.200.1:6443", NewMember())
			tc.edit(d)
			roundTrip(t, d)
		})
	}
}

func TestExtraFlags(t *testing.T) {
	d := &Document{ExtraArgs: map[Component][]Arg{KubeAPIServer: {{Name: "v", Value: "4"}, {Name: "audit-log-path", Value: "-"}, {Name: "x", Value: ""}}}}
	want := []string{"--v=4", "--audit-log-path=-", "--x="}
	if got := d.ExtraFlags(KubeAPIServer); !reflect.DeepEqual(got, want) {
		t.Errorf("ExtraFlags = %q, want %q", got, want)
	}
	if got := d.ExtraFlags(Etcd); len(got) != 0 {
		t.Errorf("ExtraFlags of a component without extra args = %q", got)
	}
}

func TestParseRejectsExtraArgsAndCertSANs(t *testing.T) {
	cas := testCAs(t)
	edit := func(f func(d *Document)) []byte {
		d := NewStacked("c1", cas, "127.0.200.1:6443", NewMember())
		f(d)
		out, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	args := func(c Component, a ...Arg) func(d *Document) {
		return func(d *Document) { d.ExtraArgs = map[Component][]Arg{c: a} }
	}
	valid, err := Marshal(NewStacked("c1", cas, "127.0.200.1:6443", NewMember()))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		data []byte
		want []string // every substring must appear in the error
	}{
		{"unknown component", edit(args("kubelet", Arg{Name: "v", Value: "2"})), []string{"extraArgs.kubelet", `unknown component "kubelet"`, "kube-scheduler"}},
		{"component not run", edit(func(d *Document) {
			d.Components = d.Components[:3]
			d.ExtraArgs = map[Component][]Arg{KubeScheduler: {{Name: "v", Value: "2"}}}
		}), []string{"extraArgs.kube-scheduler:", "components do not include it", "add kube-scheduler to components or remove extraArgs.kube-scheduler"}},
		{"empty name", edit(args(Etcd, Arg{Value: "x"})), []string{"extraArgs.etcd[0].name: empty", "without leading dashes"}},
		{"leading dashes", edit(args(KubeAPIServer, Arg{Name: "--v", Value: "2"})), []string{"extraArgs.kube-apiserver[0].name", `"--v" starts with '-'`, `without dashes ("v")`}},
		{"value in name", edit(args(KubeAPIServer, Arg{Name: "v=2"})), []string{"extraArgs.kube-apiserver[0].name", `"v=2" is not a flag name`, "put the value in value"}},
		{"NUL in value", edit(args(KubeScheduler, Arg{Name: "v", Value: "2\x00"})), []string{"extraArgs.kube-scheduler[0].value", "NUL"}},
		{"etcd data dir", edit(args(Etcd, Arg{Name: "log-level", Value: "info"}, Arg{Name: "data-dir", Value: "/tmp/x"})), []string{"extraArgs.etcd[1].name", "flag --data-dir of etcd is owned by qcp-agent", "remove it"}},
		{"etcd prefix", edit(args(Etcd, Arg{Name: "listen-client-http-urls", Value: "http://0.0.0.0:2379"})), []string{"extraArgs.etcd[0].name", "--listen-client-http-urls"}},
		{"etcd initial cluster state", edit(args(Etcd, Arg{Name: "initial-cluster-state", Value: "existing"})), []string{"--initial-cluster-state of etcd is owned"}},
		{"etcd token", edit(args(Etcd, Arg{Name: "initial-cluster-token", Value: "x"})), []string{"--initial-cluster-token", "set clusterName instead"}},
		{"etcd config file", edit(args(Etcd, Arg{Name: "config-file", Value: "/etc/etcd.yaml"})), []string{"--config-file of etcd"}},
		{"apiserver etcd servers", edit(args(KubeAPIServer, Arg{Name: "etcd-servers", Value: "https://x:2379"})), []string{"extraArgs.kube-apiserver[0].name", "--etcd-servers", "etcd.external.endpoints"}},
		{"apiserver port", edit(args(KubeAPIServer, Arg{Name: "secure-port", Value: "7443"})), []string{"--secure-port of kube-apiserver"}},
		{"apiserver underscore spelling", edit(args(KubeAPIServer, Arg{Name: "bind_address", Value: "0.0.0.0"})), []string{"--bind_address of kube-apiserver is owned"}},
		{"apiserver serving cert", edit(args(KubeAPIServer, Arg{Name: "tls-cert-file", Value: "/x.crt"})), []string{"--tls-cert-file of kube-apiserver"}},
		{"apiserver service range", edit(args(KubeAPIServer, Arg{Name: "service-cluster-ip-range", Value: "10.0.0.0/16"})), []string{"set the Cluster's spec.clusterNetwork.services.cidrBlocks instead"}},
		{"kcm grace period", edit(args(KubeControllerManager, Arg{Name: "node-monitor-grace-period", Value: "1m"})), []string{"extraArgs.kube-controller-manager[0].name", "set tunables.nodeMonitorGracePeriod instead"}},
		{"kcm signing key", edit(args(KubeControllerManager, Arg{Name: "cluster-signing-key-file", Value: "/k"})), []string{"--cluster-signing-key-file of kube-controller-manager"}},
		{"scheduler config", edit(args(KubeScheduler, Arg{Name: "config", Value: "/s.yaml"})), []string{"extraArgs.kube-scheduler[0].name", "--config of kube-scheduler"}},
		{"every problem at once", edit(func(d *Document) {
			d.ExtraArgs = map[Component][]Arg{Etcd: {{Name: "name", Value: "x"}}, KubeScheduler: {{Name: "kubeconfig", Value: "/k"}}}
		}), []string{"extraArgs.etcd[0].name", "extraArgs.kube-scheduler[0].name"}},
		{"unknown field in an arg", []byte(strings.Replace(string(valid), "tunables:", "extraArgs:\n  etcd:\n  - name: v\n    vaule: \"2\"\ntunables:", 1)), []string{`unknown field "extraArgs.etcd[0].vaule"`}},
		{"bad SAN", edit(func(d *Document) { d.CertSANs = []string{"api.example.com", "API_server"} }), []string{"certSANs[1]", `"API_server" is neither an IP address nor a DNS name`, "lower-case DNS name"}},
		{"SAN with a port", edit(func(d *Document) { d.CertSANs = []string{"192.0.2.10:6443"} }), []string{"certSANs[0]", "neither"}},
		{"SANs without kube-apiserver", edit(func(d *Document) {
			*d = *NewEtcdOnly("e1", cas.Etcd, NewMember())
			d.CertSANs = []string{"api.example.com"}
		}), []string{"certSANs:", "components do not include kube-apiserver"}},
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
		})
	}
}
