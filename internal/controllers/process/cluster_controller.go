package process

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"

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
	"sigs.k8s.io/cluster-api/util/predicates"
	"sigs.k8s.io/cluster-api/util/secret"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// APIServerPort is where every machine's kube-apiserver and the load
// balancer listen, each on its own address, as on real hosts.
const APIServerPort = 6443

// Condition types and reasons of a ProcessCluster.
const (
	LoadBalancerReadyCondition = "LoadBalancerReady"
	LoadBalancerRunningReason  = "Running"
	LoadBalancerFailedReason   = "StartFailed"
	WaitingForClusterReason    = "WaitingForCluster"
	WaitingForClusterCAReason  = "WaitingForClusterCA"
)

// ClusterReconciler reconciles ProcessClusters.
type ClusterReconciler struct {
	Client    client.Client
	Host      *machinehost.Host
	Addresses *Addresses
	Recorder  record.EventRecorder
	// WatchFilter limits the reconciler to the objects it admits.
	WatchFilter engine.WatchFilter

	metrics *providerMetrics
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=processclusters;processclusters/status;processclusters/finalizers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;clusters/status,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// SetupWithManager registers the controller. Machines changing wake their
// cluster's reconcile so the load balancer's backends follow them (a CAPI
// Machine only when its deletion starts), and the Cluster being paused or
// resumed wakes it (nothing else changes then).
func (r *ClusterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&infrav1.ProcessCluster{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(
			util.ClusterToInfrastructureMapFunc(context.Background(), infrav1.GroupVersion.WithKind("ProcessCluster"), mgr.GetClient(), &infrav1.ProcessCluster{})),
			builder.WithPredicates(predicates.ClusterPausedTransitions(mgr.GetScheme(), mgr.GetLogger()))).
		Watches(&infrav1.ProcessMachine{}, handler.EnqueueRequestsFromMapFunc(r.processClusterOf)).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.processClusterOf),
			builder.WithPredicates(predicate.Funcs{
				CreateFunc:  func(event.CreateEvent) bool { return false },
				DeleteFunc:  func(event.DeleteEvent) bool { return false },
				GenericFunc: func(event.GenericEvent) bool { return false },
				UpdateFunc: func(e event.UpdateEvent) bool {
					return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
				},
			})).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.processClusterOf),
			builder.WithPredicates(predicate.NewPredicateFuncs(isClusterCASecret))).
		Complete(r)
}

// Reconcile brings one ProcessCluster's load balancer and status in line.
func (r *ClusterReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	pc := &infrav1.ProcessCluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, pc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Admits(pc) {
		return ctrl.Result{}, nil
	}
	helper, err := patch.NewHelper(pc, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer func() {
		pc.Status.ObservedGeneration = pc.Generation
		setReady(pc, LoadBalancerReadyCondition, !pc.DeletionTimestamp.IsZero())
		if err := helper.Patch(ctx, pc); err != nil && !apierrors.IsNotFound(err) {
			reterr = errors.Join(reterr, err)
		}
	}()

	if !pc.DeletionTimestamp.IsZero() {
		if isPaused, requeue, err := pausedWhileDeleting(ctx, r.Client, pc.Namespace, clusterNameOf(pc), pc); err != nil || isPaused || requeue {
			return ctrl.Result{Requeue: requeue}, err
		}
		return ctrl.Result{}, r.reconcileDelete(ctx, pc)
	}
	cluster, err := util.GetOwnerCluster(ctx, r.Client, pc.ObjectMeta)
	if err != nil {
		return ctrl.Result{}, err
	}
	if cluster == nil {
		conditions.Set(pc, metav1.Condition{Type: LoadBalancerReadyCondition, Status: metav1.ConditionFalse,
			Reason: WaitingForClusterReason, Message: "Waiting for a Cluster to reference this ProcessCluster and own it"})
		return ctrl.Result{}, nil
	}
	if isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, pc); err != nil || isPaused || requeue {
		return ctrl.Result{Requeue: requeue}, err
	}
	if controllerutil.AddFinalizer(pc, infrav1.ProcessClusterFinalizer) {
		return ctrl.Result{}, nil // the deferred patch stores it before anything is started
	}
	return ctrl.Result{}, r.reconcileNormal(ctx, cluster, pc)
}

