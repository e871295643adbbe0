package e2e

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/testkit"
)

const (
	ns      = "default"
	version = "v1.36.3"
)

// failureDomains are the ProcessCluster's domains in every scenario.
var failureDomains = []string{"fd-a", "fd-b", "fd-c"}

// scenario is one workload cluster on a management cluster, with the
// checks every scenario ends with.
type scenario struct {
	t    testing.TB
	mgmt *management
	c    client.Client
	name string

	traffic *traffic
	// writerPause is the pause between a writer worker's operations:
	// scenarioWriterPause unless a measurement needs finer resolution.
	writerPause time.Duration
	bound       *machineBound
	// selector selects the scenario's machines: the control plane's, or
	// an EtcdCluster's.
	selector client.MatchingLabels
	// quorumLost is set by a chaos run whose faults left etcd without
	// quorum for good: its writer's keys cannot be read back.
	quorumLost bool
	// recovery is set by a chaos run that lost a majority for QCP to
	// recover (from a survivor or a backup); lostWrites are then the
	// acknowledged writes the recovery gave up, counted rather than failed
	// on.
	recovery   bool
	lostWrites []string
	// releaseWriter releases the writer a loss run holds from its kill to
	// the end of the recovery.
	releaseWriter func()
	// writerReport and monitorReport are what stopTraffic last saw.
	writerReport  testkit.WriterReport
	monitorReport testkit.MonitorReport
}

// newScenario creates a Cluster named name with a ProcessCluster (three
// failure domains), a ProcessMachineTemplate and a QuorumControlPlane of
// replicas, changed by each of edits, and registers the end-of-scenario
// checks.
func newScenario(t testing.TB, mgmt *management, name string, replicas int32, edits ...func(*controlplanev1.QuorumControlPlane)) *scenario {
	t.Helper()
	return newScenarioIn(t, mgmt, name, replicas, failureDomains, edits...)
}

// newScenarioIn is newScenario with the ProcessCluster's failure domains.
func newScenarioIn(t testing.TB, mgmt *management, name string, replicas int32, domains []string, edits ...func(*controlplanev1.QuorumControlPlane)) *scenario {
	t.Helper()
	s, cp := newScenarioWithoutControlPlane(t, mgmt, name, replicas, domains, edits...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.create(ctx, cp)
	return s
}

// newScenarioWithoutControlPlane creates what newScenarioIn does but the
// QuorumControlPlane, which it returns for the caller to create.
func newScenarioWithoutControlPlane(t testing.TB, mgmt *management, name string, replicas int32, domains []string,
	edits ...func(*controlplanev1.QuorumControlPlane)) (*scenario, *controlplanev1.QuorumControlPlane) {
	t.Helper()
	cp := newControlPlane(name, replicas)
	for _, edit := range edits {
		edit(cp)
	}
	surge := 1
	if ptr.Deref(cp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge, 1) == 0 {
		surge = 0
	}
	s := beginScenario(t, mgmt, name, int(replicas), surge)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.create(ctx,
		&infrav1.ProcessCluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: infrav1.ProcessClusterSpec{FailureDomains: domains}},
		&infrav1.ProcessMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
		&clusterv1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: clusterv1.ClusterSpec{
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessCluster", Name: name,
				},
				ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: controlplanev1.GroupVersion.Group, Kind: "QuorumControlPlane", Name: name,
				},
			},
		},
	)
	return s, cp
}

// beginScenario is the scenario of the Cluster name, before anything of it
// exists: its machines watched against desired + surge, and its release
// and failure dump registered.
func beginScenario(t testing.TB, mgmt *management, name string, desired, surge int) *scenario {
	t.Helper()
	testkit.RequireBinaries(t, "etcd", "kube", "capi-manager")
	s := &scenario{t: t, mgmt: mgmt, c: mgmt.fenced(mgmt.env.Client), name: name,
		selector: client.MatchingLabels{clusterv1.ClusterNameLabel: name, clusterv1.MachineControlPlaneLabel: ""}}
	s.bound = startMachineBound(s, desired, surge)
	t.Cleanup(s.release)
	t.Cleanup(s.dumpOnFailure)
	return s
}

