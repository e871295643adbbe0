package process

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
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
	"sigs.k8s.io/cluster-api/util/predicates"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// Condition types and reasons of a ProcessMachine.
const (
	// ProcessRunningCondition is true while the machine's agent runs.
	ProcessRunningCondition = "ProcessRunning"
	// OwnNetworkCondition is true when the machine is a network host of
	// its own (a network namespace on the provider's bridge), where
	// partitions can cut it off; false, with why, when it shares the
	// host's loopback network.
	OwnNetworkCondition = "OwnNetwork"

	WaitingForInfrastructureReason = "WaitingForClusterInfrastructure"
	WaitingForBootstrapDataReason  = "WaitingForBootstrapData"
	StartFailedReason              = "StartFailed"
	AgentExitedReason              = "AgentExited"
	RunningReason                  = "Running"
	NetworkNamespaceReason         = "NetworkNamespace"
	LoopbackAddressReason          = "LoopbackAddress"
)

// LivenessPeriod is how often a running machine's process is checked, as a
// cloud provider polls its instances; exits surface within this period.
const LivenessPeriod = 5 * time.Second

// recheckAfterFix is how soon a machine that could not start for a reason a
// human must fix (bad bootstrap data, a missing binary) is tried again.
const recheckAfterFix = 30 * time.Second

// MachineReconciler reconciles ProcessMachines.
type MachineReconciler struct {
	Client    client.Client
	Host      *machinehost.Host
	Addresses *Addresses
	Recorder  record.EventRecorder
	// WatchFilter limits the reconciler to the objects it admits.
	WatchFilter engine.WatchFilter
	// LoopbackReason says why machines run on loopback addresses when
	// Host has no Network.
	LoopbackReason string

	metrics *providerMetrics
	// exits remembers the agents whose exit was counted, by machine UID
	// and agent PID: a reconcile on a cache that has not yet seen the
	// AgentExited condition must not count the same exit again.
	exits sync.Map
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=processmachines;processmachines/status;processmachines/finalizers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=processmachinetemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines;machines/status,verbs=get;list;watch

// SetupWithManager registers the controller; a Machine changing (its
// bootstrap data appearing) wakes its ProcessMachine, and a Cluster being
// paused or resumed, or its infrastructure becoming provisioned, wakes all
// of its ProcessMachines (nothing else changes on the ProcessMachine then,
// and CAPI core's Machine controller waits on them), as CAPD's machines do.
func (r *MachineReconciler) SetupWithManager(mgr ctrl.Manager) error {
	clusterToMachines, err := util.ClusterToTypedObjectsMapper(mgr.GetClient(), &infrav1.ProcessMachineList{}, mgr.GetScheme())
	if err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&infrav1.ProcessMachine{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(infraMachineOf)).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(clusterToMachines),
			builder.WithPredicates(predicates.ClusterPausedTransitionsOrInfrastructureProvisioned(mgr.GetScheme(), mgr.GetLogger()))).
		Complete(r)
}

