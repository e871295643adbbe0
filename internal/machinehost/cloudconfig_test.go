package machinehost

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/cloudinit"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// cloudConfig is doc as QCP's controllers write it.
func cloudConfig(t testing.TB, doc *bootstrap.Document) []byte {
	t.Helper()
	raw, err := bootstrap.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	data, err := cloudinit.Build(raw)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestCloudConfigMachine boots a control plane machine from cloud-config:
// its files land under its root with their modes, its agent finds its
// address in the instance data and its name in the unit, and it runs
// etcd and Kubernetes and registers its Node with no machine.json. The
// Node has no providerID: the machine cannot know it, and qcp-manager
// gives the Node its Machine's.
func TestCloudConfigMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a machine; not run with -short")
	}
	h := newHost(t)
	c := newTestCluster(t, h, "ns", "cc")
	spec := c.spec("cc-m1", "fd-a")
	c.started = append(c.started, spec.Name)
	if err := h.StartBootstrap(spec, cloudinit.Format, cloudConfig(t, bootstrap.NewStacked(c.cl, c.cas, c.lbAddr, bootstrap.NewMember()))); err != nil {
		t.Fatal(err)
	}
	if err := h.SetBackends(c.ns, c.cl, []string{spec.Address + ":6443"}); err != nil {
		t.Fatal(err)
	}
	c.waitHealthy(spec, 3*time.Minute)
	node := c.waitNodeReady(spec.Name, "True", 2*time.Minute)
	if node.Spec.ProviderID != "" || node.Labels["kubernetes.io/hostname"] != spec.Name {
		t.Errorf("Node %s: providerID %q, hostname label %q; want none (the provider's to set) and the machine's name", node.Name, node.Spec.ProviderID, node.Labels["kubernetes.io/hostname"])
	}
	dir := h.Dir(c.ns, spec.Name)
	if _, err := os.Stat(filepath.Join(dir, agent.MachineFile)); !os.IsNotExist(err) {
		t.Errorf("%s exists (%v); a cloud-config machine has none", agent.MachineFile, err)
	}
	for path, mode := range map[string]os.FileMode{cloudinit.BootstrapPath: 0o600, cloudinit.UnitPath: 0o644, cloudinit.InstanceDataPath: 0o600} {
		if fi, err := os.Stat(filepath.Join(dir, path)); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s on the machine: %v (err %v), want mode %v", path, fi, err, mode)
		}
	}
	if got, want := h.DataDir(c.ns, spec.Name), filepath.Join(dir, cloudinit.DataDir); got != want {
		t.Errorf("DataDir = %s, want %s", got, want)
	}
	if _, err := os.Stat(filepath.Join(h.DataDir(c.ns, spec.Name), agent.PKIDir, "apiserver.key")); err != nil {
		t.Errorf("the agent's PKI is not in its data directory: %v", err)
	}
	st, err := h.Status(c.ns, spec.Name)
	if err != nil || !st.Running || st.Agent == nil || st.Agent.Phase != agent.PhaseRunning {
		t.Fatalf("status %+v (%v), want running with the agent's status.json read", st, err)
	}
	args := strings.Join(cmdline(st.PID), " ")
	for _, want := range []string{"--node-name=" + spec.Name, "--bootstrap-file=" + filepath.Join(dir, cloudinit.BootstrapPath), "--bin-dir=" + h.BinDir} {
		if !strings.Contains(args, want) {
			t.Errorf("the agent runs as %q, without %q", args, want)
		}
	}
	// A second start re-attaches; nothing is written again.
	if err := h.StartBootstrap(spec, cloudinit.Format, []byte("not even cloud-config")); err != nil {
		t.Errorf("starting a running machine again: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.kube.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{}); err != nil {
		t.Error(err)
	}
}

// TestStartCloudConfigRejectsBeforeCreatingAnything: bootstrap data the
// provider cannot run as asked is refused with a reason and a message
// that names what is wrong (the format, the line), and no directory or
// process is made.
func TestStartCloudConfigRejectsBeforeCreatingAnything(t *testing.T) {
	h := newHost(t)
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	spec := MachineSpec{Name: "bad", Namespace: "ns", Cluster: "c", Address: "127.0.209.3", ProviderID: "process://ns/bad"}
	good := string(cloudConfig(t, bootstrap.NewEtcdOnly("c", cas.Etcd, bootstrap.NewMember())))
	missing := bootstrap.NewEtcdOnly("c", cas.Etcd, bootstrap.NewMember())
	missing.Versions.Etcd = "v3.9.99"
	for _, tc := range []struct {
		name, format, data, reason string
		want                       []string
	}{
		{"an unknown format", "qcp-unknown", good, ReasonInvalidBootstrapData, []string{`format "qcp-unknown"`, cloudinit.Format}},
		{"malformed cloud-config", cloudinit.Format, "## template: jinja\n#cloud-config\nwrite_files:\n- path: /etc/x\n  content: [a\nruncmd: []\n", ReasonInvalidBootstrapData, []string{"line 5"}},
		{"another command", cloudinit.Format, strings.Replace(good, "- daemon-reload", "- daemon-reload\n- - rm\n  - -rf\n  - /", 1), ReasonInvalidBootstrapData, []string{`runcmd "rm -rf /"`}},
		{"a unit nothing writes", cloudinit.Format, strings.Replace(good, "- enable\n  - --now\n  - qcp-agent.service", "- start\n  - etcd.service", 1), ReasonInvalidBootstrapData, []string{"etcd.service", "no write_files entry"}},
		{"a missing binary", cloudinit.Format, string(cloudConfig(t, missing)), ReasonBinaryMissing, []string{"v3.9.99"}},
	} {
		err := h.StartBootstrap(spec, tc.format, []byte(tc.data))
		if got := ReasonOf(err); got != tc.reason {
			t.Errorf("%s: reason %q (err %v), want %q", tc.name, got, err, tc.reason)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", tc.name, err, w)
			}
		}
		if _, err := os.Stat(h.Dir("ns", "bad")); !os.IsNotExist(err) {
			t.Errorf("%s: the machine directory exists after a rejected start (stat err %v)", tc.name, err)
		}
	}
}