func (r *ClusterReconciler) reconcileNormal(ctx context.Context, cluster *clusterv1.Cluster, pc *infrav1.ProcessCluster) error {
	pc.Status.FailureDomains = nil
	for _, fd := range pc.Spec.FailureDomains {
		pc.Status.FailureDomains = append(pc.Status.FailureDomains, clusterv1.FailureDomain{Name: fd, ControlPlane: ptr.To(true)})
	}
	if pc.Spec.ControlPlaneEndpoint.Host == "" {
		addr, err := r.Addresses.Allocate(lbKey(pc))
		if err != nil {
			return err
		}
		pc.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: addr.String(), Port: APIServerPort}
	}
	caPEM, err := r.clusterCA(ctx, cluster)
	if err != nil {
		return err
	}
	backends, err := r.backends(ctx, cluster)
	if err != nil {
		return err
	}
	listen := net.JoinHostPort(pc.Spec.ControlPlaneEndpoint.Host, strconv.Itoa(int(pc.Spec.ControlPlaneEndpoint.Port)))
	pid, err := r.ensureLB(pc.Namespace, cluster.Name, listen, caPEM, backends)
	if err != nil {
		conditions.Set(pc, metav1.Condition{Type: LoadBalancerReadyCondition, Status: metav1.ConditionFalse,
			Reason: LoadBalancerFailedReason, Message: fmt.Sprintf("Load balancer on %s failed to start: %v", listen, err)})
		return err
	}
	if pc.Status.LoadBalancerPID != int32(pid) {
		r.Recorder.Eventf(pc, corev1.EventTypeNormal, "LoadBalancerStarted", "Load balancer for %s runs on %s (pid %d)", cluster.Name, listen, pid)
	}
	pc.Status.LoadBalancerPID = int32(pid)
	pc.Status.Backends = backends
	r.metrics.lbBackends.WithLabelValues(pc.Namespace, cluster.Name).Set(float64(len(backends)))
	// Provisioned even without the cluster CA: the control plane creates
	// the CA only once the infrastructure is provisioned.
	pc.Status.Initialization.Provisioned = ptr.To(true)
	if caPEM == nil {
		conditions.Set(pc, metav1.Condition{Type: LoadBalancerReadyCondition, Status: metav1.ConditionFalse, Reason: WaitingForClusterCAReason,
			Message: fmt.Sprintf("Load balancer serves %s but forwards to no API server until the cluster CA Secret %s exists", listen, secret.Name(cluster.Name, secret.ClusterCA))})
		return nil
	}
	msg := fmt.Sprintf("Load balancer serves %s, forwarding to %d API servers that pass /readyz", listen, len(backends))
	conditions.Set(pc, metav1.Condition{Type: LoadBalancerReadyCondition, Status: metav1.ConditionTrue, Reason: LoadBalancerRunningReason, Message: msg})
	log.FromContext(ctx).V(1).Info("load balancer reconciled", "listen", listen, "backends", backends, "pid", pid)
	return nil
}

// ensureLB starts the load balancer unless it runs, and hands it the
// current backends; it returns the balancer's PID.
func (r *ClusterReconciler) ensureLB(namespace, cluster, listen string, caPEM []byte, backends []string) (int, error) {
	if err := r.Host.SetBackends(namespace, cluster, backends); err != nil {
		return 0, err
	}
	if err := r.Host.StartLB(namespace, cluster, listen, caPEM); err != nil {
		return 0, err
	}
	st, err := r.Host.LBStatus(namespace, cluster)
	if err != nil {
		return 0, err
	}
	if !st.Running {
		return 0, fmt.Errorf("load balancer exited right after start; read %s/lb.log", r.Host.LBDir(namespace, cluster))
	}
	return st.PID, nil
}

func (r *ClusterReconciler) reconcileDelete(ctx context.Context, pc *infrav1.ProcessCluster) error {
	if err := r.Host.StopLB(pc.Namespace, clusterNameOf(pc)); err != nil {
		return fmt.Errorf("stopping the load balancer of %s/%s: %w", pc.Namespace, pc.Name, err)
	}
	if err := r.Addresses.Release(lbKey(pc)); err != nil {
		return err
	}
	r.Recorder.Eventf(pc, corev1.EventTypeNormal, "LoadBalancerStopped", "Load balancer stopped")
	controllerutil.RemoveFinalizer(pc, infrav1.ProcessClusterFinalizer)
	return nil
}