// release deletes the scenario's Cluster, and its EtcdCluster if it has
// one, once the scenario has ended, without waiting: the scenarios left
// after it then no longer share the CPU with its machines. (Every machine
// of every scenario ran to the end of the package before: 35 machines at
// the end of a fresh-clone run, with a load average of 66 on 2 cores.)
// A scenario that deleted them itself finds them gone.
func (s *scenario) release() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, obj := range []client.Object{
		&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}},
		&etcdv1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}},
	} {
		if err := s.c.Delete(ctx, obj); err != nil && !isNotFound(err) {
			s.t.Errorf("releasing scenario %s: deleting %T: %v", s.name, obj, err)
		}
	}
}

// newControlPlane is a scenario's QuorumControlPlane of replicas, on
// machines from the ProcessMachineTemplate named name.
func newControlPlane(name string, replicas int32) *controlplanev1.QuorumControlPlane {
	return &controlplanev1.QuorumControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: controlplanev1.QuorumControlPlaneSpec{
			Replicas: ptr.To(replicas), Version: version,
			MachineTemplate: controlplanev1.QuorumControlPlaneMachineTemplate{
				ObjectMeta: clusterv1.ObjectMeta{Labels: map[string]string{"e2e.qcp.dev/scenario": name}},
				Spec: controlplanev1.QuorumControlPlaneMachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachineTemplate", Name: name,
					},
				},
			},
		},
	}
}

func (s *scenario) create(ctx context.Context, objs ...client.Object) {
	s.t.Helper()
	for _, o := range objs {
		if err := s.c.Create(ctx, o); err != nil {
			s.t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
}

// eventuallyInterval is how often eventually checks its condition. The
// conditions read the management API server directly, uncached: checked
// every 250 ms, the reads of control planes and machines were 45 % of its
// requests in a run of TestCreateAndScale, and a scenario waits for
// changes that take seconds.
const eventuallyInterval = 500 * time.Millisecond

// eventually waits for cond, failing the scenario after timeout.
func (s *scenario) eventually(timeout time.Duration, what string, cond func(context.Context) error) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := testkit.Eventually(forWait(ctx), eventuallyInterval, what, cond); err != nil {
		s.t.Fatal(err)
	}
}

// holds checks cond every half second for d, failing the scenario the
// first time it does not hold: how a test shows that something does not
// happen.
func (s *scenario) holds(d time.Duration, what string, cond func(context.Context) error) {
	s.t.Helper()
	window := time.NewTimer(d)
	defer window.Stop()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		// Each check has a deadline of its own: one that started just
		// before the window closed must not fail for want of time (a
		// client's rate limiter refuses to wait past its context's end).
		ctx, cancel := context.WithTimeout(forWait(context.Background()), 30*time.Second)
		err := cond(ctx)
		cancel()
		if err != nil {
			s.t.Fatalf("%s: %v", what, err)
		}
		select {
		case <-window.C:
			return
		case <-t.C:
		}
	}
}

// controlPlane reads the QuorumControlPlane.
func (s *scenario) controlPlane(ctx context.Context) (*controlplanev1.QuorumControlPlane, error) {
	cp := &controlplanev1.QuorumControlPlane{}
	return cp, s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: s.name}, cp)
}

// machines lists the scenario's Machines, oldest first.
func (s *scenario) machines(ctx context.Context) ([]clusterv1.Machine, error) {
	var list clusterv1.MachineList
	if err := s.reader(ctx).List(ctx, &list, client.InNamespace(ns), s.selector); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b clusterv1.Machine) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	return list.Items, nil
}

// waitAvailable waits until the control plane is Available with replicas
// healthy voters, one per machine, no learner, and every machine Ready.
func (s *scenario) waitAvailable(timeout time.Duration, replicas int) *controlplanev1.QuorumControlPlane {
	s.t.Helper()
	var cp *controlplanev1.QuorumControlPlane
	s.eventually(timeout, fmt.Sprintf("control plane %s Available with %d healthy voters", s.name, replicas), s.available(replicas, &cp))
	return cp
}

// available is waitAvailable's check; it leaves the control plane it read
// in *cp.
func (s *scenario) available(replicas int, cp **controlplanev1.QuorumControlPlane) func(context.Context) error {
	return func(ctx context.Context) error {
		var err error
		if *cp, err = s.controlPlane(ctx); err != nil {
			return err
		}
		return availableWith(*cp, replicas)
	}
}

