package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/objectstore"
	"github.com/qcp-dev/qcp/internal/testkit"
	"github.com/qcp-dev/qcp/test/chaos"
)

// convergeBound is how long a run may take to reach its desired spec once
// its faults have stopped.
const convergeBound = 10 * time.Minute

// chaosAddressRange is the chaos smoke's own: it runs on its own
// management cluster, because it kills qcp-manager, CAPI core and the
// management API server, whose machines are network hosts of their own on
// this range, so that CutPeerTraffic can cut one off from its peers.
const chaosAddressRange = "198.18.26.0/24"

// TestChaosSmoke runs the campaign's harness on the fixed chaos.SmokeSeeds, so
// that every `make test` exercises it; `make chaos` runs the long
// campaign (TestChaos, built with -tags chaos).
func TestChaosSmoke(t *testing.T) {
	requireShared(t)
	parallel(t, 4*time.Minute+30*time.Second) // beside the others, as TestCrashesAndRotation
	mgmt := ownNetworkedManagement(t, chaosAddressRange, nil)
	t.Run("the leftover check finds leftovers", func(t *testing.T) { checkLeftoverCheck(t, mgmt) })
	campaign(t, mgmt, chaos.SmokeSeeds, nil, time.Time{})
}

// checkLeftoverCheck plants, in mgmt's machine root, what a machine gone
// wrong would leave (its directory, a process of its, its address, and on
// a network of namespaces its namespace) and checks leftBehind reports
// each, then that it reports nothing once they are gone.
func checkLeftoverCheck(t *testing.T, mgmt *management) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := mgmt.env.MachineRoot()
	dir, addr := filepath.Join(root, ns, "gone"), filepath.Join(root, ".addresses", "198.18.26.254")
	if err := errors.Join(os.MkdirAll(dir, 0o700), os.MkdirAll(filepath.Dir(addr), 0o700)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(addr, []byte("machine/"+ns+"/gone"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A shell whose command line names a path in the directory, in a
	// process group of its own, as a machine's processes are.
	stray := exec.Command("sh", "-c", "sleep 600; :", filepath.Join(dir, "etcd"))
	stray.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := stray.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-stray.Process.Pid, syscall.SIGKILL); _ = stray.Wait() })
	wants := []string{"the directory of machine gone", fmt.Sprintf("process %d (sh) of machine gone", stray.Process.Pid), "address 198.18.26.254 reserved for machine/" + ns + "/gone"}
	netns, hostIf := machinehost.NamespaceOf("machine/" + ns + "/gone")
	if mgmt.network != nil {
		if err := errors.Join(mgmt.network.Ensure(), mgmt.network.Attach(netns, hostIf, netip.MustParseAddr("198.18.26.254"))); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mgmt.network.Detach(netns, hostIf) })
		wants = append(wants, "network namespace link "+hostIf)
	}
	err := mgmt.leftBehind(ctx)
	for _, want := range wants {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("leftBehind = %v, want it to report %q", err, want)
		}
	}
	_ = syscall.Kill(-stray.Process.Pid, syscall.SIGKILL)
	_ = stray.Wait()
	if err := errors.Join(os.RemoveAll(dir), os.Remove(addr)); err != nil {
		t.Fatal(err)
	}
	if mgmt.network != nil {
		if err := mgmt.network.Detach(netns, hostIf); err != nil {
			t.Fatal(err)
		}
	}
	if err := mgmt.leftBehind(ctx); err != nil {
		t.Errorf("with the planted leftovers removed: %v", err)
	}
}

// campaign carries out runs from seeds one after another on mgmt, each as
// a subtest, logs their summary and returns their outcomes; with out, it
// writes each outcome there as a JSON line. With a non-zero until, it
// starts no run after that time, so that a timed campaign ends between
// runs rather than in the middle of one.
func campaign(t *testing.T, mgmt *management, seeds []uint64, out io.Writer, until time.Time) []chaos.Outcome {
	t.Helper()
	var outcomes []chaos.Outcome
	campaignCommit() // as the campaign begins
	for i, seed := range seeds {
		if !until.IsZero() && time.Now().After(until) {
			t.Logf("the campaign's time is up: seeds %v not run", seeds[i:])
			break
		}
		r := chaos.NewRun(seed)
		o := chaos.Outcome{Run: r, Record: chaos.Record{Commit: campaignCommit()}} // what a run that fails early records
		ok := t.Run(fmt.Sprintf("seed=%d", r.Seed), func(t *testing.T) { o = runChaos(t, mgmt, r) })
		if !ok && len(o.Violations) == 0 {
			o.Violations = append(o.Violations, "the run failed; see its test log")
		}
		outcomes = append(outcomes, o)
		t.Log(o.JSONLine())
		if out != nil {
			fmt.Fprintln(out, o.JSONLine())
		}
	}
	t.Logf("\n%s", chaos.Summarize(outcomes).Table())
	return outcomes
}

