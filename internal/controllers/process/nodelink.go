package process

import (
	"context"
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/remote"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
)

// nodeLinkPeriod is how often a running machine whose Machine has no Node
// yet is looked at: its agent registers the Node within seconds, and the
// Machine is not linked until this provider gives the Node its providerID.
const nodeLinkPeriod = time.Second

// zoneLabel is the well-known label of the Node's zone.
const zoneLabel = "topology.kubernetes.io/zone"

// linkNode gives the machine's Node (named after the machine: its host
// name) the ProcessMachine's providerID and the Machine's failure domain
// as its zone, as a cloud's controller manager would, and as CAPD sets the
// providerID of its containers' Nodes. CAPI core then links the Machine to
// the Node by providerID. A machine booted from cloud-config registers its
// Node without either: only the infrastructure knows them. It reports
// whether the Node carries the providerID; a Node not registered yet, or a
// workload cluster not reachable, is tried again soon. A Node with another
// providerID is left alone, with an event: it is another machine's.
func (r *MachineReconciler) linkNode(ctx context.Context, cluster *clusterv1.Cluster, machine *clusterv1.Machine, pm *infrav1.ProcessMachine) bool {
	logger := log.FromContext(ctx)
	cfg, err := remote.RESTConfig(ctx, "process-provider", r.Client, client.ObjectKeyFromObject(cluster))
	if err != nil {
		logger.V(4).Info("Waiting for the workload cluster's kubeconfig to link the machine's Node", "error", err.Error())
		return false
	}
	cfg.Timeout = 2 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return false
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, pm.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		logger.V(4).Info("Waiting for the workload cluster to link the machine's Node", "error", err.Error())
		return false
	}
	switch node.Spec.ProviderID {
	case pm.Spec.ProviderID:
		return true
	case "":
	default:
		r.Recorder.Eventf(pm, corev1.EventTypeWarning, "NodeProviderIDMismatch", "Node %s has providerID %q, not this machine's %q: it is left alone", node.Name, node.Spec.ProviderID, pm.Spec.ProviderID)
		return true
	}
	patch := map[string]any{"spec": map[string]any{"providerID": pm.Spec.ProviderID}}
	if fd := machine.Spec.FailureDomain; fd != "" {
		patch["metadata"] = map[string]any{"labels": map[string]string{zoneLabel: fd}}
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return false
	}
	if _, err := cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, data, metav1.PatchOptions{}); err != nil {
		logger.Info("Setting the Node's providerID failed; trying again", "node", node.Name, "error", err.Error())
		return false
	}
	r.Recorder.Eventf(pm, corev1.EventTypeNormal, "NodeLinked", "Node %s has providerID %s and zone %q", node.Name, pm.Spec.ProviderID, machine.Spec.FailureDomain)
	return true
}
