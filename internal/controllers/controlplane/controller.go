package controlplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/paused"
	"sigs.k8s.io/cluster-api/util/secret"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// Intervals for the waits no watch can end. etcd membership changes have
// no watch, so while one is in flight (or a member is down) the reconciler
// looks again, quickly after a step and less often the longer it lasts
// (engine.Wakeups.PollAfter); otherwise Machines, infrastructure machines,
// the Cluster and workload Nodes wake it.
const (
	// initializationPoll is how often the first API server is probed
	// before it answers; nothing in the management cluster changes when it
	// does.
	initializationPoll = time.Second
)

// DefaultKubeconfigLifetime is how long the client certificate in
// <cluster>-kubeconfig is valid; it is issued again at half-life.
const DefaultKubeconfigLifetime = 365 * 24 * time.Hour

// Reconciler reconciles QuorumControlPlanes: it observes the control plane,
// asks the quorum planner for one step, checks the step against a fresh
// observation, and takes it.
type Reconciler struct {
	// Client reads through the manager's cache and writes.
	Client client.Client
	// APIReader reads the API server directly. Machines are always read
	// through it: the reconciler must never plan on a cache that has not
	// yet seen its own last write (a duplicate Machine, a second join).
	APIReader    client.Reader
	ClusterCache clustercache.ClusterCache
	Etcd         *etcd.Pool
	Recorder     record.EventRecorder
	// KubeconfigLifetime bounds the kubeconfig's client certificate;
	// DefaultKubeconfigLifetime if zero.
	KubeconfigLifetime time.Duration
	// EtcdClientLifetime bounds the client certificate qcp-manager issues
	// itself for etcd, which renews itself after two thirds of it;
	// certs.LeafValidity if zero.
	EtcdClientLifetime time.Duration
	// MachineCertificateLifetime, when set, is the validity of the leaf
	// certificates every new machine issues itself, in place of
	// spec.certificateValidityPeriodDays: tests see renewal in minutes.
	MachineCertificateLifetime time.Duration
	// BootstrapFormat is the format of new machines' bootstrap data:
	// cloud-config when empty; qcp stands in for a manager from before
	// cloud-config (engine.BootstrapDataSecret).
	BootstrapFormat string
	// ServiceAccountTokenLifetime is how long a service-account key
	// rotation waits between SwitchSigner and Distrust, for the tokens the
	// old key signed to expire; agent.ServiceAccountTokenMaxLifetime, the
	// API servers' maximum, if zero.
	ServiceAccountTokenLifetime time.Duration
	// Tunables are the planner's thresholds.
	Tunables quorum.Tunables
	// HealthCheckTimeout is how long the control plane's MachineHealthCheck
	// lets a Node or component be unhealthy; DefaultHealthCheckTimeout if
	// zero.
	HealthCheckTimeout time.Duration
	// Failpoints, when set, stop the process at named points (crash tests).
	Failpoints engine.Failpoints
	// Now is the clock; time.Now if nil.
	Now func() time.Time
	// Concurrency is how many control planes are reconciled at once; 1 if
	// zero. One whose etcd is slow to answer then holds no other.
	Concurrency int
	// WatchFilter limits the reconciler to the control planes it admits.
	WatchFilter engine.WatchFilter
	// PlanOptions change the planner for a measurement (the write gap that
	// leader transfer saves); zero in production.
	PlanOptions quorum.Options

	metrics      *engine.Metrics
	stepper      *engine.Stepper
	agentClients engine.AgentClients
	// externalPairs is, by externalPoolKey, the client certificate the
	// pooled client of an external etcd was made with.
	externalPairs sync.Map
	// workloadApplied is, by Cluster, the workloadRecord of the join
	// artifacts and addons last applied to its workload cluster.
	workloadApplied sync.Map
	wakeups         *engine.Wakeups
	catchUp         *engine.CatchUp
	controller      controller.Controller
}

// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=quorumcontrolplanes;quorumcontrolplanes/status;quorumcontrolplanes/finalizers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;clusters/status,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=*,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinehealthchecks,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusterclasses,verbs=get;list;watch
// CAPI's contract helpers read a CRD's metadata for the contract version of
// the infrastructure kinds it clones and reads, as KCP's role grants.
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch

// SetupWithManager registers the controller. Machines wake the control plane
// that owns them (CAPI core mirrors what the control plane reads of their
// infrastructure machines, of whatever kind, into them: nothing here names
// an infrastructure provider's types), the Cluster, its health checks,
// its ClusterClass and its API servers' etcd client Secret its control
// plane, and the ClusterCache reports the workload cluster connecting.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	r.init()
	c, err := ctrl.NewControllerManagedBy(mgr).
		For(&controlplanev1.QuorumControlPlane{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Concurrency, 1)}).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.wakeups.Mapped(r.machineToControlPlane))).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.wakeups.Mapped(r.clusterToControlPlane))).
		Watches(&etcdv1.EtcdCluster{}, handler.EnqueueRequestsFromMapFunc(r.wakeups.Mapped(r.etcdClusterToControlPlanes))).
		Watches(&clusterv1.MachineHealthCheck{}, handler.EnqueueRequestsFromMapFunc(r.wakeups.Mapped(r.healthCheckToControlPlane))).
		Watches(&clusterv1.ClusterClass{}, handler.EnqueueRequestsFromMapFunc(r.wakeups.Mapped(r.classToControlPlanes))).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.wakeups.Mapped(r.secretToControlPlane))).
		WatchesRawSource(r.ClusterCache.GetClusterSource("quorumcontrolplane", r.wakeups.Mapped(r.clusterToControlPlane))).
		Build(r)
	if err != nil {
		return fmt.Errorf("setting up the QuorumControlPlane controller: %w", err)
	}
	r.controller = c
	return nil
}

// init fills in the defaults and the reconciler's own parts: what a round
// needs besides the fields its owner sets.
func (r *Reconciler) init() {
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.ServiceAccountTokenLifetime == 0 {
		r.ServiceAccountTokenLifetime = agent.ServiceAccountTokenMaxLifetime
	}
	if r.KubeconfigLifetime == 0 {
		r.KubeconfigLifetime = DefaultKubeconfigLifetime
	}
	r.metrics = engine.NewMetrics("qcp_controlplane", "QuorumControlPlane")
	r.stepper = &engine.Stepper{Client: r.Client, Recorder: r.Recorder, Metrics: r.metrics, Failpoints: r.Failpoints, Now: r.Now,
		MeasuringWithoutLeaderTransfer: r.PlanOptions.SkipLeaderTransfer}
	r.wakeups = engine.NewWakeups(r.Now)
	r.catchUp = engine.NewCatchUp()
}

// Reconcile takes at most one step toward cp's desired state, and reports
// what it saw and did in cp's status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	start := r.Now()
	defer func() { r.metrics.ObserveReconcile(req.Namespace, req.Name, reterr, r.Now().Sub(start)) }()

	learned := r.wakeups.Learned(req.NamespacedName)
	cp := &controlplanev1.QuorumControlPlane{}
	if err := r.Client.Get(ctx, req.NamespacedName, cp); err != nil {
		if apierrors.IsNotFound(err) {
			r.wakeups.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Admits(cp) {
		return ctrl.Result{}, nil
	}
	cluster, err := util.GetOwnerCluster(ctx, r.Client, cp.ObjectMeta)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("reading the Cluster that owns QuorumControlPlane %s: %w", req, err)
	}
	if cluster == nil {
		log.FromContext(ctx).Info("Waiting for CAPI core to make a Cluster own this control plane")
		return ctrl.Result{}, nil
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("Cluster", klogRef(cluster)))

	if isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, cp); err != nil || isPaused || requeue {
		return ctrl.Result{}, err
	}
	helper, err := patch.NewHelper(cp, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer func() {
		if err := helper.Patch(ctx, cp, patch.WithOwnedConditions{Conditions: ownedConditions}); err != nil {
			reterr = errors.Join(reterr, fmt.Errorf("writing the status of QuorumControlPlane %s: %w", req, err))
		}
	}()

	if !cp.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, cluster, cp)
	}
	if controllerutil.AddFinalizer(cp, controlplanev1.QuorumControlPlaneFinalizer) {
		// Written by the deferred patch; the patch wakes the next round.
		return ctrl.Result{}, nil
	}
	return r.reconcileNormal(ctx, cluster, cp, learned)
}