func availableWith(cp *controlplanev1.QuorumControlPlane, replicas int) error {
	if !conditions.IsTrue(cp, controlplanev1.AvailableCondition) {
		return fmt.Errorf("not Available: %s; last operation %s %s: %s", conditions.GetMessage(cp, controlplanev1.AvailableCondition),
			cp.Status.LastOperation.Kind, cp.Status.LastOperation.Target, cp.Status.LastOperation.Reason)
	}
	if got := ptr.Deref(cp.Status.Replicas, 0); got != int32(replicas) {
		return fmt.Errorf("%d machines, want %d; last operation %s: %s", got, replicas, cp.Status.LastOperation.Kind, cp.Status.LastOperation.Reason)
	}
	if got := ptr.Deref(cp.Status.ReadyReplicas, 0); got != int32(replicas) {
		return fmt.Errorf("%d machines Ready, want %d", got, replicas)
	}
	voters := 0
	for _, m := range cp.Status.Etcd.Members {
		if m.Role == controlplanev1.EtcdMemberRoleLearner || !m.Healthy || m.Machine == "" {
			return fmt.Errorf("member %+v is not a healthy voter on a machine", m)
		}
		voters++
	}
	if voters != replicas {
		return fmt.Errorf("%d voters, want %d", voters, replicas)
	}
	if !conditions.IsTrue(cp, controlplanev1.EtcdClusterHealthyCondition) || !conditions.IsTrue(cp, controlplanev1.ControlPlaneComponentsHealthyCondition) {
		return fmt.Errorf("etcd healthy: %s; components healthy: %s", conditions.GetMessage(cp, controlplanev1.EtcdClusterHealthyCondition),
			conditions.GetMessage(cp, controlplanev1.ControlPlaneComponentsHealthyCondition))
	}
	return nil
}

// scale sets spec.replicas through the scale subresource, as kubectl scale
// does.
func (s *scenario) scale(ctx context.Context, replicas int32) {
	s.t.Helper()
	s.scaleObject(ctx, &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}}, replicas)
}

// scaleObject sets obj's replicas through its scale subresource, and the
// machine bound's and the monitor's desired count with them.
func (s *scenario) scaleObject(ctx context.Context, obj client.Object, replicas int32) {
	s.t.Helper()
	s.bound.setDesired(int(replicas))
	if s.traffic != nil {
		s.traffic.monitor.SetDesired(int(replicas))
	}
	scale := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: replicas}}
	if err := s.c.SubResource("scale").Update(ctx, obj, client.WithSubResourceBody(scale)); err != nil {
		s.t.Fatalf("scaling %T %s to %d: %v", obj, obj.GetName(), replicas, err)
	}
}

// workload returns a client of the workload cluster built from the
// <cluster>-kubeconfig Secret QCP wrote.
func (s *scenario) workload(ctx context.Context) (*kubernetes.Clientset, error) {
	var sec corev1.Secret
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.Kubeconfig)}, &sec); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(sec.Data[secret.KubeconfigDataName])
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(cfg)
}

// etcdConfig is a client configuration for the workload etcd, with a
// certificate from the etcd CA QCP created and the machines' client URLs.
func (s *scenario) etcdConfig(ctx context.Context) (etcd.Config, error) {
	var sec corev1.Secret
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.EtcdCA)}, &sec); err != nil {
		return etcd.Config{}, err
	}
	ca, err := certs.ParseKeyPair(sec.Data[secret.TLSCrtDataName], sec.Data[secret.TLSKeyDataName])
	if err != nil {
		return etcd.Config{}, err
	}
	pair, err := certs.IssueEtcdClient(ca, "e2e", time.Now())
	if err != nil {
		return etcd.Config{}, err
	}
	machines, err := s.machines(ctx)
	if err != nil {
		return etcd.Config{}, err
	}
	var endpoints []string
	for _, m := range machines {
		if ip := internalIP(&m); ip != "" {
			endpoints = append(endpoints, "https://"+net.JoinHostPort(ip, "2379"))
		}
	}
	if len(endpoints) == 0 {
		return etcd.Config{}, errors.New("no machine has an address yet")
	}
	return etcd.Config{Endpoints: endpoints, CAPEM: ca.CertPEM, CertPEM: pair.CertPEM, KeyPEM: pair.KeyPEM}, nil
}

