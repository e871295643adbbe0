package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// ClusterNetworkAnnotation records, on the QuorumControlPlane, the cluster
// network its machines were built with (JSON of clusterNetwork). A
// Cluster's spec.clusterNetwork is CAPI core's field, which QCP cannot
// refuse to change; a running cluster's service range cannot be renumbered
// in place, so QCP keeps building machines with the recorded network and
// reports the difference in the ClusterNetworkApplied condition.
const ClusterNetworkAnnotation = "controlplane.cluster.x-k8s.io/qcp-cluster-network"

// clusterNetwork is the part of a Cluster's spec.clusterNetwork the
// control plane's machines and the join artifacts use.
type clusterNetwork struct {
	// Services is the service range, one IPv4 CIDR.
	Services string `json:"services"`
	// Pods is the pod range, one CIDR; "" leaves node IPAM off.
	Pods string `json:"pods,omitempty"`
	// DNSDomain is the service domain.
	DNSDomain string `json:"dnsDomain"`
}

// defaultClusterNetwork is what a Cluster without spec.clusterNetwork gets,
// kubeadm's defaults, and what machines built before QCP read the Cluster's
// network run.
var defaultClusterNetwork = clusterNetwork{Services: bootstrap.DefaultServiceClusterIPRange, DNSDomain: bootstrap.DefaultDNSDomain}

// DNSIP is the cluster DNS Service's address, the tenth of the range.
func (n clusterNetwork) DNSIP() (string, error) { return clusterDNSIP(n.Services) }

// apply sets the network in a machine's bootstrap document.
func (n clusterNetwork) apply(doc *bootstrap.Document) {
	doc.Tunables.ServiceClusterIPRange = n.Services
	doc.Tunables.PodCIDR = n.Pods
	doc.Tunables.DNSDomain = n.DNSDomain
}

// networkOf reads cluster's spec.clusterNetwork, defaulted as kubeadm
// defaults it, or says which field QCP cannot use and why.
func networkOf(cluster *clusterv1.Cluster) (clusterNetwork, error) {
	n := defaultClusterNetwork
	spec := cluster.Spec.ClusterNetwork
	switch blocks := spec.Services.CIDRBlocks; len(blocks) {
	case 0:
	case 1:
		if _, ipNet, err := net.ParseCIDR(blocks[0]); err != nil || ipNet.IP.To4() == nil {
			return n, fmt.Errorf("spec.clusterNetwork.services.cidrBlocks: %q is not an IPv4 CIDR; QCP's API servers take one IPv4 service range such as 10.96.0.0/12", blocks[0])
		}
		n.Services = blocks[0]
	default:
		return n, fmt.Errorf("spec.clusterNetwork.services.cidrBlocks: %v holds %d ranges; QCP does not run dual-stack services yet: give one IPv4 range", blocks, len(blocks))
	}
	if _, err := n.DNSIP(); err != nil {
		return n, fmt.Errorf("spec.clusterNetwork.services.cidrBlocks: %w; give a range of at least 16 addresses", err)
	}
	switch blocks := spec.Pods.CIDRBlocks; len(blocks) {
	case 0:
	case 1:
		if _, _, err := net.ParseCIDR(blocks[0]); err != nil {
			return n, fmt.Errorf("spec.clusterNetwork.pods.cidrBlocks: %q is not a CIDR; give one such as 192.168.0.0/16", blocks[0])
		}
		n.Pods = blocks[0]
	default:
		return n, fmt.Errorf("spec.clusterNetwork.pods.cidrBlocks: %v holds %d ranges; QCP does not run dual-stack node IPAM yet: give one range", blocks, len(blocks))
	}
	if d := spec.ServiceDomain; d != "" {
		if msgs := validation.IsDNS1123Subdomain(d); len(msgs) > 0 {
			return n, fmt.Errorf("spec.clusterNetwork.serviceDomain: %q is not a DNS domain (%s); give one such as cluster.local", d, strings.Join(msgs, "; "))
		}
		n.DNSDomain = d
	}
	return n, nil
}

// recordedNetwork is the network cp's machines are built with, which
// ensureClusterNetwork has recorded.
func recordedNetwork(cp *controlplanev1.QuorumControlPlane) (clusterNetwork, error) {
	var n clusterNetwork
	if err := json.Unmarshal([]byte(cp.Annotations[ClusterNetworkAnnotation]), &n); err != nil {
		return n, fmt.Errorf("annotation %s: %w", ClusterNetworkAnnotation, err)
	}
	return n, nil
}

// ensureClusterNetwork records the Cluster's network on cp before its first
// machine, and reports in ClusterNetworkApplied whether the Cluster still
// asks for the recorded one. ok is false while no machine may be built:
// the Cluster's network, not yet recorded, cannot be used (the condition
// says why).
func (r *Reconciler) ensureClusterNetwork(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, haveMachines bool) (ok bool, err error) {
	want, invalid := networkOf(cluster)
	var n clusterNetwork
	if _, found := cp.Annotations[ClusterNetworkAnnotation]; found {
		if n, err = recordedNetwork(cp); err != nil {
			return false, err
		}
	} else {
		switch {
		case haveMachines:
			// Built, or adopted, before QCP read the Cluster's network.
			n = defaultClusterNetwork
		case invalid != nil:
			conditions.Set(cp, metav1.Condition{Type: controlplanev1.ClusterNetworkAppliedCondition, Status: metav1.ConditionFalse,
				Reason: controlplanev1.ClusterNetworkInvalidReason, Message: fmt.Sprintf("Cluster %s: %v; no machine is created until it is fixed", cluster.Name, invalid)})
			return false, nil
		default:
			n = want
		}
		data, err := json.Marshal(n)
		if err != nil {
			return false, err
		}
		if err := r.annotateNow(ctx, cp, ClusterNetworkAnnotation, string(data)); err != nil {
			return false, fmt.Errorf("recording the cluster network: %w", err)
		}
	}
	cond := metav1.Condition{Type: controlplanev1.ClusterNetworkAppliedCondition, Status: metav1.ConditionTrue, Reason: controlplanev1.ClusterNetworkAppliedReason}
	if diff := networkChange(n, want, invalid); diff != "" {
		cond.Status, cond.Reason = metav1.ConditionFalse, controlplanev1.ClusterNetworkChangeNotSupportedReason
		cond.Message = fmt.Sprintf("Cluster %s: %s; the control plane keeps the network it was built with, since a running cluster's Services, Pods and DNS names cannot be renumbered in place: set it back, or build a new cluster with the new network", cluster.Name, diff)
	}
	conditions.Set(cp, cond)
	return true, nil
}

// networkChange names the fields of the Cluster's network (want, or
// invalid) that differ from have, or "" if none.
func networkChange(have, want clusterNetwork, invalid error) string {
	if invalid != nil {
		return invalid.Error()
	}
	var diffs []string
	for _, f := range []struct{ field, have, want string }{
		{"spec.clusterNetwork.services.cidrBlocks", have.Services, want.Services},
		{"spec.clusterNetwork.pods.cidrBlocks", have.Pods, want.Pods},
		{"spec.clusterNetwork.serviceDomain", have.DNSDomain, want.DNSDomain},
	} {
		if f.have != f.want {
			diffs = append(diffs, fmt.Sprintf("%s changed from %q to %q after the control plane was built", f.field, f.have, f.want))
		}
	}
	return strings.Join(diffs, "; ")
}