// clusterCA returns the cluster CA certificate the load balancer verifies
// API servers with, or nil while the control plane has not created it.
func (r *ClusterReconciler) clusterCA(ctx context.Context, cluster *clusterv1.Cluster) ([]byte, error) {
	var bundle []byte
	for _, name := range clusterCASecretNames(cluster.Name) {
		s := &corev1.Secret{}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, s)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the cluster CA of %s: %w", cluster.Name, err)
		}
		bundle = append(bundle, s.Data[secret.TLSCrtDataName]...)
	}
	return bundle, nil
}

// backends lists the API server addresses of the cluster's machines, sorted
// so that an unchanged set does not rewrite the load balancer's file.
func (r *ClusterReconciler) backends(ctx context.Context, cluster *clusterv1.Cluster) ([]string, error) {
	machines := &infrav1.ProcessMachineList{}
	if err := r.Client.List(ctx, machines, client.InNamespace(cluster.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}); err != nil {
		return nil, fmt.Errorf("listing the machines of %s: %w", cluster.Name, err)
	}
	owners := &clusterv1.MachineList{}
	if err := r.Client.List(ctx, owners, client.InNamespace(cluster.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}); err != nil {
		return nil, fmt.Errorf("listing the Machines of %s: %w", cluster.Name, err)
	}
	leaving := map[string]bool{}
	for _, m := range owners.Items {
		if !m.DeletionTimestamp.IsZero() {
			leaving[m.Spec.InfrastructureRef.Name] = true
		}
	}
	var staying, all []string
	for _, m := range machines.Items {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		for _, a := range m.Status.Addresses {
			if a.Type == clusterv1.MachineInternalIP {
				be := net.JoinHostPort(a.Address, strconv.Itoa(APIServerPort))
				all = append(all, be)
				if !leaving[m.Name] {
					staying = append(staying, be)
				}
			}
		}
	}
	// A machine whose Machine is being deleted leaves the load balancer
	// first: its etcd member is removed before it goes (QCP holds its
	// deletion for that), and an API server whose own member is gone keeps
	// its clients waiting. Unless no other is left: a slow answer beats
	// none.
	out := staying
	if len(out) == 0 {
		out = all
	}
	slices.Sort(out)
	return out, nil
}

// processClusterOf maps an object labelled with its cluster's name (a
// ProcessMachine, the cluster CA Secret) to the cluster's ProcessCluster.
func (r *ClusterReconciler) processClusterOf(ctx context.Context, obj client.Object) []reconcile.Request {
	return r.requestsForCluster(ctx, obj.GetNamespace(), obj.GetLabels()[clusterv1.ClusterNameLabel])
}

func (r *ClusterReconciler) requestsForCluster(ctx context.Context, namespace, clusterName string) []reconcile.Request {
	if clusterName == "" {
		return nil
	}
	cluster := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: clusterName}, cluster); err != nil {
		return nil
	}
	ref := cluster.Spec.InfrastructureRef
	if ref.Kind != "ProcessCluster" || ref.APIGroup != infrav1.GroupVersion.Group {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: namespace, Name: ref.Name}}}
}

// clusterCASecretNames are the Secrets the load balancer trusts API servers
// by: <cluster>-ca, and <cluster>-ca-next, which a control plane's cluster
// CA rotation (QCP's) creates at its start. Its API servers serve
// certificates of the new authority from the rotation's second stage on,
// and a balancer that did not trust it would take them for unready and cut
// their connections.
func clusterCASecretNames(cluster string) []string {
	ca := secret.Name(cluster, secret.ClusterCA)
	return []string{ca, ca + "-next"}
}

// isClusterCASecret matches the Secrets clusterCA reads.
func isClusterCASecret(obj client.Object) bool {
	name := obj.GetLabels()[clusterv1.ClusterNameLabel]
	return name != "" && slices.Contains(clusterCASecretNames(name), obj.GetName())
}

func lbKey(pc *infrav1.ProcessCluster) string { return "lb/" + pc.Namespace + "/" + pc.Name }

// clusterNameOf names pc's Cluster: by its label, else its owner, else pc's
// own name (a Cluster usually shares its ProcessCluster's name).
func clusterNameOf(pc *infrav1.ProcessCluster) string {
	if name := pc.Labels[clusterv1.ClusterNameLabel]; name != "" {
		return name
	}
	for _, ref := range pc.OwnerReferences {
		if ref.Kind == "Cluster" {
			return ref.Name
		}
	}
	return pc.Name
}