// etcdClient is a client of the workload etcd, with etcdConfig's
// configuration, which it returns too.
func (s *scenario) etcdClient(ctx context.Context) (*etcd.Client, etcd.Config, error) {
	cfg, err := s.etcdConfig(ctx)
	if err != nil {
		return nil, cfg, err
	}
	cli, err := etcd.New(cfg)
	return cli, cfg, err
}

// startTraffic starts the writer and the invariant monitor against the
// workload etcd, once a member answers.
func (s *scenario) startTraffic(desired int) {
	s.t.Helper()
	if err := s.startTrafficOr(desired, nil); err != nil {
		s.t.Fatal(err)
	}
}

// startTrafficOr is startTraffic, which returns why it started no traffic
// instead of failing the test. wrap, if given, wraps the wait's condition,
// with the wait's cancel, to end it early (untilDegradedFor).
func (s *scenario) startTrafficOr(desired int, wrap func(cancel context.CancelFunc, cond func(context.Context) error) func(context.Context) error) error {
	var cfg etcd.Config
	answering := func(ctx context.Context) error {
		var err error
		if cfg, err = s.etcdConfig(ctx); err != nil {
			return err
		}
		cli, err := etcd.New(cfg)
		if err != nil {
			return err
		}
		defer cli.Close()
		_, err = cli.Members(ctx)
		return err
	}
	// As long as waitAvailable allows: the machines are created meanwhile.
	ctx, cancel := context.WithTimeout(context.Background(), convergeTimeout)
	defer cancel()
	cond := answering
	if wrap != nil {
		cond = wrap(cancel, answering)
	}
	if err := testkit.Eventually(forWait(ctx), eventuallyInterval, "the workload etcd answering", cond); err != nil {
		return err
	}
	tr, err := startTraffic(cfg, desired, cmp.Or(s.writerPause, scenarioWriterPause))
	if err != nil {
		return err
	}
	s.traffic = tr
	return nil
}

// finish stops the traffic and checks what every scenario must end with:
// a linearizable history, no acknowledged write lost, no I1–I7 violation
// (no member removed while it led, either),
// never more than desired + 1 Machines (desired with maxSurge 0), and no
// private key leaked.
func (s *scenario) finish() {
	s.t.Helper()
	if s.traffic != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		_, mr := s.stopTraffic(ctx)
		cancel()
		s.checkI6(mr)
	}
	if err := s.bound.stop(); err != nil {
		s.t.Error(err)
	}
	s.checkTakenSteps()
	// A context of its own: reading back the writer's keys from an etcd
	// without quorum takes all of its time.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	testkit.CheckNoKeyLeaks(ctx, s.t, s.c, []string{s.mgmt.env.Dir}, []string{s.mgmt.machines()})
}

// checkTakenSteps fails the scenario if qcp-manager judged a step it took
// for the scenario's control plane or EtcdCluster to break a safety
// invariant (engine.Stepper.CheckTaken: I1–I9 on the state the step was
// planned on and the next one observed). A manager restarted since counts
// only its own steps.
func (s *scenario) checkTakenSteps() {
	s.t.Helper()
	if s.mgmt.manager == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, prefix := range []string{"qcp_controlplane", "qcp_etcdcluster"} {
		series := fmt.Sprintf(`%s_invariant_violations_total{name=%q,namespace=%q}`, prefix, s.name, ns)
		v, err := testkit.Metric(ctx, s.mgmt.manager.MetricsAddr, series)
		switch {
		case errors.Is(err, testkit.ErrNoSample):
		case err != nil:
			// A scenario may leave its manager stopped or killed.
			s.t.Logf("the steps qcp-manager took were not judged: reading %s: %v", series, err)
		case v > 0:
			s.t.Errorf("qcp-manager judged %v of the steps it took to break a safety invariant (%s; its InvariantViolated events and log say which)", v, series)
		}
	}
}

// checkI6 fails the scenario for each member removed while it led,
// without a leader transfer first.
func (s *scenario) checkI6(mr testkit.MonitorReport) {
	s.t.Helper()
	if len(mr.LeadersRemoved) > 0 {
		s.t.Errorf("I6: members removed while they led, without a leader transfer:\n%s", strings.Join(mr.LeadersRemoved, "\n"))
	}
}