// reconcileNormal is one round of observe → plan → verify → act. learned is
// when the controller last learned something about cp before this round.
func (r *Reconciler) reconcileNormal(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, learned time.Time) (ctrl.Result, error) {
	setStatusBasics(cp)
	if err := engine.OwnTemplate(ctx, r.Client, r.APIReader, cluster, cp.Spec.MachineTemplate.Spec.InfrastructureRef); err != nil {
		return ctrl.Result{}, err
	}
	// The failure domains come with the infrastructure: a machine placed
	// before they are known would be rebalanced away at once.
	if !ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) || !cluster.Spec.ControlPlaneEndpoint.IsValid() {
		setWaitingForInfrastructure(cp, cluster)
		return ctrl.Result{}, nil
	}
	var ext *externalEtcd
	if !cp.Spec.Etcd.IsStacked() {
		var wait string
		var err error
		if ext, wait, err = r.observeExternalEtcd(ctx, cluster, cp); err != nil {
			return ctrl.Result{}, err
		}
		if wait != "" {
			setWaitingForExternalEtcd(cp, wait)
			return ctrl.Result{RequeueAfter: externalEtcdPoll}, nil
		}
	}
	// A restore's snapshot comes first: its authorities, when the backup
	// holds them, must be in place before any are generated, and nothing
	// is made while it cannot be used (the Restored condition says why).
	// Once the first machine was created, a snapshot that can no longer
	// be read stops only the creation of another first machine (the
	// planner's wait), not the rounds.
	restore, restoreErr := r.resolveRestore(ctx, cluster, cp)
	if restoreErr != nil {
		ctrl.LoggerFrom(ctx).Info("Waiting for a snapshot to restore", "why", restoreErr.Error())
		if engine.ReadRestoreRecord(cp) == nil {
			return ctrl.Result{RequeueAfter: engine.RestorePoll}, nil
		}
	}
	secrets, err := r.ensureSecrets(ctx, cluster, cp, ext)
	if err != nil {
		return ctrl.Result{}, err
	}
	secrets.restore, secrets.restoreErr = restore, restoreErr
	if wait, err := r.ensureHealthCheck(ctx, cluster, cp); err != nil {
		return ctrl.Result{}, err
	} else if wait != "" {
		// The health check's deletion wakes the control plane again.
		ctrl.LoggerFrom(ctx).Info(wait)
	}
	listed, err := r.adoptMachines(ctx, cluster, cp)
	if err != nil {
		return ctrl.Result{}, err
	}
	obs, err := r.observe(ctx, cluster, cp, secrets, listed)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.stepper.CheckTaken(ctx, cp, obs.State)
	// A recovery from a survivor that was recorded but not finished comes
	// first: until it is, the survivor's machine names a member of the
	// lost cluster, and the planner would take it for spent.
	if open, err := engine.TendRecovery(ctx, r.Client, r.Recorder, cp, &obs.Observation, r.Now); open || err != nil {
		cp.Status.Recovery = engine.ReadRecovery(cp)
		if err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: engine.FastPoll}, nil
	}
	if ok, err := r.ensureClusterNetwork(ctx, cluster, cp, len(obs.Machines) > 0); err != nil || !ok {
		// A fixed Cluster wakes the control plane.
		return ctrl.Result{}, err
	}
	// With nothing in flight, the next wake-up no watch brings is the
	// kubeconfig's renewal, a machine going out of date with time, or the
	// next look at etcd's alarms and databases.
	wake := secrets.renewAt
	if at := obs.rollout.next(obs.Machines); !at.IsZero() && at.Before(wake) {
		wake = at
	}
	if ext != nil && !ext.follow {
		// Whether endpoints QCP does not run still answer, no watch says.
		if at := r.Now().Add(externalEtcdPoll); at.Before(wake) {
			wake = at
		}
	}
	if obs.State.Topology != quorum.APIServersOnly {
		if at := r.Now().Add(engine.MaintenancePoll); at.Before(wake) {
			wake = at
		}
	}
	if quorum.ShowsRecoverableLoss(obs.State) {
		// Whether the lost members answer again, or a recovery's wait
		// ends, no watch says.
		if at := r.Now().Add(engine.RecoveryPoll); at.Before(wake) {
			wake = at
		}
	}
	idle := ctrl.Result{RequeueAfter: max(wake.Sub(r.Now()), time.Second)}
	r.wakeups.Looked(client.ObjectKeyFromObject(cp), r.Now())
	forgetFinishedRemediation(cp, obs)
	if err := r.tendMachines(ctx, cluster, cp, obs); err != nil {
		return ctrl.Result{}, err
	}
	r.initialize(ctx, cluster, cp, obs)
	r.watchNodes(ctx, cluster, cp, obs)
	linking := r.linkNodes(ctx, cluster, cp, obs)
	r.ensureWorkloadObjects(ctx, cluster, cp, secrets, obs)
	if err := r.removeDepartedNodes(ctx, cluster, cp, obs); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Removing the Nodes of machines from before the restore")
	}
	if rt := secrets.rotation; rt != nil {
		advanced, err := r.advanceRotation(ctx, cluster, cp, rt, obs.Machines)
		if err != nil {
			return ctrl.Result{}, err
		}
		if advanced {
			// The next round observes and plans with the new stage.
			return ctrl.Result{RequeueAfter: engine.FastPoll}, nil
		}
		conditions.Set(cp, rt.condition())
		rt.setStatus(cp)
		if !rt.until.IsZero() && rt.until.Before(r.Now().Add(idle.RequeueAfter)) {
			idle.RequeueAfter = max(rt.until.Sub(r.Now()), time.Second)
		}
	} else {
		mirrorRotation(cp)
	}

	d := quorum.PlanWithOptions(obs.State, r.PlanOptions)
	acted, replan, err := r.act(ctx, cluster, cp, secrets, d, obs.State, learned)
	setStatus(cp, obs, d, acted, r.Now())
	cp.Status.Certificates = certificateExpiries(cluster, secrets, obs.Machines, r.KubeconfigLifetime)
	r.metrics.ObserveCertificates(cp, cp.Status.Certificates)
	r.metrics.ObserveState(cp, &obs.Observation)
	if err != nil {
		return ctrl.Result{}, err
	}
	if acted || replan {
		r.wakeups.Acted(client.ObjectKeyFromObject(cp))
		return ctrl.Result{RequeueAfter: engine.FastPoll}, nil
	}
	if obs.inFlight() {
		return ctrl.Result{RequeueAfter: r.wakeups.PollAfter(client.ObjectKeyFromObject(cp))}, nil
	}
	if linking {
		return ctrl.Result{RequeueAfter: engine.NodeLinkPoll}, nil
	}
	if !obs.initialized {
		return ctrl.Result{RequeueAfter: initializationPoll}, nil
	}
	return idle, nil
}

