package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/cli"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/release"
	"github.com/qcp-dev/qcp/internal/scheme"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestNewcomerTour is issue 10's tour, as a newcomer types it: qcpctl up on
// a fresh state directory returns once the sample control plane is
// Available; the workload cluster has 3 Ready nodes; up again changes
// nothing; a killed voter is replaced; describe shows etcd roles, the
// learner and what the control plane waits for in the middle of a 3 -> 5
// scale-up; and down leaves no process and no file.
func TestNewcomerTour(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a management cluster and machines; not run with -short")
	}
	q := &tour{t: t, bin: binDir(t), state: filepath.Join(t.TempDir(), "state")}
	t.Cleanup(q.killAll)

	// Clear of the default range, which a newcomer's make up uses.
	out := q.must(12*time.Minute, "up", "--address-range", "127.25.0.0/16")
	mgmt := filepath.Join(q.state, "kubeconfig")
	for _, want := range []string{"export KUBECONFIG=" + mgmt, "The sample control plane is Available", "qcpctl kubeconfig demo", "The first backup is verified"} {
		if !strings.Contains(out, want) {
			t.Errorf("qcpctl up printed no %q:\n%s", want, out)
		}
	}
	serve := q.servePID()
	checkUp(t, mgmt, q.bin, q.processes(serve))
	// The sample backs up to the management cluster's own object store,
	// which qcpctl down stops with the rest (checked below).
	if !slices.ContainsFunc(q.processes(serve), func(p machinehost.Proc) bool { return strings.HasPrefix(p.Comm, "versitygw") }) {
		t.Errorf("qcpctl up runs no object store: %v", q.processes(serve))
	}
	checkInstalledByClusterctl(t, mgmt)
	workload := filepath.Join(t.TempDir(), "demo.kubeconfig")
	q.must(time.Minute, "kubeconfig", "demo", "-o", workload)
	if fi, err := os.Stat(workload); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("workload kubeconfig %s: %v, mode %v; want 0600, it holds admin credentials", workload, err, fi.Mode())
	}
	waitForReadyNodes(t, workload, 3)
	checkClusterctlDescribe(t, mgmt)

	if out := q.must(time.Minute, "up"); !strings.Contains(out, "already up") || q.servePID() != serve {
		t.Errorf("a second qcpctl up (serve pid now %d, was %d) printed:\n%s", q.servePID(), serve, out)
	}

	victim := ""
	for _, m := range q.describe().ControlPlane.Machines {
		if m.EtcdRole == "voter" {
			victim = m.Name
		}
	}
	if victim == "" {
		t.Fatalf("no voter to kill in %+v", q.describe().ControlPlane.Machines)
	}
	q.must(time.Minute, "machine", "kill", victim)
	q.waitForVoters(3, victim)
	q.checkRecoverLevers(mgmt)

	q.checkScaleUpDescribed()

	started := q.processes(serve)
	q.must(3*time.Minute, "down")
	left, err := machinehost.StillRunning(started)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range left {
		t.Errorf("%s (pid %d) still runs after qcpctl down", p.Comm, p.PID)
	}
	if _, err := os.Stat(q.state); !os.IsNotExist(err) {
		t.Errorf("state directory %s still there after qcpctl down (%v)", q.state, err)
	}
	if out := q.must(time.Minute, "down"); !strings.Contains(out, "nothing to do") {
		t.Errorf("a second qcpctl down printed %q", out)
	}
}

