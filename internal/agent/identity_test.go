package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// TestPreflightCloudConfig: a machine booted from cloud-config takes its
// name from --node-name, its address from the instance data and its
// cluster from the document; a corrupt document, a bad name or a bad
// address in the instance data stops it with a reason and a message that
// names the fault.
func TestPreflightCloudConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "etcd-"+binaries.EtcdVersion), nil, 0o700); err != nil {
		t.Fatal(err)
	}
	ca, err := certs.NewCA("etcd-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := bootstrap.Marshal(bootstrap.NewEtcdOnly("demo", ca, bootstrap.NewMember()))
	if err != nil {
		t.Fatal(err)
	}
	doc := write("bootstrap.yaml", string(raw))
	instance := write("instance-data.json", `{"v1": {"local_hostname": "m1"}, "ds": {"meta_data": {"local-ipv4": "127.0.209.9"}}}`)
	opts := Options{Dir: dir, BinDir: bin, BootstrapFile: doc, NodeName: "m1", InstanceData: instance}
	m, d, err := Preflight(opts)
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "m1" || m.Address != "127.0.209.9" || m.Cluster != "demo" || m.String() != "m1" || d.ClusterName != "demo" {
		t.Errorf("identity %+v (%s), want m1 of demo at the instance data's address", m, m)
	}
	var pf *PreflightError
	for _, tc := range []struct {
		name   string
		change func(*Options)
		reason string
		says   string
	}{
		{"a corrupt document", func(o *Options) {
			o.BootstrapFile = write("corrupt.yaml", "apiVersion: bootstrap.qcp.dev/v1alpha1\nkind: MachineBootstrap\nbogus: true\n")
		}, ReasonInvalidBootstrapData, `unknown field "bogus"`},
		{"no document", func(o *Options) { o.BootstrapFile = filepath.Join(dir, "absent.yaml") }, ReasonInvalidBootstrapData, "cloud-init writes it"},
		{"a bad host name", func(o *Options) { o.NodeName = "M_1" }, ReasonInvalidMachine, `name "M_1"`},
		{"a bad address", func(o *Options) {
			o.InstanceData = write("bad-instance.json", `{"ds": {"meta_data": {"local-ipv4": "nowhere"}}}`)
		}, ReasonInvalidMachine, `"nowhere" is not an IPv4 address`},
		{"instance data that is not JSON", func(o *Options) { o.InstanceData = write("garbled.json", "{") }, ReasonInvalidMachine, "not JSON"},
	} {
		o := opts
		tc.change(&o)
		_, _, err := Preflight(o)
		if !errors.As(err, &pf) || pf.Reason != tc.reason || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want reason %s naming %q", tc.name, err, tc.reason, tc.says)
		}
	}
	// --address wins over the instance data.
	o := opts
	o.Address = "127.0.209.10"
	if m, _, _ := Preflight(o); m.Address != "127.0.209.10" {
		t.Errorf("with --address the machine is at %s", m.Address)
	}
}