// act verifies d against a fresh observation and takes it, through the
// engine's Stepper. The first step on a machine being remediated (a health
// check marked it, or its voter was unhealthy past the timeout) starts its
// remediation, recorded on the control plane before the step is taken.
func (r *Reconciler) act(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, secrets *clusterSecrets,
	d quorum.Decision, planned quorum.State, learned time.Time) (acted, replan bool, err error) {
	var fresh *observation
	return r.stepper.Take(ctx, engine.Step{
		Owner: cp, LastOperation: &cp.Status.LastOperation, Decision: d, Planned: planned, Learned: learned,
		Observe: func(ctx context.Context) (*engine.Observation, error) {
			var err error
			if fresh, err = r.observe(ctx, cluster, cp, secrets, nil); err != nil {
				return nil, err
			}
			return &fresh.Observation, nil
		},
		CreateMachine: func(ctx context.Context, _ *engine.Observation) error {
			return r.createMachine(ctx, cluster, cp, secrets, fresh, d)
		},
		Starting: func(ctx context.Context, _ *engine.Observation) error {
			// MoveLeader names the machine leadership goes to, not the one
			// leaving; a replacement created first is not yet a step on the
			// machine it replaces.
			next, ok := fresh.remediationNext[d.Machine]
			if !ok || d.Kind == quorum.CreateMachine || d.Kind == quorum.MoveLeader {
				return nil
			}
			return r.recordRemediationStart(ctx, cp, next)
		},
	})
}

