package machinehost

import (
	"cmp"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/testkit"
)

func TestStartRejectsBeforeCreatingAnything(t *testing.T) {
	h := newHost(t)
	// Only the pinned versions are "installed", so the case that asks for
	// another one fails on it whether or not bin/ is built.
	h.BinDir = t.TempDir()
	for _, name := range []string{"etcd-" + binaries.EtcdVersion, "kube-" + binaries.KubeVersion} {
		if err := os.WriteFile(filepath.Join(h.BinDir, name), nil, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cas, err := certs.NewClusterCAs(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	spec := MachineSpec{Name: "bad", Namespace: "ns", Cluster: "c", Address: "127.0.209.1", ProviderID: "process://ns/bad", FailureDomain: "fd-a"}
	good, err := bootstrap.Marshal(bootstrap.NewStacked("c", cas, "127.0.209.100:6443", bootstrap.NewMember()))
	if err != nil {
		t.Fatal(err)
	}
	missing := bootstrap.NewStacked("c", cas, "127.0.209.100:6443", bootstrap.NewMember())
	missing.Versions.Kubernetes = "v1.99.0"
	missingData, err := bootstrap.Marshal(missing)
	if err != nil {
		t.Fatal(err)
	}
	small, sized := spec, spec
	small.MemoryLimit, sized.MemoryLimit = 64<<20, 2<<30
	cgrouped, plain := *h, *h
	cgrouped.Cgroups, plain.Cgroups = true, false
	cases := []struct {
		name   string
		spec   MachineSpec
		data   []byte
		reason string
		want   []string
		host   *Host
	}{
		{"corrupt", spec, []byte("apiVersion: bootstrap.qcp.dev/v1alpha1\nkind: MachineBootstrap\nclusterName: [\n"), ReasonInvalidBootstrapData, []string{"machine ns/bad", "bootstrap data"}, nil},
		{"unknown version", spec, []byte(strings.Replace(string(good), bootstrap.APIVersion, "bootstrap.qcp.dev/v2", 1)), ReasonInvalidBootstrapData, []string{"apiVersion", "bootstrap.qcp.dev/v2", "upgrade qcp-agent"}, nil},
		{"missing binary", spec, missingData, ReasonBinaryMissing, []string{"kube v1.99.0", "make binaries"}, nil},
		{"bad address", MachineSpec{Name: "bad", Namespace: "ns", Cluster: "c", Address: "nowhere", ProviderID: "p"}, good, ReasonInvalidSpec, []string{"address", "nowhere"}, nil},
		{"too little memory", small, good, ReasonInvalidSpec, []string{"spec.memory", "below 128Mi", "give it 1Gi or more"}, &cgrouped},
		{"a memory limit without cgroups", sized, good, ReasonInvalidSpec, []string{"spec.memory needs cgroups", "leave spec.memory unset"}, &plain},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := cmp.Or(tc.host, h).Start(tc.spec, tc.data)
			if got := ReasonOf(err); got != tc.reason {
				t.Fatalf("reason = %q (err %v), want %q", got, err, tc.reason)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if _, err := os.Stat(h.Dir("ns", "bad")); !os.IsNotExist(err) {
				t.Errorf("machine directory exists after a rejected start (stat err %v)", err)
			}
		})
	}
}

// TestAgentExitsOnCorruptData runs the agent binary on a hand-written
// machine directory (as after a manager wrote it and the data was later
// corrupted): it must exit non-zero, say why, and start nothing.
func TestAgentExitsOnCorruptData(t *testing.T) {
	if testing.Short() {
		t.Skip("runs qcp-agent; not run with -short")
	}
	h := newHost(t)
	dir := h.Dir("ns", "corrupt")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(dir+"/machine.json", []byte(`{"name":"corrupt","namespace":"ns","cluster":"c","address":"127.0.209.2","providerID":"process://ns/corrupt"}`), 0o600)
	os.WriteFile(dir+"/bootstrap-data", []byte("apiVersion: bootstrap.qcp.dev/v1alpha1\nkind: MachineBootstrap\nbogus: true\n"), 0o600)
	out, err := exec.Command(h.AgentPath, "run", "--dir", dir, "--bin-dir", h.BinDir).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("agent did not fail: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `unknown field "bogus"`) {
		t.Errorf("output does not name the field: %s", out)
	}
	st, err := h.Status("ns", "corrupt")
	if err != nil || st.Running || st.Agent == nil || st.Agent.Reason != ReasonInvalidBootstrapData {
		t.Errorf("status = %+v, %v", st, err)
	}
	if _, err := os.Stat(dir + "/logs"); !os.IsNotExist(err) {
		t.Error("logs directory created: something started")
	}
}

// TestLoadBalancerOutlivesItsStarter starts a load balancer from a child
// process that then exits, as a manager restart would: the balancer keeps
// running, and a fresh Host re-attaches to the same PID without a duplicate.
func TestLoadBalancerOutlivesItsStarter(t *testing.T) {
	if testing.Short() {
		t.Skip("runs qcp-agent; not run with -short")
	}
	h := newHost(t)
	ca, err := certs.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.StopLB("ns", "c"); err != nil {
			t.Error(err)
		}
	})
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(caFile, ca.CertPEM, 0o600)
	addr := testkit.ReserveAddress(t) + ":6443"
	starter := exec.Command(os.Args[0], "-test.run=^$")
	starter.Env = append(os.Environ(), helperEnv+"=startlb", "HELPER_ROOT="+h.Root, "HELPER_CA="+caFile, "HELPER_AGENT="+h.AgentPath, "HELPER_ADDR="+addr)
	if out, err := starter.CombinedOutput(); err != nil {
		t.Fatalf("starter: %v\n%s", err, out)
	}
	st, err := h.LBStatus("ns", "c")
	if err != nil || !st.Running {
		t.Fatalf("load balancer not running after its starter exited: %+v %v", st, err)
	}
	if p, err := readProc(st.PID); err != nil || p.PPID == starter.Process.Pid {
		t.Errorf("load balancer %+v still a child of the exited starter (%v)", p, err)
	}
	fresh := &Host{Root: h.Root, BinDir: h.BinDir, AgentPath: h.AgentPath}
	if err := fresh.StartLB("ns", "c", addr, ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	again, _ := fresh.LBStatus("ns", "c")
	if again.PID != st.PID {
		t.Errorf("StartLB on a running balancer changed its PID from %d to %d", st.PID, again.PID)
	}
	if procs, _ := GroupProcesses(st.PID); len(procs) != 1 {
		t.Errorf("balancer group has %d processes, want 1: %v", len(procs), procs)
	}
}
