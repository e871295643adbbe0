package etcdcluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/remote"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// An etcd machine registers a Node in its Cluster's workload cluster, as
// RKE2's etcd-only nodes do: tainted node-role.kubernetes.io/etcd:NoExecute,
// so nothing is scheduled there. CAPI then links the Machine to its Node
// (status.nodeRef) and reports the Node's health on the Machine, and
// clusterctl move, which refuses to start while a Machine has no Node, can
// move the cluster. The machine cannot register before the control plane
// exists, so the manager sends its agent the registration then
// (agent.NodeRegistration): the control plane endpoint, the cluster trust,
// and a node client certificate it signs with the cluster CA. Sending it
// touches no member and restarts nothing, so it is not a planner step;
// like the contract Secrets it is kept current each round.

// NodeRegistrationAnnotation records on an etcd machine what its agent was
// last sent: the registration's digest (agent.NodeRegistration.Digest: the
// endpoint and the trust) and when its node certificate is due for renewal,
// as "<digest>/<RFC 3339 time>". It is sent again when either changed or
// the time has come.
const NodeRegistrationAnnotation = "etcd.cluster.x-k8s.io/qcp-node-registration"

// nodeMaterial is what the round's node registrations are made of.
type nodeMaterial struct {
	server string
	ca     *certs.KeyPair
	trust  []byte
	digest string
}

// nodeMaterial reads the Cluster's control plane endpoint and cluster CA;
// nil until the control plane is initialized and both exist.
func (r *Reconciler) nodeMaterial(ctx context.Context, cluster *clusterv1.Cluster) (*nodeMaterial, error) {
	ep := cluster.Spec.ControlPlaneEndpoint
	if !ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) || !ep.IsValid() {
		return nil, nil
	}
	read := func(purpose secret.Purpose) (*corev1.Secret, error) {
		s := &corev1.Secret{}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: secret.Name(cluster.Name, purpose)}, s)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return s, err
	}
	s, err := read(secret.ClusterCA)
	if s == nil || err != nil {
		return nil, err
	}
	ca, err := certs.ParseKeyPair(s.Data[secret.TLSCrtDataName], s.Data[secret.TLSKeyDataName])
	if err != nil {
		return nil, fmt.Errorf("reading the cluster CA of cluster %s for its etcd machines' Nodes: %w", cluster.Name, err)
	}
	// During a rotation of the cluster CA the API servers serve from
	// either authority: trust both.
	trust := ca.CertPEM
	for _, p := range []secret.Purpose{engine.NextPurpose(secret.ClusterCA), engine.PreviousPurpose(secret.ClusterCA)} {
		other, err := read(p)
		if err != nil {
			return nil, err
		}
		if other != nil {
			trust = append(append(trust[:len(trust):len(trust)], '\n'), other.Data[secret.TLSCrtDataName]...)
		}
	}
	if r.MachineCertificateLifetime > 0 {
		ca = ca.WithLeafValidity(r.MachineCertificateLifetime)
	}
	server := "https://" + net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port)))
	return &nodeMaterial{server: server, ca: ca, trust: trust,
		digest: agent.NodeRegistration{Server: server, ClusterTrust: trust}.Digest()}, nil
}

// registrationDue says whether m's agent must be sent a registration.
func (nm *nodeMaterial) registrationDue(m *clusterv1.Machine, now time.Time) bool {
	digest, at, ok := strings.Cut(m.Annotations[NodeRegistrationAnnotation], "/")
	renewAt, err := time.Parse(time.RFC3339, at)
	return !ok || err != nil || digest != nm.digest || !now.Before(renewAt)
}

// registerNode sends the agent of m, which serves, its Node's registration
// when it is due, and records it on want (m's copy the round writes).
// A machine that cannot take it now is tried again next round.
func (r *Reconciler) registerNode(ctx context.Context, ec *etcdv1.EtcdCluster, nm *nodeMaterial, tlsCfg *tls.Config, m, want *clusterv1.Machine) {
	now := r.Now()
	host := engine.MachineIP(m)
	if !nm.registrationDue(m, now) || host == "" || tlsCfg == nil {
		return
	}
	kp, err := certs.IssueNodeClient(nm.ca, m.Name, now)
	if err != nil {
		log.FromContext(ctx).Error(err, "Issuing the node certificate of an etcd machine", "machine", m.Name)
		return
	}
	reg := agent.NodeRegistration{Server: nm.server, ClusterTrust: nm.trust, NodeCert: kp.CertPEM, NodeKey: kp.KeyPEM}
	if _, err := agent.PutNodeRegistration(ctx, tlsCfg, host, reg); err != nil {
		log.FromContext(ctx).Info("Cannot send the etcd machine its Node's registration yet", "machine", m.Name, "err", err.Error())
		return
	}
	renewAt := certs.RenewAt(kp.Cert.NotBefore, kp.Cert.NotAfter).UTC()
	if want.Annotations == nil {
		want.Annotations = map[string]string{}
	}
	want.Annotations[NodeRegistrationAnnotation] = nm.digest + "/" + renewAt.Format(time.RFC3339)
	r.Recorder.Eventf(ec, corev1.EventTypeNormal, "NodeRegistrationSent",
		"Sent machine %s the registration of its Node in cluster %s (endpoint %s, node certificate valid until %s)",
		m.Name, ec.Labels[clusterv1.ClusterNameLabel], nm.server, kp.Cert.NotAfter.UTC().Format(time.RFC3339))
}

// linkNodes gives each etcd machine's Node its Machine's providerID and
// zone (engine.NodeLinks) through the workload cluster, once its control
// plane is initialized: the Nodes register through it. It reports whether
// a machine still waits for its Node, so that the EtcdCluster looks again
// soon.
func (r *Reconciler) linkNodes(ctx context.Context, cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster, obs *observation) bool {
	if !ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) ||
		!slices.ContainsFunc(obs.Machines, func(m *clusterv1.Machine) bool { return m.Spec.ProviderID != "" && !m.Status.NodeRef.IsDefined() }) {
		return false
	}
	logger := log.FromContext(ctx)
	cfg, err := remote.RESTConfig(ctx, "qcp-manager", r.Client, client.ObjectKeyFromObject(cluster))
	if err != nil {
		logger.V(1).Info("Waiting for the workload cluster's kubeconfig to link the etcd machines' Nodes", "error", err.Error())
		return true
	}
	cfg.Timeout = nodeLinkTimeout
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return true
	}
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		logger.V(1).Info("Waiting for the workload cluster to link the etcd machines' Nodes", "error", err.Error())
		return true
	}
	patch := func(ctx context.Context, node string, data []byte) error {
		_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, data, metav1.PatchOptions{})
		return err
	}
	return engine.LinkNodes(ctx, obs.Machines, engine.NodesByName(list.Items), patch, r.Recorder, ec)
}

// nodeLinkTimeout bounds each request to the workload cluster when linking
// Nodes, so that an unreachable one does not hold the reconcile.
const nodeLinkTimeout = 5 * time.Second