// TestOldFormatMachineSurvivesAgentRestart: a machine made from the old
// qcp format before cloud-config keeps its machine.json and its data in
// the machine directory, and when its agent restarts (a new qcp-agent, a
// reboot) it reads them again and comes back as the same etcd member.
func TestOldFormatMachineSurvivesAgentRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a machine; not run with -short")
	}
	h := newHost(t)
	c := newTestCluster(t, h, "ns", "old")
	spec := c.spec("old-m1", "fd-a")
	data, err := bootstrap.Marshal(bootstrap.NewEtcdOnly(c.cl, c.cas.Etcd, bootstrap.NewMember()))
	if err != nil {
		t.Fatal(err)
	}
	c.started = append(c.started, spec.Name)
	if err := h.StartBootstrap(spec, bootstrap.Format, data); err != nil {
		t.Fatal(err)
	}
	c.waitHealthy(spec, 2*time.Minute)
	cli := c.etcdClient(clientURL(spec))
	before, ok, err := c.member(cli, spec)
	if err != nil || !ok {
		t.Fatalf("the machine's etcd member: %v (found %v)", err, ok)
	}
	st, err := h.Status(c.ns, spec.Name)
	if err != nil || !st.Running {
		t.Fatalf("status %+v (%v)", st, err)
	}
	if err := stopGroup(st.PID); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.Status(c.ns, spec.Name); st.Running {
		t.Fatalf("the agent still runs after its process group was stopped: %+v", st)
	}
	if err := h.StartBootstrap(spec, bootstrap.Format, data); err != nil {
		t.Fatal(err)
	}
	c.waitHealthy(spec, 2*time.Minute)
	after, ok, err := c.member(cli, spec)
	if err != nil || !ok || after.ID != before.ID {
		t.Errorf("after the agent's restart the machine's member is %x (found %v, %v); want %x, the one it had", after.ID, ok, err, before.ID)
	}
	dir := h.Dir(c.ns, spec.Name)
	if _, err := os.Stat(filepath.Join(dir, agent.MachineFile)); err != nil || h.DataDir(c.ns, spec.Name) != dir {
		t.Errorf("the old machine's %s: %v, data directory %s; want it kept, and its data in %s", agent.MachineFile, err, h.DataDir(c.ns, spec.Name), dir)
	}
}

// TestCloudConfigWithCorruptDocument: the provider does not read the
// bootstrap document's key material, so a corrupt document inside valid
// cloud-config boots the machine, and its agent refuses it: it exits with
// reason InvalidBootstrapData naming the field, and starts nothing.
func TestCloudConfigWithCorruptDocument(t *testing.T) {
	if testing.Short() {
		t.Skip("runs qcp-agent; not run with -short")
	}
	h := newHost(t)
	data, err := cloudinit.Build([]byte("apiVersion: bootstrap.qcp.dev/v1alpha1\nkind: MachineBootstrap\nbogus: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	spec := MachineSpec{Name: "corrupt", Namespace: "ns", Cluster: "c", Address: "127.0.209.4", ProviderID: "process://ns/corrupt"}
	t.Cleanup(func() { _ = h.Stop(spec.Namespace, spec.Name) })
	if err := h.StartBootstrap(spec, cloudinit.Format, data); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st MachineStatus
	if err := testkit.Eventually(ctx, 100*time.Millisecond, "the agent to exit", func(context.Context) error {
		if st, err = h.Status(spec.Namespace, spec.Name); err != nil || st.Running || st.Agent == nil || st.Agent.Phase != agent.PhaseFailed {
			return fmt.Errorf("status %+v (%v)", st, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if st.Running || st.Agent == nil || st.Agent.Reason != ReasonInvalidBootstrapData || !strings.Contains(st.Agent.Message, `unknown field "bogus"`) {
		t.Fatalf("status %+v (agent %+v), want the agent exited with InvalidBootstrapData naming the field", st, st.Agent)
	}
	if _, err := os.Stat(filepath.Join(h.DataDir(spec.Namespace, spec.Name), agent.LogDir)); !os.IsNotExist(err) {
		t.Errorf("the agent made its logs directory (%v): something started", err)
	}
}