// stopTraffic stops the writer and the monitor, logs what they saw, and
// fails the scenario on a history that is not linearizable, a lost write or
// a membership violation. Leaders removed while they led (I6) are the
// caller's to judge: finish fails on any, a measurement without leader
// transfer expects some.
func (s *scenario) stopTraffic(ctx context.Context) (testkit.WriterReport, testkit.MonitorReport) {
	s.t.Helper()
	wr, mr := s.traffic.stop(ctx)
	s.traffic = nil
	s.writerReport, s.monitorReport = wr, mr
	if s.quorumLost {
		// Without quorum no key can be read back: its write is neither
		// proven kept nor lost. A value read back that is not the last
		// acknowledged one still counts.
		var unreadable []string
		wr.LostWrites = slices.DeleteFunc(wr.LostWrites, func(l string) bool {
			if strings.HasSuffix(l, testkit.UnreadableFinal) {
				unreadable = append(unreadable, l)
				return true
			}
			return false
		})
		s.t.Logf("etcd lost quorum: %d keys could not be read back, their writes unverified", len(unreadable))
	}
	judged := wr
	if s.recovery && len(wr.LostWrites) > 0 {
		// A recovery gives up the acknowledged writes the survivor had not
		// applied, or those made after the snapshot it restored; a history
		// that lost one cannot be linearizable, so porcupine's verdict is
		// not judged then. With none lost, every check holds as in any
		// scenario.
		s.lostWrites = wr.LostWrites
		s.t.Logf("the recovery gave up %d acknowledged writes (porcupine: %s, not judged): %v",
			len(wr.LostWrites), wr.Linearizable, wr.LostWrites)
		judged.LostWrites, judged.Linearizable = nil, porcupine.Ok
	}
	s.t.Logf("writer: %s", wr)
	s.t.Logf("monitor: %d samples (%d unobserved), at most %d voters and %d learners", mr.Samples, mr.Unobserved, mr.MaxVoters, mr.MaxLearners)
	if len(mr.Gaps) > 0 {
		s.t.Logf("monitor: %d pairs of samples too far apart to compare:\n%s", len(mr.Gaps), strings.Join(mr.Gaps, "\n"))
	}
	if len(mr.LeadersGoneInGaps) > 0 {
		s.t.Logf("monitor: leaders gone across such a gap, not judged (I6 unknown):\n%s", strings.Join(mr.LeadersGoneInGaps, "\n"))
	}
	if err := judged.Err(); err != nil {
		s.t.Error(err)
	}
	if err := mr.Err(); err != nil {
		s.t.Error(err)
	}
	return wr, mr
}

// dumpOnFailure saves qcp-manager's log lines about a failed scenario to a
// file, and names it in the test log: printed there, they would bury the
// failure message, and a CI report that shows the end of a failed test's
// output would show them instead of why the test failed.
func (s *scenario) dumpOnFailure() {
	if !s.t.Failed() {
		return
	}
	data, _ := os.ReadFile(filepath.Join(s.mgmt.env.Dir, "qcp-manager.log"))
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		// Lines about this cluster, and whatever is not a structured log
		// line of another cluster: start-up errors, failpoints, panics.
		if strings.Contains(l, `"`+s.name+`"`) || strings.Contains(l, "/"+s.name) || !strings.HasPrefix(l, "{") ||
			strings.Contains(l, `"qcp-manager failed"`) {
			lines = append(lines, l)
		}
	}
	dir := cmp.Or(os.Getenv("QCP_BIN_DIR"), os.TempDir())
	path := filepath.Join(dir, "e2e-"+s.name+"-manager.log")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		s.t.Logf("saving qcp-manager's log lines about %s: %v", s.name, err)
		return
	}
	s.t.Logf("qcp-manager's %d log lines about %s are in %s; the failure is reported above", len(lines), s.name, path)
}

// traffic is the writer and the monitor of one workload etcd.
type traffic struct {
	writer  *testkit.Writer
	monitor *testkit.Monitor
	client  *etcd.Client
}

// convergeTimeout bounds a wait for a control plane or an EtcdCluster to
// reach its spec after a change: a minute or two on an idle machine, but a
// fresh-clone run on a loaded 2-core machine took over 5 minutes to create
// 3 machines.
const convergeTimeout = 10 * time.Minute