// Reconcile starts, checks or stops one machine.
func (r *MachineReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	pm := &infrav1.ProcessMachine{}
	if err := r.Client.Get(ctx, req.NamespacedName, pm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Admits(pm) {
		return ctrl.Result{}, nil
	}
	helper, err := patch.NewHelper(pm, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer func() {
		pm.Status.ObservedGeneration = pm.Generation
		setReady(pm, ProcessRunningCondition, !pm.DeletionTimestamp.IsZero())
		if err := helper.Patch(ctx, pm); err != nil && !apierrors.IsNotFound(err) {
			reterr = errors.Join(reterr, err)
		}
	}()
	if !pm.DeletionTimestamp.IsZero() {
		if isPaused, requeue, err := pausedWhileDeleting(ctx, r.Client, pm.Namespace, pm.Labels[clusterv1.ClusterNameLabel], pm); err != nil || isPaused || requeue {
			return ctrl.Result{Requeue: requeue}, err
		}
		return ctrl.Result{}, r.reconcileDelete(ctx, pm)
	}
	machine, err := util.GetOwnerMachine(ctx, r.Client, pm.ObjectMeta)
	if err != nil || machine == nil {
		return ctrl.Result{}, err
	}
	cluster, err := util.GetClusterFromMetadata(ctx, r.Client, machine.ObjectMeta)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("finding the cluster of machine %s: %w", machine.Name, err)
	}
	if isPaused, requeue, err := paused.EnsurePausedCondition(ctx, r.Client, cluster, pm); err != nil || isPaused || requeue {
		return ctrl.Result{Requeue: requeue}, err
	}
	if controllerutil.AddFinalizer(pm, infrav1.ProcessMachineFinalizer) {
		return ctrl.Result{}, nil
	}
	return r.reconcileNormal(ctx, cluster, machine, pm)
}

func (r *MachineReconciler) reconcileNormal(ctx context.Context, cluster *clusterv1.Cluster, machine *clusterv1.Machine, pm *infrav1.ProcessMachine) (ctrl.Result, error) {
	if !ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) {
		r.setRunning(pm, metav1.ConditionFalse, WaitingForInfrastructureReason, "Waiting for the cluster's infrastructure (load balancer) to be provisioned")
		return ctrl.Result{}, nil
	}
	if machine.Spec.Bootstrap.DataSecretName == nil {
		r.setRunning(pm, metav1.ConditionFalse, WaitingForBootstrapDataReason, "Waiting for the bootstrap provider to write the Machine's bootstrap data Secret")
		return ctrl.Result{}, nil
	}
	addr, err := r.Addresses.Allocate(machineKey(pm))
	if err != nil {
		r.setRunning(pm, metav1.ConditionFalse, StartFailedReason, err.Error())
		return ctrl.Result{}, err
	}
	pm.Spec.ProviderID = ProviderID(pm)
	pm.Status.FailureDomain = machine.Spec.FailureDomain

	format, data, err := r.bootstrapData(ctx, machine)
	if err != nil {
		return ctrl.Result{}, err
	}
	spec := machinehost.MachineSpec{
		Namespace: pm.Namespace, Name: pm.Name, Cluster: cluster.Name, Address: addr.String(),
		ProviderID: pm.Spec.ProviderID, FailureDomain: machine.Spec.FailureDomain,
	}
	if pm.Spec.Memory != nil {
		spec.MemoryLimit = pm.Spec.Memory.Value()
	}
	status, err := r.Host.Status(pm.Namespace, pm.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !status.Running && pm.Status.PID != 0 {
		// A machine that ran and stopped is not restarted behind the
		// control plane's back, as a cloud would not resurrect a dead VM.
		// Counted once: not again after a manager restart (the condition
		// says so), nor on a cache that has not seen the condition yet.
		seen := conditions.GetReason(pm, ProcessRunningCondition) == AgentExitedReason
		if _, counted := r.exits.LoadOrStore(fmt.Sprintf("%s/%d", pm.UID, pm.Status.PID), true); !counted && !seen {
			r.metrics.machineExits.WithLabelValues(pm.Namespace, cluster.Name).Inc()
			r.Recorder.Eventf(pm, corev1.EventTypeWarning, AgentExitedReason, "Agent of machine %s (pid %d) is gone", pm.Name, pm.Status.PID)
		}
		r.setRunning(pm, metav1.ConditionFalse, AgentExitedReason, agentExitedMessage(pm, status, r.Host.Dir(pm.Namespace, pm.Name)))
		return ctrl.Result{RequeueAfter: LivenessPeriod}, nil
	}
	if !status.Running {
		if err := r.Host.StartBootstrap(spec, format, data); err != nil {
			// A fix to the bootstrap Secret or bin/ wakes nothing, so look
			// again now and then.
			return ctrl.Result{RequeueAfter: recheckAfterFix}, r.startFailed(pm, err)
		}
		r.metrics.machineStarts.WithLabelValues(pm.Namespace, cluster.Name).Inc()
		if status, err = r.Host.Status(pm.Namespace, pm.Name); err != nil {
			return ctrl.Result{}, err
		}
		if !status.Running {
			r.setRunning(pm, metav1.ConditionFalse, AgentExitedReason, agentExitedMessage(pm, status, r.Host.Dir(pm.Namespace, pm.Name)))
			return ctrl.Result{RequeueAfter: LivenessPeriod}, nil
		}
	}
	pid := status.PID
	if pm.Status.PID != int32(pid) {
		r.Recorder.Eventf(pm, corev1.EventTypeNormal, "MachineStarted", "Machine %s runs on %s (agent pid %d)", pm.Name, addr, pid)
		log.FromContext(ctx).Info("machine running", "address", addr.String(), "pid", pid)
	}
	pm.Status.PID = int32(pid)
	// Addresses are published only once the machine runs, so nothing (the
	// load balancer, a control plane adding an etcd member) points at a
	// machine that failed to start.
	pm.Status.Addresses = []clusterv1.MachineAddress{
		{Type: clusterv1.MachineInternalIP, Address: addr.String()},
		{Type: clusterv1.MachineHostName, Address: pm.Name},
	}
	pm.Status.Initialization.Provisioned = ptr.To(true)
	r.setRunning(pm, metav1.ConditionTrue, RunningReason, fmt.Sprintf("Agent runs on %s with pid %d", addr, pid))
	r.setOwnNetwork(pm, addr)
	return ctrl.Result{RequeueAfter: LivenessPeriod}, nil
}

// setOwnNetwork says whether the machine at addr is a network host of its
// own, where a partition can cut it off, or why it is not.
func (r *MachineReconciler) setOwnNetwork(pm *infrav1.ProcessMachine, addr netip.Addr) {
	if ns := r.Host.NetworkNamespace(pm.Namespace, pm.Name); ns != "" {
		conditions.Set(pm, metav1.Condition{Type: OwnNetworkCondition, Status: metav1.ConditionTrue, Reason: NetworkNamespaceReason,
			Message: fmt.Sprintf("Machine is a network host of its own: network namespace %s, address %s on bridge %s", ns, addr, r.Host.Network.Bridge)})
		return
	}
	conditions.Set(pm, metav1.Condition{Type: OwnNetworkCondition, Status: metav1.ConditionFalse, Reason: LoopbackAddressReason,
		Message: fmt.Sprintf("Machine shares the host's network at loopback address %s, because %s: no partition can cut it off (qcpctl machine isolate). Run qcp-manager as root with --machine-network=auto or namespaces and an address range that is not a loopback one", addr, cmp.Or(r.LoopbackReason, "its qcp-manager gives machines no network of their own"))})
}

// startFailed records why a machine could not start. Bad bootstrap data, a
// bad spec and missing binaries are final until someone fixes them, so they
// are not retried with backoff; other errors are.
func (r *MachineReconciler) startFailed(pm *infrav1.ProcessMachine, err error) error {
	reason := machinehost.ReasonOf(err)
	switch reason {
	case machinehost.ReasonInvalidBootstrapData, machinehost.ReasonBinaryMissing,
		machinehost.ReasonInvalidSpec, machinehost.ReasonAgentMissing:
		r.setRunning(pm, metav1.ConditionFalse, reason, err.Error())
		r.Recorder.Event(pm, corev1.EventTypeWarning, reason, err.Error())
		return nil
	}
	r.setRunning(pm, metav1.ConditionFalse, StartFailedReason, err.Error())
	return err
}

func agentExitedMessage(pm *infrav1.ProcessMachine, st machinehost.MachineStatus, dir string) string {
	why := "it was killed or crashed"
	if st.Agent != nil && st.Agent.Message != "" {
		why = st.Agent.Message
	}
	return fmt.Sprintf("Agent of machine %s is not running: %s. Read %s/agent.log; delete the Machine to replace it", pm.Name, why, dir)
}

func (r *MachineReconciler) reconcileDelete(ctx context.Context, pm *infrav1.ProcessMachine) error {
	// A deleting ProcessMachine can be reconciled again after it was
	// stopped (a cache that has not seen the finalizer go); only the pass
	// that found its directory stopped it, and counts.
	_, err := os.Stat(r.Host.Dir(pm.Namespace, pm.Name))
	existed := err == nil
	if err := r.Host.Stop(pm.Namespace, pm.Name); err != nil {
		return fmt.Errorf("stopping machine %s/%s: %w", pm.Namespace, pm.Name, err)
	}
	if err := r.Addresses.Release(machineKey(pm)); err != nil {
		return err
	}
	if existed {
		r.metrics.machineStops.WithLabelValues(pm.Namespace, pm.Labels[clusterv1.ClusterNameLabel]).Inc()
		r.Recorder.Eventf(pm, corev1.EventTypeNormal, "MachineStopped", "Machine %s stopped and its directory removed", pm.Name)
		log.FromContext(ctx).Info("machine stopped")
	}
	controllerutil.RemoveFinalizer(pm, infrav1.ProcessMachineFinalizer)
	return nil
}

// bootstrapData is the format and the value of the machine's bootstrap
// data Secret.
func (r *MachineReconciler) bootstrapData(ctx context.Context, machine *clusterv1.Machine) (string, []byte, error) {
	s := &corev1.Secret{}
	key := client.ObjectKey{Namespace: machine.Namespace, Name: *machine.Spec.Bootstrap.DataSecretName}
	if err := r.Client.Get(ctx, key, s); err != nil {
		return "", nil, fmt.Errorf("reading bootstrap data Secret %s of machine %s: %w", key.Name, machine.Name, err)
	}
	return string(s.Data["format"]), s.Data["value"], nil
}

func (r *MachineReconciler) setRunning(pm *infrav1.ProcessMachine, status metav1.ConditionStatus, reason, msg string) {
	conditions.Set(pm, metav1.Condition{Type: ProcessRunningCondition, Status: status, Reason: reason, Message: msg})
}

// ProviderID is the provider ID of a process machine, as its Node carries it.
func ProviderID(pm *infrav1.ProcessMachine) string {
	return "process://" + pm.Namespace + "/" + pm.Name
}

func machineKey(pm *infrav1.ProcessMachine) string { return "machine/" + pm.Namespace + "/" + pm.Name }

func infraMachineOf(_ context.Context, obj client.Object) []reconcile.Request {
	m, ok := obj.(*clusterv1.Machine)
	if !ok || m.Spec.InfrastructureRef.Kind != "ProcessMachine" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}}}
}