// runChaos carries out one run: a control plane (or an EtcdCluster) of
// r.Replicas (r.Desired for a create) with writes going on, r's
// operation, r's faults at their times, then convergence within
// convergeBound and the checks every scenario ends with.
func runChaos(t *testing.T, mgmt *management, r chaos.Run) chaos.Outcome {
	o := chaos.Outcome{Run: r}
	t.Logf("run %+v", r)
	start := r.Replicas
	if r.Operation.Creates() {
		start = r.Desired
	}
	s, target := newChaosScenario(t, mgmt, r, start)
	t.Cleanup(s.deleteCluster)
	if !r.Operation.Creates() {
		s.startTraffic(start)
		s.eventually(convergeTimeout, fmt.Sprintf("%s ready with %d healthy voters", s.name, start), s.ready(target, start))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if r.Policy == chaos.PolicyFromBackup {
		s.backedUpSince(time.Now())
	}
	faults := s.injectFaults(ctx, r.Faults)
	converged := s.ready(target, r.Desired)
	switch r.Operation {
	case chaos.Create, chaos.EtcdCreate:
		if !r.MayLoseQuorum() {
			s.startTraffic(r.Desired)
			break
		}
		// Its only member may die before etcd first answers (seed 582203):
		// then there is no traffic to check, and QCP's report of the lost
		// quorum decides the run.
		if err := s.startTrafficOr(r.Desired, func(cancel context.CancelFunc, answering func(context.Context) error) func(context.Context) error {
			return s.untilDegradedFor(cancel, target, r.Desired, degradedSettle, answering)
		}); err != nil {
			t.Logf("no traffic: %v", err)
		}
	case chaos.ScaleUp, chaos.ScaleDown:
		s.scale(ctx, int32(r.Desired))
	case chaos.EtcdScaleUp, chaos.EtcdScaleDown:
		s.scaleEtcd(ctx, int32(r.Desired))
	case chaos.Rollout:
		outdated, err := s.machines(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cp, err := s.controlPlane(ctx)
		if err != nil {
			t.Fatal(err)
		}
		before := cp.DeepCopy()
		cp.Spec.Rollout.After = metav1.Now()
		if err := s.c.Patch(ctx, cp, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
		converged = s.rolledOut(target, r.Desired, outdated)
	case chaos.LoseMajority:
		lost := s.loseMachines(ctx, r)
		converged = func(ctx context.Context) error {
			cp, err := s.controlPlane(ctx)
			if err != nil {
				return err
			}
			rec := cp.Status.Recovery
			if rec == nil || rec.FinishTime == nil {
				return fmt.Errorf("etcd not recovered; last operation %s: %s", cp.Status.LastOperation.Kind, cp.Status.LastOperation.Reason)
			}
			if r.Policy == chaos.PolicyFromBackup {
				if rec.Snapshot == "" || len(rec.LostMachines) != len(lost) {
					return fmt.Errorf("recovered, but not from a snapshot with every machine lost: %+v", rec)
				}
				// The restored machines have new addresses, which the
				// writer and the monitor learn as a user's client would
				// have to: from the Machines.
				if err := s.followMachines(ctx); err != nil {
					return err
				}
			}
			s.checkKept(ctx)
			for _, name := range lost {
				if err := s.machineGone(name)(ctx); err != nil {
					return fmt.Errorf("lost: %w", err)
				}
			}
			return s.ready(target, r.Desired)(ctx)
		}
	case chaos.Remediate:
		victim := s.requestRemediation(ctx)
		converged = func(ctx context.Context) error {
			if err := s.machineGone(victim)(ctx); err != nil {
				return fmt.Errorf("not remediated: %w", err)
			}
			return s.ready(target, r.Desired)(ctx)
		}
	}
	o.Injected = faults.wait()
	stopped := time.Now()
	cctx, ccancel := context.WithTimeout(ctx, convergeBound)
	if r.MayLoseQuorum() {
		converged = s.untilDegradedFor(ccancel, target, r.Desired, degradedSettle, converged)
	}
	err := testkit.Eventually(forWait(cctx), time.Second, "convergence", converged)
	ccancel()
	var last controlplanev1.LastOperation
	if err != nil {
		st, _ := target.state(ctx, r.Desired) // a read error leaves it empty
		last = st.last
	}
	switch {
	case err == nil:
		o.Converged, o.ConvergedAfter = true, time.Since(stopped)
		lctx, lcancel := context.WithTimeout(ctx, leftoverBound)
		if err := testkit.Eventually(lctx, time.Second, "nothing left behind", s.mgmt.leftBehind); err != nil {
			o.Violations = append(o.Violations, err.Error())
			t.Error(err)
		}
		lcancel()
	case last.Kind == controlplanev1.OperationDegraded && r.MayLoseQuorum():
		o.Degraded = last.Reason
		s.quorumLost = true
		// The right reason: quorum lost, or a membership it cannot see.
		if !reportsLostQuorum(o.Degraded) {
			o.Violations = append(o.Violations, "Degraded for another reason than the lost quorum: "+o.Degraded)
			t.Error(o.Violations[0])
		}
		s.holdsNoDestructiveStep(degradedHold)
	default:
		o.Violations = append(o.Violations, fmt.Sprintf("no convergence within %s of the last fault: %v", convergeBound, err))
		t.Error(o.Violations[0])
	}
	s.finish()
	o.LostWrites = len(s.lostWrites)
	wr, mr := s.writerReport, s.monitorReport
	o.Record = chaos.Record{Commit: campaignCommit(), Acknowledged: wr.Writes, Failed: wr.FailedAttempts, Unknown: wr.UnknownWrites,
		Linearizable: string(wr.Linearizable), LongestGap: wr.MaxWriteGap, MaxVoters: mr.MaxVoters, MaxLearners: mr.MaxLearners,
		MaxMachines: s.bound.mostAtOnce(), Unjudged: len(mr.Gaps), Judged: mr.Judged}
	if err := o.UnjudgedErr(); err != nil {
		o.Violations = append(o.Violations, err.Error())
		t.Error(err)
	}
	return o
}

// degradedSettle is how long QCP must have said, without a break, that it
// lost quorum before a run that may lose it stops waiting for convergence:
// with the default quorum-loss policy (Manual) QCP never recovers on its
// own, so the rest of convergeBound would only wait. Every such run of the
// campaigns before stop 70 waited out the whole bound and then found QCP
// Degraded, at about a quarter of a worker's time.
const degradedSettle = 3 * time.Minute

// untilDegradedFor is converged, which also ends the wait (through
// cancel) once the target has reported Degraded for the lost quorum for
// settle without a break.
func (s *scenario) untilDegradedFor(cancel context.CancelFunc, target chaosTarget, desired int, settle time.Duration, converged func(context.Context) error) func(context.Context) error {
	var since time.Time
	return func(ctx context.Context) error {
		err := converged(ctx)
		if err == nil {
			return nil
		}
		st, serr := target.state(ctx, desired)
		if serr != nil || st.last.Kind != controlplanev1.OperationDegraded || !reportsLostQuorum(st.last.Reason) {
			since = time.Time{}
			return err
		}
		if since.IsZero() {
			since = time.Now()
		}
		if time.Since(since) >= settle {
			cancel()
			return fmt.Errorf("QCP has reported the lost quorum for %s without a break: not waiting longer (%w)", settle, err)
		}
		return err
	}
}

// rolledOut is ready, once every machine of outdated (the machines from
// before the rollout began) is gone and the status counts every replica up
// to date: a rollout has converged when it has replaced them all, not when
// the control plane is merely ready again.
func (s *scenario) rolledOut(target chaosTarget, replicas int, outdated []clusterv1.Machine) func(context.Context) error {
	ready := s.ready(target, replicas)
	return func(ctx context.Context) error {
		for _, m := range outdated {
			if err := s.machineGone(m.Name)(ctx); err != nil {
				return fmt.Errorf("not rolled out: %w", err)
			}
		}
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if n := ptr.Deref(cp.Status.UpToDateReplicas, 0); n != int32(replicas) {
			return fmt.Errorf("%d of %d replicas up to date", n, replicas)
		}
		return ready(ctx)
	}
}

// campaignCommit is the commit the campaign runs: git's HEAD of the
// checkout the tests run in when the campaign began (the binaries were
// built from it then; HEAD may move while a campaign runs), with "+dirty"
// when the checkout had uncommitted changes; "" when git cannot say.
var campaignCommit = sync.OnceValue(func() string {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	commit := strings.TrimSpace(string(out))
	if changed, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(changed) > 0 {
		commit += "+dirty"
	}
	return commit
})

// reportsLostQuorum reports whether a Degraded reason is the right one for
// a lost quorum: the loss itself, or a membership QCP cannot see.
func reportsLostQuorum(reason string) bool {
	return strings.Contains(reason, "lost quorum") || strings.Contains(reason, "until it can see the membership")
}

// backedUpSince waits for a verified snapshot taken after since: what a
// FromBackup loss run restores, once its machines are all killed.
func (s *scenario) backedUpSince(since time.Time) {
	s.t.Helper()
	s.eventually(2*chaos.BackupInterval+2*time.Minute, "a verified snapshot taken after "+since.Format(time.TimeOnly), func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if b := cp.Status.Backup; b == nil || b.LastSuccessful == nil || !b.LastSuccessful.Time.After(since) {
			return fmt.Errorf("status.backup %+v", cp.Status.Backup)
		}
		return nil
	})
}

// checkKept reads back, once, what the recovery kept of the held writer's
// acknowledged writes, and releases the writer.
func (s *scenario) checkKept(ctx context.Context) {
	if s.releaseWriter == nil {
		return
	}
	given := s.traffic.writer.CheckKept(ctx)
	s.releaseWriter()
	s.releaseWriter = nil
	s.t.Logf("the recovery gave up %d acknowledged writes: %v", len(given), given)
}

// followMachines points the scenario's writer and monitor at its
// Machines' etcd endpoints.
func (s *scenario) followMachines(ctx context.Context) error {
	cfg, err := s.etcdConfig(ctx)
	if err != nil {
		return err
	}
	s.traffic.follow(cfg.Endpoints)
	return nil
}

// loseMachines kills a majority of the loss run r's machines at once (the
// newest; every one under FromBackup), and returns their names. Under the
// Manual policy it then checks that QCP reports the lost quorum and takes
// no step for degradedHold, and asks for a recovery from a survivor as a
// user does, with the one-shot trigger; under FromSurvivor and FromBackup
// QCP recovers on its own.
func (s *scenario) loseMachines(ctx context.Context, r chaos.Run) []string {
	s.t.Helper()
	s.recovery = true
	ms, err := s.machines(ctx)
	if err != nil || len(ms) != r.Replicas {
		s.t.Fatalf("want %d machines to lose a majority of, have %d (%v)", r.Replicas, len(ms), err)
	}
	host := &machinehost.Host{Root: s.mgmt.env.MachineRoot()}
	// The writer is held from the kill to the end of the recovery
	// (checkKept), so that what the recovery gave up is read back before
	// new writes overwrite it.
	s.releaseWriter = s.traffic.writer.Hold()
	var lost []string
	for _, m := range ms[len(ms)-r.Killed():] {
		if err := host.Kill(ns, m.Name); err != nil {
			s.t.Fatal(err)
		}
		lost = append(lost, m.Name)
	}
	s.t.Logf("killed %v of %d machines, policy %s", lost, len(ms), r.Policy)
	if r.Policy != chaos.PolicyManual {
		return lost
	}
	s.eventually(4*time.Minute, "QCP reporting the lost quorum", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if last := cp.Status.LastOperation; last.Kind != controlplanev1.OperationDegraded || !reportsLostQuorum(last.Reason) {
			return fmt.Errorf("last operation %s: %s", last.Kind, last.Reason)
		}
		return nil
	})
	s.holdsNoDestructiveStep(degradedHold)
	if err := s.noRecovery(ctx); err != nil {
		s.t.Errorf("under the Manual policy, untriggered: %v", err)
	}
	cp, err := s.controlPlane(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	before := cp.DeepCopy()
	metav1.SetMetaDataAnnotation(&cp.ObjectMeta, controlplanev1.RecoverAnnotation, controlplanev1.RecoverFromSurvivorValue)
	if err := s.c.Patch(ctx, cp, client.MergeFrom(before)); err != nil {
		s.t.Fatal(err)
	}
	s.t.Log("asked for a recovery from a survivor (the one-shot trigger)")
	return lost
}

// chaosUnhealthyMember is the EtcdCluster runs' unhealthy member timeout:
// a killed member is replaced a minute after it stops answering, not the
// default five, so that a run converges within convergeBound with time
// to spare.
const chaosUnhealthyMember = time.Minute

// chaosTarget is what a run's operation acts on: its control plane, or
// its EtcdCluster.
type chaosTarget struct {
	// state reads its status, judged against replicas.
	state func(ctx context.Context, replicas int) (targetState, error)
}

// targetState is a chaosTarget's status.
type targetState struct {
	// notReady says why it has not reached replicas healthy voters or is
	// not otherwise as it should be; nil if it has and is.
	notReady error
	members  []controlplanev1.EtcdMemberStatus
	last     controlplanev1.LastOperation
}

// ready checks the target has reached replicas healthy voters, and that
// the machines and etcd itself agree with its status: exactly its
// members' machines exist, none of them being deleted, and etcd has a
// voter of that name on each, serving. A status read right after a fault
// (a machine deleted by hand, or killed) still describes the machines of
// before it.
func (s *scenario) ready(target chaosTarget, replicas int) func(context.Context) error {
	return func(ctx context.Context) error {
		st, err := target.state(ctx, replicas)
		if err != nil {
			return err
		}
		if st.notReady != nil {
			return st.notReady
		}
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		var machines, memberMachines []string
		for _, m := range ms {
			if !m.DeletionTimestamp.IsZero() {
				return fmt.Errorf("machine %s is being deleted", m.Name)
			}
			machines = append(machines, m.Name)
		}
		for _, m := range st.members {
			memberMachines = append(memberMachines, m.Machine)
		}
		slices.Sort(machines)
		slices.Sort(memberMachines)
		if !slices.Equal(machines, memberMachines) {
			return fmt.Errorf("machines %v, but the status's members are on %v", machines, memberMachines)
		}
		return s.votersServe(ctx, machines)
	}
}

// votersServe asks etcd itself, not QCP: its members are voters named
// for exactly machines (sorted), and each serves a linearizable read.
func (s *scenario) votersServe(ctx context.Context, machines []string) error {
	cli, _, err := s.etcdClient(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	members, err := cli.Members(ctx)
	if err != nil {
		return fmt.Errorf("etcd's member list: %w", err)
	}
	var names []string
	for _, m := range members {
		if m.IsLearner || !m.Started() {
			return fmt.Errorf("etcd lists %s, a learner or not started", m)
		}
		if err := cli.Health(ctx, m.ClientURLs[0]); err != nil {
			return fmt.Errorf("etcd member %s does not serve: %w", m.Name, err)
		}
		names = append(names, m.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, machines) {
		return fmt.Errorf("etcd's voters are %v, the machines %v", names, machines)
	}
	return nil
}

// newChaosScenario creates r's scenario with start replicas: a control
// plane, or an EtcdCluster with a control plane on it, whose machines the
// faults then strike.
func newChaosScenario(t *testing.T, mgmt *management, r chaos.Run, start int) (*scenario, chaosTarget) {
	name := fmt.Sprintf("chaos-%d", r.Seed)
	if !r.Operation.Etcd() {
		var srv *objectstore.Server
		if r.Policy == chaos.PolicyFromBackup {
			srv, _ = testkit.StartObjectStoreAt(t, "backups", mgmt.hostAddress())
			storeSecret(t, mgmt, name+"-s3", srv)
		}
		s := newScenario(t, mgmt, name, int32(start), func(cp *controlplanev1.QuorumControlPlane) {
			switch r.Policy {
			case chaos.PolicyFromSurvivor:
				recoverFromSurvivor(cp)
			case chaos.PolicyFromBackup:
				recoverFromBackup(cp, srv, name+"-s3", chaos.BackupInterval)
			}
		})
		return s, chaosTarget{state: func(ctx context.Context, replicas int) (targetState, error) {
			cp, err := s.controlPlane(ctx)
			if err != nil {
				return targetState{}, err
			}
			return targetState{notReady: availableWith(cp, replicas), members: cp.Status.Etcd.Members, last: cp.Status.LastOperation}, nil
		}}
	}
	s := newEtcdScenario(t, mgmt, name, int32(start), 1, func(ec *etcdv1.EtcdCluster) {
		ec.Spec.UnhealthyMemberTimeoutSeconds = ptr.To(int32(chaosUnhealthyMember / time.Second))
	})
	return s, chaosTarget{state: func(ctx context.Context, replicas int) (targetState, error) {
		ec, err := s.etcdCluster(ctx)
		if err != nil {
			return targetState{}, err
		}
		st := targetState{notReady: etcdReadyWith(ec, replicas), members: ec.Status.Members, last: ec.Status.LastOperation}
		if st.notReady == nil {
			cp, err := s.controlPlane(ctx)
			if err != nil {
				return targetState{}, err
			}
			if err := externalAvailable(cp, etcdScenarioControlPlane); err != nil {
				st.notReady = fmt.Errorf("the control plane on the EtcdCluster: %w", err)
			}
		}
		return st, nil
	}}
}

// requestRemediation asks for the remediation of the scenario's oldest
// machine as a user does, with CAPI's remediate-machine annotation, and
// returns its name.
func (s *scenario) requestRemediation(ctx context.Context) string {
	s.t.Helper()
	ms, err := s.machines(ctx)
	if err != nil || len(ms) == 0 {
		s.t.Fatalf("no machine to remediate (%v)", err)
	}
	m := &ms[0]
	before := m.DeepCopy()
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[clusterv1.RemediateMachineAnnotation] = ""
	if err := s.c.Patch(ctx, m, client.MergeFrom(before)); err != nil {
		s.t.Fatalf("asking for the remediation of machine %s: %v", m.Name, err)
	}
	s.t.Logf("machine %s marked for remediation", m.Name)
	return m.Name
}

// machineGone checks the scenario's machine name is gone.
func (s *scenario) machineGone(name string) func(context.Context) error {
	return func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(ms, func(m clusterv1.Machine) bool { return m.Name == name }) {
			return fmt.Errorf("machine %s is still there", name)
		}
		return nil
	}
}

// leftoverBound is how long, once the control plane has converged, what
// its deleted machines held may take to go.
const leftoverBound = time.Minute

// leftBehind reports what the management cluster's deleted objects left
// on the host: a machine or load balancer directory (which holds its
// processes) with no ProcessMachine or ProcessCluster of that name, a
// process still running in one, an address still reserved for an object
// that is gone, or, on a network of namespaces, a namespace on its bridge
// that belongs to no live object. The reservations are the process provider's
// files under <machine root>/.addresses, each holding its owner's key,
// "machine/<namespace>/<name>" or "lb/<namespace>/<name>".
func (m *management) leftBehind(ctx context.Context) error {
	var pms infrav1.ProcessMachineList
	var pcs infrav1.ProcessClusterList
	if err := m.env.Client.List(ctx, &pms); err != nil {
		return err
	}
	if err := m.env.Client.List(ctx, &pcs); err != nil {
		return err
	}
	// live holds the owner keys of the live objects' addresses and
	// directories. A load balancer's directory is named for its Cluster
	// (the ProcessCluster's cluster-name label, else its owner).
	live := map[string]bool{}
	for _, pm := range pms.Items {
		live["machine/"+pm.Namespace+"/"+pm.Name] = true
	}
	for _, pc := range pcs.Items {
		live["lb/"+pc.Namespace+"/"+pc.Name] = true
		if c := pc.Labels[clusterv1.ClusterNameLabel]; c != "" {
			live["lb/"+pc.Namespace+"/"+c] = true
		}
		for _, o := range pc.OwnerReferences {
			if o.Kind == "Cluster" {
				live["lb/"+pc.Namespace+"/"+o.Name] = true
			}
		}
	}
	root := m.env.MachineRoot()
	host := &machinehost.Host{Root: root}
	var left []string
	for kind, dir := range map[string]string{"machine": filepath.Join(root, ns), "lb": host.LBDir(ns, "")} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		for _, e := range entries {
			if e.IsDir() && !live[kind+"/"+ns+"/"+e.Name()] {
				left = append(left, fmt.Sprintf("the directory of %s %s", kind, e.Name()))
			}
		}
		// A process is a machine's if its command line names a path in
		// the machine's directory (the agent's flags, etcd's data
		// directory); this finds one whose directory is gone too.
		procs, err := machinehost.ProcessesMatching(dir + "/")
		if err != nil {
			return err
		}
		for _, p := range procs {
			_, rest, _ := strings.Cut(p.Cmdline, dir+"/")
			name, _, _ := strings.Cut(rest, "/")
			if name, _, _ = strings.Cut(name, " "); !live[kind+"/"+ns+"/"+name] {
				left = append(left, fmt.Sprintf("process %d (%s) of %s %s", p.PID, p.Comm, kind, name))
			}
		}
	}
	addrDir := filepath.Join(root, ".addresses")
	entries, err := os.ReadDir(addrDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		owner, err := os.ReadFile(filepath.Join(addrDir, e.Name()))
		if err != nil {
			return err
		}
		if key := strings.TrimSpace(string(owner)); !live[key] {
			left = append(left, fmt.Sprintf("address %s reserved for %s", e.Name(), key))
		}
	}
	if m.network != nil {
		// A namespace's veth pair goes with it (hostnet.Network.Detach).
		ports, err := m.network.Ports()
		if err != nil {
			return err
		}
		liveIfs := map[string]bool{}
		for key := range live {
			_, hostIf := machinehost.NamespaceOf(key)
			liveIfs[hostIf] = true
		}
		for _, p := range ports {
			if !liveIfs[p] {
				left = append(left, fmt.Sprintf("network namespace link %s on bridge %s", p, m.network.Bridge))
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("left behind: %s", strings.Join(left, "; "))
	}
	return nil
}

// degradedHold is how long a run that lost quorum is watched for a
// destructive step after QCP said Degraded.
const degradedHold = time.Minute

// holdsNoDestructiveStep fails the run if, within d, any of the control
// plane's machines that is not being deleted now starts being deleted or
// goes: without quorum QCP may remove no member, so it may delete no
// machine (a machine deleted by hand before is left out).
func (s *scenario) holdsNoDestructiveStep(d time.Duration) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ms, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	kept := map[string]bool{}
	for _, m := range ms {
		if m.DeletionTimestamp.IsZero() {
			kept[m.Name] = true
		}
	}
	s.holds(d, "no machine deleted while QCP reports Degraded", func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return nil //nolint:nilerr // the management API may be restarting; the next sample decides
		}
		left := maps.Clone(kept)
		for _, m := range ms {
			if kept[m.Name] && !m.DeletionTimestamp.IsZero() {
				return fmt.Errorf("machine %s is being deleted", m.Name)
			}
			delete(left, m.Name)
		}
		if len(left) > 0 {
			return fmt.Errorf("machines %v are gone", slices.Sorted(maps.Keys(left)))
		}
		return nil
	})
}

// faultRun injects a run's faults in the background; wait returns them
// as injected, once every one has struck and every frozen machine and
// stopped process is back.
type faultRun struct {
	done     chan struct{}
	injected []chaos.Injected
}

func (f *faultRun) wait() []chaos.Injected {
	<-f.done
	return f.injected
}

// injectFaults strikes each fault at its time from now. It never calls
// t.Fatal (it runs in its own goroutine); what it cannot inject it
// records as skipped, with the reason, and a fault with nothing to strike
// (no machine of the cluster running) as moot.
func (s *scenario) injectFaults(ctx context.Context, faults []chaos.Fault) *faultRun {
	f := &faultRun{done: make(chan struct{})}
	host := &machinehost.Host{Root: s.mgmt.env.MachineRoot()}
	start := time.Now()
	go func() {
		defer close(f.done)
		var restore sync.WaitGroup
		for _, fault := range faults {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(start.Add(fault.At))):
			}
			in := chaos.Injected{Fault: fault}
			s.strike(ctx, host, &in, &restore)
			in.StruckAt = time.Since(start)
			s.t.Logf("+%s %s %s %s%s%s", in.StruckAt.Round(time.Millisecond), fault.Kind, in.Machine, in.Note, in.Moot, in.Skipped)
			f.injected = append(f.injected, in)
		}
		restore.Wait()
	}()
	return f
}

