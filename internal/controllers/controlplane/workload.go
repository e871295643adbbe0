package controlplane

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/controllers/remote"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// initializeProbeTimeout bounds one probe of the workload API server
// through the control plane endpoint, client-go's retries included.
const initializeProbeTimeout = 2 * time.Second

// initialize reports the control plane initialized as soon as an API server
// answers /readyz through the control plane endpoint. CAPI core connects to
// the workload cluster (and watches its Nodes) only after that, so this
// probe uses the kubeconfig directly rather than the ClusterCache.
func (r *Reconciler) initialize(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, obs *observation) {
	// With stacked etcd no API server can answer before the first member
	// runs (or an adopted machine brought one QCP may be unable to read);
	// with external etcd, before the first machine exists.
	if obs.initialized || !obs.State.Bootstrapped && (obs.external == nil || len(obs.Machines) == 0) {
		return
	}
	cs, err := r.directWorkloadClient(ctx, cluster)
	if err != nil {
		log.FromContext(ctx).V(1).Info("Not probing the API server yet", "why", err.Error())
		return
	}
	// The probe's retries included (see workloadNodes).
	pctx, cancel := context.WithTimeout(ctx, initializeProbeTimeout)
	defer cancel()
	if err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").Do(pctx).Error(); err != nil {
		log.FromContext(ctx).V(1).Info("Waiting for the first API server to answer", "why", err.Error())
		return
	}
	cp.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	obs.initialized, obs.State.Bootstrapped = true, true
	r.Recorder.Event(cp, corev1.EventTypeNormal, "Initialized", "The first API server answers through the control plane endpoint")
}

// directWorkloadClient reaches the workload cluster through
// <cluster>-kubeconfig, without the ClusterCache, with short timeouts: for
// what is needed before the ClusterCache connects.
func (r *Reconciler) directWorkloadClient(ctx context.Context, cluster *clusterv1.Cluster) (*kubernetes.Clientset, error) {
	cfg, err := remote.RESTConfig(ctx, "qcp-manager", r.Client, client.ObjectKeyFromObject(cluster))
	if err != nil {
		return nil, err
	}
	cfg.Timeout = initializeProbeTimeout
	return kubernetes.NewForConfig(cfg)
}

// watchNodes makes workload Node changes wake this control plane. The
// ClusterCache keeps one watch per name, so calling it every round is
// cheap; before it connects, its cluster source wakes the controller.
func (r *Reconciler) watchNodes(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, obs *observation) {
	if !obs.initialized || r.controller == nil {
		return
	}
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(cp)}
	err := r.ClusterCache.Watch(ctx, client.ObjectKeyFromObject(cluster), clustercache.NewWatcher(clustercache.WatcherOptions{
		Name:    "quorumcontrolplane-watch-nodes",
		Watcher: r.controller,
		Kind:    &corev1.Node{},
		EventHandler: handler.EnqueueRequestsFromMapFunc(r.wakeups.Mapped(func(context.Context, client.Object) []ctrl.Request {
			return []ctrl.Request{req}
		})),
		Predicates: []predicate.Predicate{nodeConditionsChanged{}},
	}))
	if err != nil && !errors.Is(err, clustercache.ErrClusterNotConnected) {
		log.FromContext(ctx).Error(err, "Watching the workload cluster's Nodes")
	}
}

// nodeConditionsChanged passes Node events that change a condition's status
// (or add or remove a Node), not the agent's heartbeats.
type nodeConditionsChanged struct{ predicate.Funcs }

func (nodeConditionsChanged) Update(e event.UpdateEvent) bool {
	old, okOld := e.ObjectOld.(*corev1.Node)
	now, okNew := e.ObjectNew.(*corev1.Node)
	if !okOld || !okNew || len(old.Status.Conditions) != len(now.Status.Conditions) {
		return true
	}
	for i := range now.Status.Conditions {
		if old.Status.Conditions[i].Type != now.Status.Conditions[i].Type || old.Status.Conditions[i].Status != now.Status.Conditions[i].Status {
			return true
		}
	}
	return false
}

// linkNodes gives each machine's Node its Machine's providerID and zone
// (engine.NodeLinks), through the workload cluster, so that CAPI core links
// Machine and Node on any infrastructure provider. It reports whether a
// machine still waits for its Node, so that the control plane looks again
// soon.
func (r *Reconciler) linkNodes(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, obs *observation) bool {
	if obs.nodes == nil {
		return false
	}
	patch := func(ctx context.Context, node string, data []byte) error {
		if c, err := r.ClusterCache.GetClient(ctx, client.ObjectKeyFromObject(cluster)); err == nil {
			return c.Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, data))
		}
		cs, err := r.directWorkloadClient(ctx, cluster)
		if err != nil {
			return err
		}
		_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, data, metav1.PatchOptions{})
		return err
	}
	return engine.LinkNodes(ctx, obs.Machines, obs.nodes, patch, r.Recorder, cp)
}
