package cli_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/scheme"
)

// TestUpAndDown runs `qcpctl up` as a newcomer would, checks the printed
// kubeconfig reaches a management cluster that serves CAPI's API, then
// `qcpctl down` ends it and everything it started.
func TestUpAndDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a management cluster; not run with -short")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/qcpctl", "./cmd/qcp-manager", "./cmd/qcp-agent")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	state := t.TempDir()
	up := exec.Command(filepath.Join(bin, "qcpctl"), "up", "--dir", state)
	up.Env = os.Environ()
	stdout, err := up.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	up.Stderr = os.Stderr
	up.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- up.Wait()
	}()
	t.Cleanup(func() { _ = up.Process.Kill() })

	var kubeconfig string
	timeout := time.After(3 * time.Minute)
	for kubeconfig == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("qcpctl up exited before it was up: %v", <-exited)
			}
			if k, found := strings.CutPrefix(strings.TrimSpace(line), "kubeconfig:"); found {
				kubeconfig = strings.TrimSpace(k)
			}
		case <-timeout:
			t.Fatal("qcpctl up did not print a kubeconfig within 3 minutes")
		}
	}
	go func() {
		for range lines { //nolint:revive // drain so qcpctl never blocks on stdout
		}
	}()

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.List(ctx, &clusterv1.ClusterList{}); err != nil {
		t.Fatalf("listing CAPI Clusters through the printed kubeconfig: %v", err)
	}
	managerPID := pidOf(t, "qcp-manager --kubeconfig="+kubeconfig)

	down := exec.Command(filepath.Join(bin, "qcpctl"), "down", "--dir", state)
	if out, err := down.CombinedOutput(); err != nil {
		t.Fatalf("qcpctl down: %v\n%s", err, out)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("qcpctl up exited with %v after down", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("qcpctl up still runs after qcpctl down")
	}
	if managerPID != 0 && syscall.Kill(managerPID, 0) == nil {
		t.Errorf("qcp-manager (pid %d) still runs after down", managerPID)
	}
}

// pidOf returns the PID of the process whose command line contains s.
func pidOf(t *testing.T, s string) int {
	t.Helper()
	procs, err := machinehost.ProcessesMatching(s)
	if err != nil || len(procs) == 0 {
		t.Errorf("no process runs %q (%v)", s, err)
		return 0
	}
	return procs[0].PID
}
