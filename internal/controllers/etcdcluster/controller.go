// Package etcdcluster is the EtcdCluster provider: a managed external etcd
// cluster on its own CAPI machines (seed 002). It is built like the
// control plane provider, on the same engine: each round observes the
// machines and the members, asks the quorum planner for one step, checks
// the step against a fresh observation, and takes it.
package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/cluster-api/util/paused"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// healthPoll is how often a steady EtcdCluster looks at its members
// again. A member that hangs or dies changes no object soon enough (an
// etcd machine's Node goes NotReady only after its lease expires, and it
// has no health check), so only looking finds it.
const healthPoll = 5 * time.Second

// Reconciler reconciles EtcdClusters.
type Reconciler struct {
	// Client reads through the manager's cache and writes.
	Client client.Client
	// APIReader reads Machines live, so that no plan is made on a cache
	// that has not seen the reconciler's own last write.
	APIReader client.Reader
	Etcd      *etcd.Pool
	Recorder  record.EventRecorder
	// Tunables are the planner's thresholds; an EtcdCluster's
	// unhealthyMemberTimeoutSeconds overrides UnhealthyTimeout.
	Tunables   quorum.Tunables
	Failpoints engine.Failpoints
	// Now is the clock; time.Now if nil.
	Now func() time.Time
	// Concurrency is how many EtcdClusters are reconciled at once; 1 if
	// zero.
	Concurrency int
	// WatchFilter limits the reconciler to the EtcdClusters it admits.
	WatchFilter engine.WatchFilter
	// EtcdClientLifetime bounds the client certificate qcp-manager issues
	// itself for etcd, which renews itself after two thirds of it;
	// certs.LeafValidity if zero.
	EtcdClientLifetime time.Duration
	// MachineCertificateLifetime, when set, is the validity of the leaf
	// certificates every new etcd machine issues itself, in place of
	// certs.LeafValidity: tests see renewal in minutes.
	MachineCertificateLifetime time.Duration
	// BootstrapFormat is the format of new machines' bootstrap data:
	// cloud-config when empty; qcp stands in for a manager from before
	// cloud-config (engine.BootstrapDataSecret).
	BootstrapFormat string

	metrics *engine.Metrics
	stepper *engine.Stepper
	wakeups *engine.Wakeups
	catchUp *engine.CatchUp
}

// +kubebuilder:rbac:groups=etcd.cluster.x-k8s.io,resources=etcdclusters;etcdclusters/status;etcdclusters/finalizers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=etcd.cluster.x-k8s.io,resources=etcdclusters,verbs=delete
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=quorumcontrolplanes,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;clusters/status,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=*,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// SetupWithManager registers the controller: its Machines (which CAPI core
// keeps in step with their infrastructure machines, of whatever kind) and
// its Cluster wake an EtcdCluster.
func (r *Reconciler) SetupWithManager(_ context.Context, mgr ctrl.Manager) error {
	if r.Now == nil {
		r.Now = time.Now
	}
	r.metrics = engine.NewMetrics("qcp_etcdcluster", "EtcdCluster")
	r.stepper = &engine.Stepper{Client: r.Client, Recorder: r.Recorder, Metrics: r.metrics, Failpoints: r.Failpoints, Now: r.Now}
	r.wakeups = engine.NewWakeups(r.Now)
	r.catchUp = engine.NewCatchUp()
	err := ctrl.NewControllerManagedBy(mgr).
		For(&etcdv1.EtcdCluster{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.Concurrency, 1)}).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.wakeups.Mapped(machineToEtcdCluster))).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.wakeups.Mapped(r.clusterToEtcdClusters))).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the EtcdCluster controller: %w", err)
	}
	return nil
}

// Reconcile takes at most one step toward ec's desired state, and reports
// what it saw and did in ec's status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, reterr error) {
	defer func() { r.metrics.ObserveReconcile(req.Namespace, req.Name, reterr, 0) }()
	learned := r.wakeups.Learned(req.NamespacedName)
	ec := &etcdv1.EtcdCluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, ec); err != nil {
		if apierrors.IsNotFound(err) {
			r.wakeups.Forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Admits(ec) {
		return ctrl.Result{}, nil
	}
	helper, err := patch.NewHelper(ec, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer func() {
		if err := helper.Patch(ctx, ec, patch.WithOwnedConditions{Conditions: ownedConditions}); err != nil {
			reterr = errors.Join(reterr, fmt.Errorf("writing the status of EtcdCluster %s: %w", req, err))
		}
	}()
	cluster, err := r.cluster(ctx, ec)
	if err != nil {
		return ctrl.Result{}, err
	}
	if cluster == nil {
		if ec.DeletionTimestamp.IsZero() {
			return ctrl.Result{}, nil
		}
		// Its Cluster is gone: nothing stores data here any more.
		cluster = &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ec.Namespace, Name: ec.Labels[clusterv1.ClusterNameLabel]}}
		return r.reconcileDelete(ctx, cluster, ec, true)
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("Cluster", klogRef(cluster)))
	if isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, ec); err != nil || isPaused || requeue {
		return ctrl.Result{}, err
	}
	if !ec.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, cluster, ec, !cluster.DeletionTimestamp.IsZero())
	}
	if !cluster.DeletionTimestamp.IsZero() {
		// CAPI deletes a Cluster's control plane only once its other
		// machines are gone, and the EtcdCluster's are among them: it
		// goes first, its data with it, as a cluster's stacked etcd goes
		// with its control plane.
		if err := r.Client.Delete(ctx, ec); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("deleting EtcdCluster %s with its Cluster: %w", klogRef(ec), err)
		}
		r.Recorder.Eventf(ec, corev1.EventTypeNormal, "Deleting", "Cluster %s is being deleted: deleting EtcdCluster %s with it", cluster.Name, ec.Name)
		return ctrl.Result{}, nil
	}
	// Owned by its Cluster, as an infrastructure cluster is: clusterctl
	// move finds an object through its owners, and would leave an
	// unowned EtcdCluster, its Machines and its Secrets behind.
	ec.OwnerReferences = util.EnsureOwnerRef(ec.OwnerReferences, metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID})
	if controllerutil.AddFinalizer(ec, etcdv1.EtcdClusterFinalizer) {
		return ctrl.Result{}, nil // written by the deferred patch, which wakes the next round
	}
	return r.reconcileNormal(ctx, cluster, ec, learned)
}

