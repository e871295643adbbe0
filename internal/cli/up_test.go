package cli_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/scheme"
)

// TestUpAndDown runs `qcpctl up` as a newcomer would, checks the printed
// kubeconfig reaches a management cluster that serves CAPI's API and runs
// the qcp-manager built from this tree, then ends it the two ways the README
// names: `qcpctl down` from another terminal, and Ctrl-C. Either way every
// process up started must end.
func TestUpAndDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a management cluster; not run with -short")
	}
	bin := binDir(t)
	t.Run("qcpctl down", func(t *testing.T) {
		state := t.TempDir()
		up := startUp(t, bin, state)
		up.waitForSample(t)
		down := exec.Command(filepath.Join(bin, "qcpctl"), "down", "--dir", state)
		if out, err := down.CombinedOutput(); err != nil {
			t.Fatalf("qcpctl down: %v\n%s", err, out)
		}
		up.waitEnded(t)
	})
	t.Run("Ctrl-C", func(t *testing.T) {
		state := t.TempDir()
		up := startUp(t, bin, state, "--sample=false")
		// A terminal sends SIGINT to the foreground process group.
		if err := syscall.Kill(-up.cmd.Process.Pid, syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		up.waitEnded(t)
		if _, err := os.Stat(filepath.Join(state, "qcpctl.pid")); !os.IsNotExist(err) {
			t.Errorf("pid file left after Ctrl-C (%v): the next up would think one runs", err)
		}
	})
}

// binDir builds qcpctl, qcp-manager and qcp-agent from this tree into a
// directory that also links the pinned binaries, so that qcpctl, which runs
// $QCP_BIN_DIR/qcp-manager, never runs a stale one from bin/.
func binDir(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/qcpctl", "./cmd/qcp-manager", "./cmd/qcp-agent")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	for _, b := range [][2]string{{"etcd", binaries.EtcdVersion}, {"kube", binaries.KubeVersion}, {"capi-manager", binaries.CAPIVersion}} {
		path, err := binaries.Path(b[0], b[1])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(path, filepath.Join(bin, filepath.Base(path))); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// upProcess is a running `qcpctl up` and what it started.
type upProcess struct {
	cmd        *exec.Cmd
	state      string
	exited     chan error
	started    []machinehost.Proc
	lines      chan string
	kubeconfig string
}

// startUp runs `qcpctl up` in its own process group, waits for the
// kubeconfig it prints, checks the cluster through it, and records every
// process up started. Whatever survives the test is killed.
func startUp(t *testing.T, bin, state string, args ...string) *upProcess {
	t.Helper()
	up := &upProcess{cmd: exec.Command(filepath.Join(bin, "qcpctl"), append([]string{"up", "--dir", state}, args...)...), exited: make(chan error, 1), state: state}
	up.cmd.Env = append(os.Environ(), binaries.DirEnv+"="+bin)
	stdout, err := up.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	up.cmd.Stderr = os.Stderr
	up.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := up.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		up.exited <- up.cmd.Wait()
	}()
	t.Cleanup(up.killAll)

	var kubeconfig string
	timeout := time.After(3 * time.Minute)
	for kubeconfig == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("qcpctl up exited before it was up: %v", <-up.exited)
			}
			if k, found := strings.CutPrefix(strings.TrimSpace(line), "kubeconfig:"); found {
				kubeconfig = strings.TrimSpace(k)
			}
		case <-timeout:
			t.Fatal("qcpctl up did not print a kubeconfig within 3 minutes")
		}
	}
	up.lines, up.kubeconfig = lines, kubeconfig
	if up.started, err = machinehost.Descendants(up.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	checkUp(t, kubeconfig, bin, up.started)
	return up
}

// waitForSample waits for up to report the sample control plane Available,
// checks it through the management cluster, and adds the machines'
// processes to those that must end with up.
func (up *upProcess) waitForSample(t *testing.T) {
	t.Helper()
	timeout := time.After(8 * time.Minute)
	for done := false; !done; {
		select {
		case line, ok := <-up.lines:
			if !ok {
				t.Fatalf("qcpctl up exited before the sample was Available: %v", <-up.exited)
			}
			t.Log(line)
			if strings.Contains(line, "is not Available") || strings.Contains(line, "was not created") {
				t.Fatal(line)
			}
			done = strings.HasPrefix(line, "The sample control plane is Available")
		case <-timeout:
			t.Fatal("qcpctl up did not report the sample control plane Available within 8 minutes")
		}
	}
	c := managementClient(t, up.kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cp := &controlplanev1.QuorumControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "demo-control-plane"}, cp); err != nil {
		t.Fatal(err)
	}
	if !conditions.IsTrue(cp, controlplanev1.AvailableCondition) || len(cp.Status.Etcd.Members) != 3 {
		t.Errorf("sample control plane: Available %v, members %+v; want Available with 3", conditions.IsTrue(cp, controlplanev1.AvailableCondition), cp.Status.Etcd.Members)
	}
	var err error
	if up.started, err = machinehost.Descendants(up.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	machines, err := machinehost.ProcessesMatching(filepath.Join(up.state, "machines"))
	if err != nil {
		t.Fatal(err)
	}
	if len(machines) == 0 {
		t.Error("no machine process runs for the sample cluster")
	}
	up.started = append(up.started, machines...)
}

// checkUp lists CAPI Clusters through the printed kubeconfig and checks
// that up runs the qcp-manager of bin, next to etcd, kube-apiserver and CAPI
// core.
func checkUp(t *testing.T, kubeconfig, bin string, started []machinehost.Proc) {
	t.Helper()
	c := managementClient(t, kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.List(ctx, &clusterv1.ClusterList{}); err != nil {
		t.Fatalf("listing CAPI Clusters through the printed kubeconfig: %v", err)
	}
	if missing := localenv.MissingProcesses(started); len(missing) > 0 {
		t.Errorf("qcpctl up runs no %v: %v", missing, started)
	}
	for _, p := range started {
		if p.Comm != "qcp-manager" {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", p.PID)); err != nil || exe != filepath.Join(bin, "qcp-manager") {
			t.Errorf("qcp-manager runs from %q (%v), want the one built from this tree in %s", exe, err, bin)
		}
	}
}

func managementClient(t *testing.T, kubeconfig string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitEnded waits for up to exit cleanly and checks that nothing it started
// still runs.
func (up *upProcess) waitEnded(t *testing.T) {
	t.Helper()
	select {
	case err := <-up.exited:
		up.exited <- err
		if err != nil {
			t.Errorf("qcpctl up exited with %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("qcpctl up still runs")
	}
	left, err := machinehost.StillRunning(up.started)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range left {
		t.Errorf("%s (pid %d) still runs after qcpctl up ended", p.Comm, p.PID)
	}
}

// killAll kills qcpctl up and whatever it started that still runs, so that
// a failed test leaves no process behind.
func (up *upProcess) killAll() {
	_ = syscall.Kill(-up.cmd.Process.Pid, syscall.SIGKILL)
	left, _ := machinehost.StillRunning(up.started)
	for _, p := range left {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
}