// strikeWait is how long a machine fault waits for a machine of the
// cluster to run (one being created, or a killed one's replacement) before
// it is recorded as moot.
const strikeWait = time.Minute

// runningMachine waits, up to strikeWait, for a machine of the scenario's
// to run, and returns the one target picks among those running (sorted
// by creation) and how many Machines the cluster has; moot says why there
// was none to strike.
func (s *scenario) runningMachine(ctx context.Context, host *machinehost.Host, target int) (name string, machines int, moot string) {
	wctx, cancel := context.WithTimeout(ctx, strikeWait)
	defer cancel()
	err := testkit.Eventually(wctx, 500*time.Millisecond, "a running machine of the cluster", func(ctx context.Context) error {
		ms, err := s.machines(ctx)
		if err != nil {
			return err
		}
		var running, down []string
		for _, m := range ms {
			if st, err := host.Status(ns, m.Name); err == nil && st.Running && m.DeletionTimestamp.IsZero() {
				running = append(running, m.Name)
			} else {
				down = append(down, m.Name)
			}
		}
		if len(running) == 0 {
			return fmt.Errorf("machines not running or being deleted: %v", down)
		}
		name, machines = running[target%len(running)], len(ms)
		return nil
	})
	if err != nil {
		return "", 0, fmt.Sprintf("nothing to strike for %s: %v", strikeWait, err)
	}
	return name, machines, ""
}