// scenarioWriterPause paces a scenario's writer: with 4 workers, about 15
// writes and 15 reads a second, several within every membership change,
// enough to find a lost write or a stale read there. A 20 ms pause made
// about 80 of each; etcd was then the largest user of CPU, and two
// scenarios side by side starved a 2-core machine. At 100 ms a 3-member
// cluster still spent 113 ms/s of etcd CPU on the writer, 65 at 250 ms
// (docs/measurements.md).
const scenarioWriterPause = 250 * time.Millisecond

func startTraffic(cfg etcd.Config, desired int, pause time.Duration) (*traffic, error) {
	w, err := testkit.StartWriter(cfg, testkit.WriterOptions{Pause: pause})
	if err != nil {
		return nil, err
	}
	mcfg := cfg
	mcfg.AutoSyncInterval = 500 * time.Millisecond
	cli, err := etcd.New(mcfg)
	if err != nil {
		return nil, err
	}
	tlsCfg, err := mcfg.TLSConfig()
	if err != nil {
		return nil, err
	}
	return &traffic{writer: w, client: cli, monitor: testkit.StartMonitor(cli, desired, 0, testkit.WithPromotionCounts(tlsCfg))}, nil
}

// follow points the writer and the monitor at endpoints.
func (tr *traffic) follow(endpoints []string) {
	tr.writer.SetEndpoints(endpoints...)
	tr.client.SetEndpoints(endpoints...)
}

func (tr *traffic) stop(ctx context.Context) (testkit.WriterReport, testkit.MonitorReport) {
	mr := tr.monitor.Stop()
	wr := tr.writer.Stop(ctx)
	_ = tr.client.Close()
	return wr, mr
}

// machineBound watches the control plane Machines (deleting ones included)
// and checks, after every change, that they never exceed desired + surge
// (1, or 0 for maxSurge 0). After a scale down the bound starts at the
// machines that exist and ratchets down as they go. A watch sees every
// state of the Machines, where polling would miss one that lived between
// two polls, and costs the management cluster nothing between changes.
type machineBound struct {
	mu         sync.Mutex
	desired    int
	surge      int
	bound      int
	violations []string
	cancel     context.CancelFunc
	done       chan struct{}
	samples    int
	// machines are the Machines as the watch last told them.
	machines map[string]*clusterv1.Machine
	// departed are the machines in the order they were first seen
	// deleting (or gone), and deletedAt their deletion timestamps (when
	// first seen gone, for one whose deletion the watch missed).
	departed  []string
	deletedAt map[string]time.Time
	// seen counts every machine ever sampled.
	seen map[string]bool
	// disruptions are, per start record of a disruption
	// (engine.DefragStartedAnnotation, engine.RestartStartedAnnotation),
	// the machines in the order the record appeared on them, and
	// maxDisrupted the most machines ever holding an open record at once.
	disruptions  map[string][]string
	maxDisrupted int
	// most is the most machines that ever existed at once.
	most int
	// open are the records ("<record> <machine>") open at the last sample.
	open map[string]bool
}

func startMachineBound(s *scenario, desired, surge int) *machineBound {
	s.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b := &machineBound{desired: desired, surge: surge, bound: desired + surge, cancel: cancel, done: make(chan struct{}),
		machines: map[string]*clusterv1.Machine{}, seen: map[string]bool{}, deletedAt: map[string]time.Time{}, disruptions: map[string][]string{}, open: map[string]bool{}}
	c, err := cache.New(s.mgmt.env.Config, cache.Options{
		Scheme:               s.mgmt.env.Scheme,
		DefaultNamespaces:    map[string]cache.Config{ns: {}},
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set(s.selector)),
	})
	if err != nil {
		cancel()
		s.t.Fatalf("watching the machines: %v", err)
	}
	informer, err := c.GetInformer(ctx, &clusterv1.Machine{})
	if err != nil {
		cancel()
		s.t.Fatalf("watching the machines: %v", err)
	}
	reg, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { b.observe(obj, false) },
		UpdateFunc: func(_, obj any) { b.observe(obj, false) },
		DeleteFunc: func(obj any) { b.observe(obj, true) },
	})
	if err != nil {
		cancel()
		s.t.Fatalf("watching the machines: %v", err)
	}
	go func() {
		defer close(b.done)
		if err := c.Start(ctx); err != nil {
			s.t.Errorf("watching the machines: %v", err)
		}
	}()
	// The first sample is the machines that exist now, none included.
	if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		s.t.Fatal("watching the machines: the first list never arrived")
	}
	b.mu.Lock()
	b.sampleLocked()
	b.mu.Unlock()
	return b
}