// clusterToControlPlane maps a Cluster to the QuorumControlPlane it names.
func (r *Reconciler) clusterToControlPlane(_ context.Context, o client.Object) []ctrl.Request {
	c, ok := o.(*clusterv1.Cluster)
	if !ok || c.Spec.ControlPlaneRef.Kind != "QuorumControlPlane" || c.Spec.ControlPlaneRef.APIGroup != controlplanev1.GroupVersion.Group {
		return nil
	}
	return []ctrl.Request{{NamespacedName: client.ObjectKey{Namespace: c.Namespace, Name: c.Spec.ControlPlaneRef.Name}}}
}

// healthCheckToControlPlane maps a MachineHealthCheck to its cluster's
// control plane, which keeps its own health check only while the topology
// controller keeps none.
func (r *Reconciler) healthCheckToControlPlane(ctx context.Context, o client.Object) []ctrl.Request {
	mhc, ok := o.(*clusterv1.MachineHealthCheck)
	if !ok {
		return nil
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: mhc.Namespace, Name: mhc.Spec.ClusterName}, cluster); err != nil {
		return nil
	}
	return r.clusterToControlPlane(ctx, cluster)
}

// secretToControlPlane maps a cluster's <cluster>-apiserver-etcd-client
// Secret to its control plane: when its pair is renewed (by an
// EtcdCluster) or replaced (by the owner of an external etcd), the
// control plane delivers it to its machines; and its <cluster>-etcd-next
// and <cluster>-ca-next, the new authority a user supplies for a rotation, which a
// rotation waiting for it to become usable then takes. Other Secrets map
// to none.
func (r *Reconciler) secretToControlPlane(ctx context.Context, o client.Object) []ctrl.Request {
	if reqs := r.backupSecretToControlPlanes(ctx, o); len(reqs) > 0 {
		return reqs
	}
	name := o.GetLabels()[clusterv1.ClusterNameLabel]
	if name == "" || o.GetName() != secret.Name(name, secret.APIServerEtcdClient) &&
		o.GetName() != secret.Name(name, engine.NextPurpose(secret.EtcdCA)) && o.GetName() != secret.Name(name, engine.NextPurpose(secret.ClusterCA)) {
		return nil
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: name}, cluster); err != nil {
		return nil
	}
	return r.clusterToControlPlane(ctx, cluster)
}

// backupSecretToControlPlanes maps a Secret that spec.backup or
// spec.restore of a control plane in its namespace names (the store's
// credentials, the key) to those control planes, so that a fixed Secret
// is seen at once rather than at the next poll.
func (r *Reconciler) backupSecretToControlPlanes(ctx context.Context, o client.Object) []ctrl.Request {
	var cps controlplanev1.QuorumControlPlaneList
	if err := r.Client.List(ctx, &cps, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var reqs []ctrl.Request
	for _, cp := range cps.Items {
		if slices.Contains(engine.BackupSecrets(cp.Spec.Backup, cp.Spec.Restore), o.GetName()) {
			reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&cp)})
		}
	}
	return reqs
}

// classToControlPlanes maps a ClusterClass to the control planes of the
// Clusters made from it: whether the class defines a control plane health
// check decides whether QCP keeps its own.
func (r *Reconciler) classToControlPlanes(ctx context.Context, o client.Object) []ctrl.Request {
	var clusters clusterv1.ClusterList
	if err := r.Client.List(ctx, &clusters); err != nil {
		return nil
	}
	var reqs []ctrl.Request
	for i := range clusters.Items {
		c := &clusters.Items[i]
		ref := c.Spec.Topology.ClassRef
		if ref.Name == o.GetName() && cmp.Or(ref.Namespace, c.Namespace) == o.GetNamespace() {
			reqs = append(reqs, r.clusterToControlPlane(ctx, c)...)
		}
	}
	return reqs
}

// machineToControlPlane maps any Machine of a cluster to the cluster's
// control plane: its own machines change its plan, and worker machines
// going away end its deletion's wait.
func (r *Reconciler) machineToControlPlane(ctx context.Context, o client.Object) []ctrl.Request {
	if owner := metav1.GetControllerOf(o); owner != nil && owner.Kind == "QuorumControlPlane" {
		return []ctrl.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: owner.Name}}}
	}
	name, ok := o.GetLabels()[clusterv1.ClusterNameLabel]
	if !ok {
		return nil
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: name}, cluster); err != nil {
		return nil
	}
	return r.clusterToControlPlane(ctx, cluster)
}

func klogRef(o client.Object) string { return o.GetNamespace() + "/" + o.GetName() }