// checkRecoverLevers asks for a recovery while etcd has quorum, which QCP
// drops instead of keeping it for a later loss, and confirms a machine
// lost, which only marks it.
func (q *tour) checkRecoverLevers(kubeconfig string) {
	t := q.t
	c := managementClient(t, kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := q.command(ctx, "recover", "demo", "--from", "elsewhere").CombinedOutput(); err == nil || !strings.Contains(string(out), "--from survivor or --from backup") {
		t.Errorf("qcpctl recover --from elsewhere: %v, %s; want a refusal naming the sources", err, out)
	}
	q.must(time.Minute, "recover", "demo", "--from", "backup")
	if err := testkit.Eventually(ctx, time.Second, "the recovery asked for while etcd has quorum dropped", func(ctx context.Context) error {
		var list controlplanev1.QuorumControlPlaneList
		if err := c.List(ctx, &list); err != nil {
			return err
		}
		for _, cp := range list.Items {
			if _, ok := cp.Annotations[controlplanev1.RecoverAnnotation]; ok {
				return fmt.Errorf("%s still carries %s", cp.Name, controlplanev1.RecoverAnnotation)
			}
			if cp.Status.Recovery != nil {
				t.Errorf("%s recovered etcd that had quorum: %+v", cp.Name, cp.Status.Recovery)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	machine := q.describe().ControlPlane.Machines[0].Name
	q.must(time.Minute, "machine", "confirm-lost", machine)
	var m clusterv1.Machine
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: machine}, &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Annotations[quorum.ConfirmedLostAnnotation]; !ok {
		t.Errorf("qcpctl machine confirm-lost %s did not annotate it: %v", machine, m.Annotations)
	}
}

// checkScaleUpDescribed scales the sample to 5 with two describe --watch
// running, plain and JSON, and checks that their frames show each
// machine's etcd role, the learner and the control plane's waiting reason.
// A learner is promoted within a second or two, which a watch on a loaded
// host can miss between two frames, so the first new machine is frozen as
// soon as it runs: QCP adds it as a learner and waits for it to start,
// and it is thawed once both watches have shown that.
func (q *tour) checkScaleUpDescribed() {
	t := q.t
	plain, js := q.start("describe", "cluster", "demo", "--watch", "--interval", "200ms"),
		q.start("describe", "cluster", "demo", "--watch", "--interval", "200ms", "-o", "json")
	before := map[string]bool{}
	for _, m := range q.describe().ControlPlane.Machines {
		before[m.Name] = true
	}
	q.must(time.Minute, "scale", "demo", "--replicas", "5")
	held := q.freezeFirstNew(before)
	seen := func(out string) (learner, waiting bool) {
		for _, frame := range strings.Split(out, "\n\n") {
			for _, line := range strings.Split(frame, "\n") {
				learner = learner || strings.Contains(line, "Machine/"+held) && slices.Contains(strings.Fields(line), "learner")
				waiting = waiting || strings.Contains(line, "Waiting for: ")
			}
		}
		return learner, waiting
	}
	seenJSON := func(out string) (learner, waiting bool, err error) {
		for dec := json.NewDecoder(strings.NewReader(out)); dec.More(); {
			var tree cli.ClusterTree
			if err := dec.Decode(&tree); err != nil {
				return false, false, fmt.Errorf("describe -o json --watch wrote a frame that is not JSON: %w", err)
			}
			for _, m := range tree.ControlPlane.Machines {
				learner = learner || m.Name == held && m.EtcdRole == "learner"
			}
			op := tree.ControlPlane.Operation
			waiting = waiting || op != nil && op.Kind == "Wait" && !strings.HasPrefix(op.Reason, "nothing to do")
		}
		return learner, waiting, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := testkit.Eventually(ctx, 200*time.Millisecond, "both watches to show "+held+" as a learner and what the control plane waits for", func(context.Context) error {
		l, w := seen(plain.output())
		jl, jw, err := seenJSON(js.output())
		if err != nil || !l || !w || !jl || !jw {
			return fmt.Errorf("plain: learner %v, waiting %v; JSON: learner %v, waiting %v (%v)", l, w, jl, jw, err)
		}
		return nil
	})
	q.must(time.Minute, "machine", "thaw", held)
	if err != nil {
		t.Error(err)
	}
	q.waitForVoters(5, "")
	frames := strings.Split(plain.stop(), "\n\n")
	t.Logf("describe --watch: %d frames, the last:\n%s", len(frames), frames[len(frames)-1])
	if _, _, err := seenJSON(js.stop()); err != nil {
		t.Error(err)
	}
	// The watch may stop before its frame of the end; ask once more.
	tree := q.describe()
	roles := map[string]int{}
	for _, m := range tree.ControlPlane.Machines {
		roles[m.EtcdRole]++
	}
	if roles["leader"] != 1 || roles["voter"] != 4 {
		t.Errorf("after the scale-up describe -o json shows roles %v; want 1 leader and 4 voters", roles)
	}
	checkAtAGlance(t, filepath.Join(q.state, "kubeconfig"), tree)
}

// checkAtAGlance checks that what kubectl shows without describe agrees
// with it: each Machine's etcd role label, and the control plane's Leader
// printer column, read as the Table kubectl get prints.
func checkAtAGlance(t *testing.T, kubeconfig string, tree cli.ClusterTree) {
	t.Helper()
	c := managementClient(t, kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader := ""
	for _, row := range tree.ControlPlane.Machines {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: row.Name}, m); err != nil {
			t.Fatal(err)
		}
		if got := m.Labels[engine.EtcdRoleLabel]; got != row.EtcdRole {
			t.Errorf("machine %s: label %s=%q, describe says %q", m.Name, engine.EtcdRoleLabel, got, row.EtcdRole)
		}
		if row.EtcdRole == "leader" {
			leader = row.Name
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		cfg.Host+"/apis/controlplane.cluster.x-k8s.io/v1alpha1/namespaces/default/quorumcontrolplanes/"+tree.ControlPlane.Name, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	table := &metav1.Table{}
	if err := json.NewDecoder(resp.Body).Decode(table); err != nil || len(table.Rows) != 1 {
		t.Fatalf("kubectl get qcp's table: %v, %d rows", err, len(table.Rows))
	}
	for i, col := range table.ColumnDefinitions {
		if col.Name != "Leader" {
			continue
		}
		if table.Rows[0].Cells[i] != leader {
			t.Errorf("kubectl get qcp shows Leader %v, describe says %q", table.Rows[0].Cells[i], leader)
		}
		return
	}
	t.Errorf("kubectl get qcp has no Leader column: %+v", table.ColumnDefinitions)
}

// tour runs qcpctl as a newcomer does, with its state in one directory.
type tour struct {
	t          *testing.T
	bin, state string
}

func (q *tour) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(q.bin, "qcpctl"), args...)
	// The state directory comes from the environment, as cli.StateDirEnv
	// promises; KUBECONFIG would override the management cluster.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "KUBECONFIG=") })
	cmd.Env = append(cmd.Env, binaries.DirEnv+"="+q.bin, cli.StateDirEnv+"="+q.state)
	return cmd
}

// must runs qcpctl to completion and returns its output; a failure or
// timeout fails the test.
func (q *tour) must(timeout time.Duration, args ...string) string {
	q.t.Helper()
	out := q.quiet(timeout, args...)
	q.t.Logf("qcpctl %s:\n%s", strings.Join(args, " "), out)
	return out
}

// quiet is must without logging the output.
func (q *tour) quiet(timeout time.Duration, args ...string) string {
	q.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := q.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		q.t.Fatalf("qcpctl %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// background is a qcpctl command left running.
type background struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	out    testkit.SyncBuffer
}

func (q *tour) start(args ...string) *background {
	ctx, cancel := context.WithCancel(context.Background())
	b := &background{cancel: cancel}
	b.cmd = q.command(ctx, args...)
	// Interrupted, describe --watch finishes the frame it writes.
	b.cmd.Cancel = func() error { return b.cmd.Process.Signal(os.Interrupt) }
	b.cmd.WaitDelay = 10 * time.Second
	b.cmd.Stdout, b.cmd.Stderr = &b.out, os.Stderr
	if err := b.cmd.Start(); err != nil {
		q.t.Fatal(err)
	}
	q.t.Cleanup(cancel)
	return b
}

func (b *background) stop() string {
	b.cancel()
	_ = b.cmd.Wait()
	return b.out.String()
}

// output is what the command wrote so far.
func (b *background) output() string { return b.out.String() }

// freezeFirstNew waits for the first control plane machine not in before
// to run (its Machine's infrastructure provisioned) and freezes it with
// qcpctl machine freeze, before it could have started etcd as a learner
// and caught up; it returns the machine's name.
func (q *tour) freezeFirstNew(before map[string]bool) string {
	q.t.Helper()
	c := managementClient(q.t, filepath.Join(q.state, "kubeconfig"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	name := ""
	if err := testkit.Eventually(ctx, 100*time.Millisecond, "a new machine of the scale-up to run", func(ctx context.Context) error {
		var list clusterv1.MachineList
		if err := c.List(ctx, &list, client.InNamespace("default"), client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
			return err
		}
		for _, m := range list.Items {
			if !before[m.Name] && ptr.Deref(m.Status.Initialization.InfrastructureProvisioned, false) {
				name = m.Name
				return nil
			}
		}
		return fmt.Errorf("%d machines, none new and running", len(list.Items))
	}); err != nil {
		q.t.Fatal(err)
	}
	q.must(time.Minute, "machine", "freeze", name)
	return name
}

func (q *tour) describe() cli.ClusterTree {
	q.t.Helper()
	var tree cli.ClusterTree
	if err := json.Unmarshal([]byte(q.quiet(time.Minute, "describe", "cluster", "demo", "-o", "json")), &tree); err != nil {
		q.t.Fatalf("describe -o json: %v", err)
	}
	if tree.ControlPlane == nil {
		q.t.Fatalf("describe -o json shows no control plane: %+v", tree)
	}
	return tree
}

// waitForVoters waits, through describe, for n machines that are healthy
// voters (one the leader), none of them gone, and the control plane
// Available.
func (q *tour) waitForVoters(n int, gone string) {
	q.t.Helper()
	deadline := time.Now().Add(10 * time.Minute)
	why := ""
	for time.Now().Before(deadline) {
		tree := q.describe()
		if why = votersMissing(tree, n, gone); why == "" {
			return
		}
		time.Sleep(time.Second)
	}
	q.t.Fatalf("not %d healthy voters without %q within 10 minutes: %s", n, gone, why)
}

func votersMissing(tree cli.ClusterTree, n int, gone string) string {
	cp := tree.ControlPlane
	if cp.Status != metav1.ConditionTrue {
		return fmt.Sprintf("control plane Available is %s (%s)", cp.Status, cp.Message)
	}
	voters := 0
	for _, m := range cp.Machines {
		switch {
		case m.Name == gone:
			return m.Name + " is still there"
		case (m.EtcdRole == "leader" || m.EtcdRole == "voter") && m.MemberHealthy != nil && *m.MemberHealthy:
			voters++
		}
	}
	if voters != n || len(cp.Machines) != n {
		return fmt.Sprintf("%d machines, %d healthy voters", len(cp.Machines), voters)
	}
	return ""
}

func (q *tour) servePID() int {
	q.t.Helper()
	data, err := os.ReadFile(filepath.Join(q.state, "qcpctl.pid"))
	if err != nil {
		q.t.Fatalf("no qcpctl serve pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		q.t.Fatal(err)
	}
	return pid
}

// processes lists what up started: serve, its children, and the machines
// (which outlive their manager by design).
func (q *tour) processes(serve int) []machinehost.Proc {
	q.t.Helper()
	procs, err := machinehost.Descendants(serve)
	if err != nil {
		q.t.Fatal(err)
	}
	machines, err := machinehost.ProcessesMatching(q.state)
	if err != nil {
		q.t.Fatal(err)
	}
	return append(procs, machines...)
}

// killAll ends whatever a failed tour left running.
func (q *tour) killAll() {
	if _, err := os.Stat(filepath.Join(q.state, "qcpctl.pid")); err != nil {
		return
	}
	data, _ := os.ReadFile(filepath.Join(q.state, "qcpctl.pid"))
	if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
		procs, _ := machinehost.Descendants(pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for _, p := range procs {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	machines, _ := machinehost.ProcessesMatching(q.state)
	for _, p := range machines {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
}

// waitForReadyNodes waits until the workload cluster has n Ready Nodes.
func waitForReadyNodes(t *testing.T, kubeconfig string, n int) {
	t.Helper()
	c := managementClient(t, kubeconfig)
	deadline := time.Now().Add(3 * time.Minute)
	got := ""
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		nodes := &corev1.NodeList{}
		err := c.List(ctx, nodes)
		cancel()
		ready := 0
		for _, node := range nodes.Items {
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if err == nil && ready == n && len(nodes.Items) == n {
			return
		}
		got = fmt.Sprintf("%d of %d nodes Ready (%v)", ready, len(nodes.Items), err)
		time.Sleep(time.Second)
	}
	t.Fatalf("the workload cluster never had %d Ready nodes: %s", n, got)
}

// binDir builds qcpctl, qcp-manager and qcp-agent from this tree into a
// directory that also links the pinned binaries, so that qcpctl, which runs
// $QCP_BIN_DIR/qcp-manager, never runs a stale one from bin/.
func binDir(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	if err := testkit.BuildQCP(bin, "qcpctl", "qcp-manager", "qcp-agent"); err != nil {
		t.Fatal(err)
	}
	for _, b := range [][2]string{{"etcd", binaries.EtcdVersion}, {"kube", binaries.KubeVersion}, {"capi-manager", binaries.CAPIVersion}, {"cabpk-manager", binaries.CAPIVersion}, {"clusterctl", binaries.CAPIVersion}, {"versitygw", binaries.ObjectStoreVersion}} {
		path, err := binaries.Path(b[0], b[1])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(path, filepath.Join(bin, filepath.Base(path))); err != nil {
			t.Fatal(err)
		}
	}
	// The release up installs from by default: out/ beside bin/, as `make
	// release` writes it.
	if _, err := release.Write("../..", filepath.Join(filepath.Dir(bin), "out"), "v0.1.0"); err != nil {
		t.Fatal(err)
	}
	return bin
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

// checkInstalledByClusterctl checks that the management cluster is what
// `clusterctl init` makes of the release: its inventory lists the four
// providers clusterctl installed (kubeadm's bootstrap provider comes with
// core), QCP's CRDs carry clusterctl's labels (what `clusterctl move`
// discovers types by), and every webhook configuration the API server calls
// is one clusterctl installed, none the environment's own.
func checkInstalledByClusterctl(t *testing.T, kubeconfig string) {
	t.Helper()
	c := managementClient(t, kubeconfig)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var providers clusterctlv1.ProviderList
	if err := c.List(ctx, &providers); err != nil {
		t.Fatalf("listing clusterctl's provider inventory: %v", err)
	}
	var got []string
	for _, p := range providers.Items {
		got = append(got, fmt.Sprintf("%s %s %s %s", p.Namespace, p.Type, p.ProviderName, p.Version))
	}
	slices.Sort(got)
	want := []string{
		"capi-kubeadm-bootstrap-system BootstrapProvider kubeadm " + binaries.CAPIVersion,
		"capi-system CoreProvider cluster-api " + binaries.CAPIVersion,
		"qcp-control-plane-system ControlPlaneProvider qcp v0.1.0",
		"qcp-infrastructure-process-system InfrastructureProvider process v0.1.0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("providers installed: %q, want %q", got, want)
	}
	for _, name := range []string{"quorumcontrolplanes.controlplane.cluster.x-k8s.io", "etcdclusters.etcd.cluster.x-k8s.io",
		"processmachines.infrastructure.cluster.x-k8s.io", "clusters.cluster.x-k8s.io"} {
		var crd metav1.PartialObjectMetadata
		crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
			t.Errorf("CRD %s: %v", name, err)
		} else if _, ok := crd.Labels[clusterctlv1.ClusterctlLabel]; !ok {
			t.Errorf("CRD %s has no %s label: clusterctl did not install it", name, clusterctlv1.ClusterctlLabel)
		}
	}
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		var list metav1.PartialObjectMetadataList
		list.SetGroupVersionKind(admissionregistrationv1.SchemeGroupVersion.WithKind(kind + "List"))
		if err := c.List(ctx, &list); err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 0 {
			t.Errorf("no %s installed", kind)
		}
		for _, cfg := range list.Items {
			if _, ok := cfg.Labels[clusterctlv1.ClusterctlLabel]; !ok {
				t.Errorf("%s %s was not installed by clusterctl", kind, cfg.Name)
			}
		}
	}
}

// checkClusterctlDescribe checks that the real `clusterctl describe cluster
// demo` shows the QuorumControlPlane Available.
func checkClusterctlDescribe(t *testing.T, kubeconfig string) {
	t.Helper()
	out := string(testkit.Clusterctl(t, nil, "describe", "cluster", "demo", "--kubeconfig", kubeconfig))
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "QuorumControlPlane default/demo-control-plane") {
			if f := strings.Fields(line); !slices.Contains(f, "True") || !slices.Contains(f, "Available") {
				t.Errorf("clusterctl describe shows the control plane not Available: %q", line)
			}
			return
		}
	}
	t.Errorf("clusterctl describe cluster demo shows no QuorumControlPlane:\n%s", out)
}

func managementClient(t *testing.T, kubeconfig string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	s := scheme.New()
	if err := clusterctlv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