// observe takes one change the watch reported, and samples the result.
func (b *machineBound) observe(obj any, deleted bool) {
	if gone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = gone.Obj
	}
	m, ok := obj.(*clusterv1.Machine)
	if !ok {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if deleted {
		delete(b.machines, m.Name)
	} else {
		b.machines[m.Name] = m
		b.seen[m.Name] = true
	}
	if (deleted || !m.DeletionTimestamp.IsZero()) && !slices.Contains(b.departed, m.Name) {
		b.departed = append(b.departed, m.Name)
		// A machine gone without its deletion seen (the watch missed it,
		// or the object the informer last had predates it) has no
		// timestamp: it is stamped now.
		b.deletedAt[m.Name] = time.Now()
		if !m.DeletionTimestamp.IsZero() {
			b.deletedAt[m.Name] = m.DeletionTimestamp.Time
		}
	}
	b.sampleLocked()
}

// sampleLocked checks the machines as they are now; b.mu is held.
func (b *machineBound) sampleLocked() {
	b.samples++
	b.most = max(b.most, len(b.machines))
	if len(b.machines) > b.bound {
		names := slices.Sorted(maps.Keys(b.machines))
		b.violations = append(b.violations, fmt.Sprintf("%s: %d machines (%s) with desired %d, bound %d",
			time.Now().Format("15:04:05.000"), len(b.machines), strings.Join(names, " "), b.desired, b.bound))
	}
	b.bound = max(b.desired+b.surge, min(b.bound, len(b.machines)))
	disrupted := 0
	for name, m := range b.machines {
		open := false
		for _, record := range []string{engine.DefragStartedAnnotation, engine.RestartStartedAnnotation} {
			_, ok := m.Annotations[record]
			if key := record + " " + name; ok && !b.open[key] {
				b.disruptions[record] = append(b.disruptions[record], name)
				b.open[key] = true
			} else if !ok {
				delete(b.open, key)
			}
			open = open || ok
		}
		if open {
			disrupted++
		}
	}
	b.maxDisrupted = max(b.maxDisrupted, disrupted)
}

// defragmentations returns the machines in the order their member's
// defragmentation began, and the most machines ever disrupted (busy
// defragmenting or restarting) at once.
func (b *machineBound) defragmentations() ([]string, int) {
	return b.disruptionsOf(engine.DefragStartedAnnotation)
}

// restarts is defragmentations for restarts in place.
func (b *machineBound) restarts() ([]string, int) {
	return b.disruptionsOf(engine.RestartStartedAnnotation)
}

// disruptionsOf returns the machines in the order record appeared on them,
// and the most machines ever disrupted at once.
func (b *machineBound) disruptionsOf(record string) ([]string, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.disruptions[record]), b.maxDisrupted
}

// departures returns the machines seen leaving so far, in order.
// firstDeletion is the earliest deletion timestamp of a machine deleted
// at or after since (whole seconds, as the API server stamps them).
func (b *machineBound) firstDeletion(since time.Time) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var first time.Time
	for _, at := range b.deletedAt {
		if !at.Before(since.Truncate(time.Second)) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first, !first.IsZero()
}

func (b *machineBound) departures() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.departed)
}

// mostAtOnce is the most machines that existed at once so far.
func (b *machineBound) mostAtOnce() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.most
}

// machinesSeen is how many machines have existed so far.
func (b *machineBound) machinesSeen() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seen)
}

func (b *machineBound) setDesired(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.desired = n
	b.bound = max(b.bound, n+b.surge)
}

// setSurge changes how many machines beyond desired may exist, as a
// change of rollout strategy does.
func (b *machineBound) setSurge(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.surge = n
	b.bound = max(b.bound, b.desired+n)
}

func (b *machineBound) stop() error {
	b.cancel()
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.samples == 0 {
		return errors.New("the machine count was never sampled")
	}
	if len(b.violations) > 0 {
		return fmt.Errorf("more than desired + %d machines:\n%s", b.surge, strings.Join(b.violations, "\n"))
	}
	return nil
}

// internalIP is machine's first internal address, "" before it has one.
func internalIP(m *clusterv1.Machine) string {
	for _, a := range m.Status.Addresses {
		if a.Type == clusterv1.MachineInternalIP {
			return a.Address
		}
	}
	return ""
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