// restartWait bounds how long the restart of a process a fault killed is
// retried: longer than any fault holds the API server down.
const restartWait = 2 * time.Minute

// retryFor retries fn, which reads the management cluster, every second
// until it succeeds or bound passes: a fault that strikes while the
// management API server is down waits for it (up to strikeWait, as
// StruckAt then shows), and so does a restart (up to restartWait).
func retryFor(ctx context.Context, bound time.Duration, what string, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	return testkit.Eventually(ctx, time.Second, what, fn)
}

// strike injects one fault, recording in in the machine it struck and, if
// it could not, why. Machine faults other than a deletion strike a running
// machine (a freeze of a machine already killed would prove nothing).
// Faults that end later (a thaw, a restart, a heal) are waited for
// through restore.
func (s *scenario) strike(ctx context.Context, host *machinehost.Host, in *chaos.Injected, restore *sync.WaitGroup) {
	fault := in.Fault
	later := func(after time.Duration, fn func()) {
		restore.Add(1)
		time.AfterFunc(after, func() { defer restore.Done(); fn() })
	}
	failed := func(err error) {
		if err != nil {
			in.Skipped = "failed: " + err.Error()
		}
	}
	switch fault.Kind {
	case chaos.DeleteMachine:
		// Retried while the management API server restarts, say.
		failed(retryFor(ctx, strikeWait, "deleting a machine", func(ctx context.Context) error {
			ms, err := s.machines(ctx)
			if err != nil || len(ms) == 0 {
				return fmt.Errorf("no machine to delete (%v)", err)
			}
			in.Machine = ms[fault.Target%len(ms)].Name
			return s.c.Delete(ctx, &ms[fault.Target%len(ms)])
		}))
	case chaos.KillMachine, chaos.FreezeMachine:
		if in.Machine, _, in.Moot = s.runningMachine(ctx, host, fault.Target); in.Moot != "" {
			return
		}
		name := in.Machine
		if fault.Kind == chaos.KillMachine {
			failed(host.Kill(ns, name))
			return
		}
		err := host.Freeze(ns, name)
		if err == nil {
			later(fault.For, func() { _ = host.Thaw(ns, name) })
		}
		failed(err)
	case chaos.KillManager, chaos.KillCAPI, chaos.RestartAPIServer:
		stop, start := s.processFault(ctx, fault.Kind)
		if err := s.mgmt.outages.begin(fault.Kind, stop); err != nil {
			failed(err)
			return
		}
		later(fault.For, func() {
			if err := s.mgmt.outages.end(fault.Kind, start); err != nil {
				s.t.Errorf("after %s: %v", fault.Kind, err)
			}
		})
	case chaos.CutPeerTraffic:
		if s.mgmt.network == nil {
			in.Skipped = "not possible on loopback addresses: this management cluster's machines are not network hosts of their own (ownNetworkedManagement)"
			return
		}
		var machines int
		if in.Machine, machines, in.Moot = s.runningMachine(ctx, host, fault.Target); in.Moot != "" {
			return
		}
		name := in.Machine
		// Cut off from every other machine of its cluster, both ways, the
		// manager still reaching it: `qcpctl machine isolate`, as a user
		// cuts one. A machine with no peer yet (the first of a create, the
		// only one of a plane of 1) is cut from the manager instead: the
		// other partition a lone machine can have.
		args := []string{"machine", "isolate", name}
		if machines == 1 {
			args = append(args, "--from", "manager")
			in.Note = "no peer to cut it from: cut from the manager instead"
		}
		if err := retryFor(ctx, strikeWait, "qcpctl "+strings.Join(args, " "), func(ctx context.Context) error {
			_, err := runQcpctl(ctx, s.mgmt, args...)
			return err
		}); err != nil {
			failed(err)
			return
		}
		later(fault.For, func() {
			// A machine deleted meanwhile took its namespace, and its cuts,
			// with it.
			if _, err := runQcpctl(context.Background(), s.mgmt, "machine", "heal", name); err != nil {
				if m, gerr := s.machineNamed(context.Background(), name); gerr == nil && m.GetDeletionTimestamp() == nil {
					s.t.Errorf("healing machine %s after %s: %v", name, fault.Kind, err)
				}
			}
		})
	default:
		in.Skipped = "unknown fault"
	}
}