// cluster is the Cluster ec belongs to, named by CAPI's cluster-name label
// (no CAPI contract makes a Cluster reference its etcd); nil, with
// EtcdInitialized saying so, while the label or the Cluster is missing.
func (r *Reconciler) cluster(ctx context.Context, ec *etcdv1.EtcdCluster) (*clusterv1.Cluster, error) {
	name := ec.Labels[clusterv1.ClusterNameLabel]
	if name == "" {
		conditions.Set(ec, metav1.Condition{Type: etcdv1.EtcdInitializedCondition, Status: metav1.ConditionFalse, Reason: etcdv1.EtcdNotInitializedReason,
			Message: fmt.Sprintf("Waiting for the %s label naming the Cluster this etcd belongs to", clusterv1.ClusterNameLabel)})
		return nil, nil
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ec.Namespace, Name: name}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			conditions.Set(ec, metav1.Condition{Type: etcdv1.EtcdInitializedCondition, Status: metav1.ConditionFalse, Reason: etcdv1.EtcdNotInitializedReason,
				Message: fmt.Sprintf("Waiting for Cluster %s, which the %s label names", name, clusterv1.ClusterNameLabel)})
			return nil, nil
		}
		return nil, fmt.Errorf("reading Cluster %s of EtcdCluster %s: %w", name, klogRef(ec), err)
	}
	return cluster, nil
}

// reconcileNormal is one round of observe → plan → verify → act.
func (r *Reconciler) reconcileNormal(ctx context.Context, cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster, learned time.Time) (ctrl.Result, error) {
	ec.Status.ObservedGeneration = ec.Generation
	ec.Status.Selector = machineSelector(cluster, ec)
	if err := engine.OwnTemplate(ctx, r.Client, r.APIReader, cluster, ec.Spec.InfrastructureRef); err != nil {
		return ctrl.Result{}, err
	}
	// The failure domains come with the infrastructure: a machine placed
	// before they are known would be moved at once.
	if !ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) {
		conditions.Set(ec, metav1.Condition{Type: etcdv1.EtcdInitializedCondition, Status: metav1.ConditionFalse, Reason: etcdv1.WaitingForInfrastructureReason,
			Message: fmt.Sprintf("Waiting for Cluster %s's infrastructure to be provisioned", cluster.Name)})
		return ctrl.Result{}, nil
	}
	// A restore's snapshot comes first: its etcd CA, when the backup holds
	// it, must be in place before one is generated, and nothing is made
	// while it cannot be used (the Restored condition says why).
	// Once the first machine was created, a snapshot that can no longer
	// be read stops only the creation of another first machine.
	var restore restoreSource
	if ec.Spec.Restore != nil && !ec.Status.Initialized {
		restore.res, restore.err = engine.PrepareRestore(ctx, r.Client, r.Recorder, ec, ownerRef(ec), "EtcdCluster", cluster, ec.Spec.Restore, ec.Spec.Backup, r.Now())
		if restore.err != nil {
			ctrl.LoggerFrom(ctx).Info("Waiting for a snapshot to restore", "why", restore.err.Error())
			if engine.ReadRestoreRecord(ec) == nil {
				return ctrl.Result{RequeueAfter: engine.RestorePoll}, nil
			}
		}
	}
	ca, err := r.ensureSecrets(ctx, cluster, ec)
	if err != nil {
		return ctrl.Result{}, err
	}
	obs, err := r.observe(ctx, cluster, ec, ca, restore)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.stepper.CheckTaken(ctx, ec, obs.State)
	// An unfinished recovery from a survivor first, as for a control
	// plane: until it is, the survivor's machine names a lost member.
	if open, err := engine.TendRecovery(ctx, r.Client, r.Recorder, ec, &obs.Observation, r.Now); open || err != nil {
		ec.Status.Recovery = engine.ReadRecovery(ec)
		if err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: engine.FastPoll}, nil
	}
	r.wakeups.Looked(client.ObjectKeyFromObject(ec), r.Now())
	if err := r.tendMachines(ctx, cluster, ec, obs); err != nil {
		return ctrl.Result{}, err
	}
	linking := r.linkNodes(ctx, cluster, ec, obs)
	d := quorum.Plan(obs.State)
	var fresh *observation
	acted, replan, err := r.stepper.Take(ctx, engine.Step{
		Owner: ec, LastOperation: &ec.Status.LastOperation, Decision: d, Planned: obs.State, Learned: learned,
		Observe: func(ctx context.Context) (*engine.Observation, error) {
			var err error
			if fresh, err = r.observe(ctx, cluster, ec, ca, restore); err != nil {
				return nil, err
			}
			return &fresh.Observation, nil
		},
		CreateMachine: func(ctx context.Context, _ *engine.Observation) error {
			return r.createMachine(ctx, cluster, ec, ca, fresh, d)
		},
	})
	setStatus(ec, obs, d, acted, r.Now())
	r.metrics.ObserveState(ec, &obs.Observation)
	if err != nil {
		return ctrl.Result{}, err
	}
	if acted || replan {
		r.wakeups.Acted(client.ObjectKeyFromObject(ec))
		return ctrl.Result{RequeueAfter: engine.FastPoll}, nil
	}
	if obs.MembershipInFlight() {
		return ctrl.Result{RequeueAfter: r.wakeups.PollAfter(client.ObjectKeyFromObject(ec))}, nil
	}
	// Nothing in flight: look again for a member going down, or sooner
	// when a machine goes out of date with time (rollout.after).
	wake := healthPoll
	if at := obs.rollout.next(obs.Machines); !at.IsZero() {
		wake = min(wake, max(at.Sub(r.Now()), time.Second))
	}
	if linking {
		wake = min(wake, engine.NodeLinkPoll)
	}
	if quorum.ShowsRecoverableLoss(obs.State) {
		wake = min(wake, engine.RecoveryPoll)
	}
	return ctrl.Result{RequeueAfter: wake}, nil
}

