package engine

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/cloudinit"
	"github.com/qcp-dev/qcp/internal/quorum"
)

func TestBootstrapDataSecret(t *testing.T) {
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	doc := bootstrap.NewStacked("demo", cas, "127.0.9.1:6443", bootstrap.NewMember())
	doc.Versions = bootstrap.Versions{Kubernetes: "v1.36.3", Etcd: "v3.6.16"}
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp-1", Namespace: "default", UID: "u1"},
		Spec: clusterv1.MachineSpec{ClusterName: "demo"}}
	s, err := BootstrapDataSecret(m, doc, "")
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "demo-cp-1-bootstrap" || s.Type != clusterv1.ClusterSecretType || s.Labels[clusterv1.ClusterNameLabel] != "demo" {
		t.Errorf("secret %s of type %s with labels %v", s.Name, s.Type, s.Labels)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "u1" || s.OwnerReferences[0].Kind != "Machine" {
		t.Errorf("owner references %v, want the Machine", s.OwnerReferences)
	}
	cfg, err := cloudinit.Parse(s.Data["value"], map[string]string{cloudinit.HostnameKey: m.Name})
	if err != nil {
		t.Fatalf("the bootstrap data is not cloud-config QCP can run: %v", err)
	}
	var raw []byte
	for _, f := range cfg.WriteFiles {
		if f.Path == cloudinit.BootstrapPath {
			raw, _ = f.Decode()
		}
	}
	back, err := bootstrap.Parse(raw)
	if err != nil {
		t.Fatalf("the agent cannot read the bootstrap data: %v", err)
	}
	if back.ClusterName != "demo" || string(s.Data["format"]) != cloudinit.Format {
		t.Errorf("bootstrap data for cluster %q, format %q", back.ClusterName, s.Data["format"])
	}
}

// TestBootstrapMachineCarriesHooks: the machine that starts a new etcd
// cluster is created with the deletion hooks, since its member is a voter,
// and the only copy of etcd, from its first moment; a machine that joins
// (as a learner), or runs no member, is not.
func TestBootstrapMachineCarriesHooks(t *testing.T) {
	join := bootstrap.JoinMember("https://127.0.0.1:2379")
	newMember := bootstrap.NewMember()
	cases := []struct {
		name  string
		local *bootstrap.LocalEtcd
		hooks bool
	}{
		{"a new etcd cluster", &newMember, true},
		{"a member joining", &join, false},
		{"no member (external etcd)", nil, false},
	}
	for _, tc := range cases {
		doc := &bootstrap.Document{Etcd: bootstrap.EtcdConfig{Local: tc.local}}
		got := withBootstrapHooks(map[string]string{"a": "b"}, doc)
		for _, hook := range quorum.HookAnnotations {
			if _, ok := got[hook]; ok != tc.hooks {
				t.Errorf("%s: hook %s present %v, want %v", tc.name, hook, ok, tc.hooks)
			}
		}
		if got["a"] != "b" {
			t.Errorf("%s: the other annotations were lost: %v", tc.name, got)
		}
	}
}