// processFault returns how a fault of kind stops its process (qcp-manager
// and CAPI core are killed with their process groups; the kube-apiserver is
// killed too) and how it starts it again. Starting qcp-manager or CAPI core
// reads the management cluster (CAPI core's Deployment, say), whose API
// server another fault may hold down meanwhile, so it is retried: seed
// 120427 lost its worker's CAPI core for good when it was not.
func (s *scenario) processFault(ctx context.Context, kind chaos.FaultKind) (stop, start func() error) {
	if kind == chaos.RestartAPIServer {
		return func() error { return s.mgmt.env.StopAPIServer(ctx) }, s.mgmt.env.StartAPIServer
	}
	p, restart := func() *localenv.Process { return s.mgmt.manager }, func() error { return s.mgmt.startManager(ctx, "") }
	if kind == chaos.KillCAPI {
		p, restart = s.mgmt.env.CAPI, func() error { return s.mgmt.env.RestartCAPI(ctx) }
	}
	stop = func() error {
		proc := p()
		_ = syscall.Kill(-proc.PID(), syscall.SIGKILL)
		return testkit.Eventually(ctx, 100*time.Millisecond, proc.Name+" gone", func(context.Context) error {
			if !proc.Exited() {
				return errors.New("still running")
			}
			return nil
		})
	}
	start = func() error {
		return retryFor(ctx, restartWait, "restarting after "+string(kind), func(context.Context) error { return restart() })
	}
	return stop, start
}