// reconcileDelete waits until no QuorumControlPlane uses ec (its data is
// the cluster's), then deletes the machines and lets ec go. When the
// whole Cluster is going (being deleted, or gone), it waits for nothing:
// CAPI deletes the control plane only after ec's machines.
func (r *Reconciler) reconcileDelete(ctx context.Context, cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster, clusterGoing bool) (ctrl.Result, error) {
	if !clusterGoing {
		var cps controlplanev1.QuorumControlPlaneList
		if err := r.Client.List(ctx, &cps, client.InNamespace(ec.Namespace)); err != nil {
			return ctrl.Result{}, err
		}
		for _, cp := range cps.Items {
			if ref := cp.Spec.Etcd.ClusterRef; ref != nil && ref.Name == ec.Name {
				conditions.Set(ec, metav1.Condition{Type: etcdv1.DeletingCondition, Status: metav1.ConditionTrue, Reason: etcdv1.DeletingWaitingForControlPlaneReason,
					Message: fmt.Sprintf("Waiting for QuorumControlPlane %s, which stores its data here, to be deleted", cp.Name)})
				return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
			}
		}
	}
	machines, err := r.machines(ctx, cluster, ec)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(machines) > 0 {
		for _, m := range machines {
			if err := engine.ReleaseAndDelete(ctx, r.Client, r.Recorder, m, "etcd cluster"); err != nil {
				return ctrl.Result{}, err
			}
		}
		conditions.Set(ec, metav1.Condition{Type: etcdv1.DeletingCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.DeletingWaitingForMachinesReason,
			Message: fmt.Sprintf("Waiting for %d machines to be deleted", len(machines))})
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err := r.Etcd.Forget(poolKey(ec)); err != nil {
		log.FromContext(ctx).Error(err, "Closing the etcd client")
	}
	controllerutil.RemoveFinalizer(ec, etcdv1.EtcdClusterFinalizer)
	return ctrl.Result{}, nil
}

// machineToEtcdCluster maps a Machine to the EtcdCluster controlling it.
func machineToEtcdCluster(_ context.Context, o client.Object) []ctrl.Request {
	if owner := metav1.GetControllerOf(o); owner != nil && owner.Kind == "EtcdCluster" {
		return []ctrl.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: owner.Name}}}
	}
	return nil
}

// clusterToEtcdClusters maps a Cluster to the EtcdClusters labelled with
// its name.
func (r *Reconciler) clusterToEtcdClusters(ctx context.Context, o client.Object) []ctrl.Request {
	var list etcdv1.EtcdClusterList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingLabels{clusterv1.ClusterNameLabel: o.GetName()}); err != nil {
		return nil
	}
	var reqs []ctrl.Request
	for _, ec := range list.Items {
		reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&ec)})
	}
	return reqs
}

// poolKey names ec's client in the etcd pool, apart from any stacked etcd.
func poolKey(ec *etcdv1.EtcdCluster) string { return "etcdcluster/" + klogRef(ec) }

func klogRef(o client.Object) string { return o.GetNamespace() + "/" + o.GetName() }