// outages counts, for each kind of process fault, the faults holding its
// process down: one that strikes while the process is down extends the
// outage, and only the last to end starts the process again (two would
// start two qcp-managers, or a kube-apiserver on a taken port). Each kind
// has its own lock, held while its process stops or starts: a restart of
// CAPI core that waits for the API server must not hold up the API
// server's own restart.
type outages struct {
	mu    sync.Mutex
	kinds map[chaos.FaultKind]*outage
}

// outage is one kind's: the faults holding its process down.
type outage struct {
	sync.Mutex
	down int
}

// of returns kind's outage, locked.
func (o *outages) of(kind chaos.FaultKind) *outage {
	o.mu.Lock()
	if o.kinds == nil {
		o.kinds = map[chaos.FaultKind]*outage{}
	}
	k := o.kinds[kind]
	if k == nil {
		k = &outage{}
		o.kinds[kind] = k
	}
	o.mu.Unlock()
	k.Lock()
	return k
}

func (o *outages) begin(kind chaos.FaultKind, stop func() error) error {
	k := o.of(kind)
	defer k.Unlock()
	if k.down == 0 {
		if err := stop(); err != nil {
			return err
		}
	}
	k.down++
	return nil
}

func (o *outages) end(kind chaos.FaultKind, start func() error) error {
	k := o.of(kind)
	defer k.Unlock()
	if k.down--; k.down > 0 {
		return nil
	}
	return start()
}

// TestOutages: only the last of a kind's faults to end starts its process
// again, and a restart that waits for another kind's process (CAPI core's
// for the API server) does not hold up that process's own restart.
func TestOutages(t *testing.T) {
	var o outages
	var capiStops, capiStarts int
	stopCAPI := func() error { capiStops++; return nil }
	for _, err := range []error{o.begin(chaos.RestartAPIServer, func() error { return nil }), o.begin(chaos.KillCAPI, stopCAPI), o.begin(chaos.KillCAPI, stopCAPI)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := o.end(chaos.KillCAPI, func() error { capiStarts++; return nil }); err != nil || capiStops != 1 || capiStarts != 0 {
		t.Fatalf("two faults on CAPI core, one ended: stopped %d times, started %d (%v); want 1 and 0", capiStops, capiStarts, err)
	}
	waiting, apiUp := make(chan struct{}), make(chan struct{})
	restarted := make(chan error)
	go func() {
		restarted <- o.end(chaos.KillCAPI, func() error {
			close(waiting)
			select {
			case <-apiUp:
				capiStarts++
				return nil
			case <-time.After(10 * time.Second):
				return errors.New("the API server was not restarted while CAPI core's restart waited for it")
			}
		})
	}()
	<-waiting
	go func() { _ = o.end(chaos.RestartAPIServer, func() error { close(apiUp); return nil }) }()
	if err := <-restarted; err != nil || capiStarts != 1 {
		t.Fatalf("CAPI core started %d times (%v); want once", capiStarts, err)
	}
}

// machineNamed reads one of the scenario's Machines.
func (s *scenario) machineNamed(ctx context.Context, name string) (client.Object, error) {
	ms, err := s.machines(ctx)
	if err != nil {
		return nil, err
	}
	for i := range ms {
		if ms[i].Name == name {
			return &ms[i], nil
		}
	}
	return nil, fmt.Errorf("machine %s is gone", name)
}
