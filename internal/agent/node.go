package agent

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// Heartbeat periods. The lease is what the node lifecycle controller
// watches; the Ready condition is refreshed so it reads True again after a
// thaw without waiting for kubelet's five-minute status report period. A
// change of a component condition is written after the probe round that
// saw it, as kubelet writes a static pod's readiness, not at the refresh.
const (
	leaseRenew     = 5 * time.Second
	statusRefresh  = 10 * time.Second
	leaseDuration  = 40
	nodeLeaseNS    = "kube-node-lease"
	controlPlaneLb = bootstrap.ControlPlaneNodeRole
	zoneLabel      = "topology.kubernetes.io/zone"
)

// controlPlaneTaint is kubeadm's (constants.ControlPlaneTaint).
var controlPlaneTaint = corev1.Taint{Key: controlPlaneLb, Effect: corev1.TaintEffectNoSchedule}

// EtcdNodeRole is the role of an etcd-only machine's Node: the label
// the manager puts on its Machine, which CAPI copies to the Node, and the
// taint's key. NoExecute, as RKE2 taints its etcd-only nodes: nothing
// runs there but etcd and the agent.
const EtcdNodeRole = "node-role.kubernetes.io/etcd"

var etcdTaint = corev1.Taint{Key: EtcdNodeRole, Effect: corev1.TaintEffectNoExecute}

// NodeState is what the health endpoint reports about the Node.
type NodeState struct {
	Registered    bool      `json:"registered"`
	Labelled      bool      `json:"labelled"`
	LastLease     time.Time `json:"lastLease,omitzero"`
	LastStatus    time.Time `json:"lastStatus,omitzero"`
	LastError     string    `json:"lastError,omitempty"`
	LastErrorTime time.Time `json:"lastErrorTime,omitzero"`
}

// nodeAgent registers and heartbeats the machine's Node. It talks through
// the control plane endpoint and falls back to the local API server, so a
// load balancer outage does not make a healthy machine look dead.
type nodeAgent struct {
	a *machineCtx
	// refresh is how often the status is written when nothing changed.
	refresh time.Duration

	mu    sync.Mutex
	state NodeState
	// clients talk as the node, in order of preference; admin, to set the
	// control plane label. A renewal replaces both.
	clients []kubernetes.Interface
	admin   []kubernetes.Interface
}

func (a *machineCtx) newNodeAgent() (*nodeAgent, error) {
	n := &nodeAgent{a: a, refresh: statusRefresh}
	if a.registersNode() {
		// The role label is the Machine's, which CAPI copies to the Node;
		// the taint is set at registration. Nothing needs the admin.
		n.state.Labelled = true
	}
	return n, n.newClients()
}

// identities are the servers the Node agent talks to, the trust it
// verifies them with, and who it is: the node, and the admin that labels
// the Node (none on an etcd-only machine).
func (n *nodeAgent) identities() (servers []string, trust []byte, node, admin *certs.KeyPair) {
	a := n.a
	if a.registersNode() {
		reg, kp := a.registration.get()
		if reg == nil {
			return nil, nil, nil, nil
		}
		return []string{reg.Server}, reg.ClusterTrust, kp, nil
	}
	if ep := a.doc.ControlPlaneEndpoint; ep != "" {
		servers = append(servers, "https://"+ep)
	}
	if a.doc.Runs("kube-apiserver") {
		servers = append(servers, a.url("https", APIServerPort))
	}
	return servers, a.pki.ClusterTrust(), a.pki.Node(), a.pki.Admin()
}

// newClients builds the clients from the identities the agent holds now:
// at the start, and after a renewal, whose new clients make new connections
// that present the new certificates. The old clients' connections, made
// with certificates still valid, close once idle.
func (n *nodeAgent) newClients() error {
	servers, trust, nodeID, adminID := n.identities()
	var clients, admins []kubernetes.Interface
	for _, s := range servers {
		node, err := clientFor(s, trust, nodeID)
		if err != nil {
			return err
		}
		clients = append(clients, node)
		if adminID == nil {
			continue
		}
		admin, err := clientFor(s, trust, adminID)
		if err != nil {
			return err
		}
		admins = append(admins, admin)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.clients, n.admin = clients, admins
	return nil
}

// current returns the clients as the node and as the agent's admin.
func (n *nodeAgent) current() (clients, admin []kubernetes.Interface) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.clients, n.admin
}

func clientFor(server string, caPEM []byte, kp *certs.KeyPair) (kubernetes.Interface, error) {
	cfg := &rest.Config{
		Host:            server,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM, CertData: kp.CertPEM, KeyData: kp.KeyPEM},
		Timeout:         5 * time.Second,
		UserAgent:       "qcp-agent",
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", server, err)
	}
	return cs, nil
}

// each tries f with every client until one succeeds.
func each(ctx context.Context, clients []kubernetes.Interface, f func(context.Context, kubernetes.Interface) error) error {
	var err error
	for _, c := range clients {
		if err = f(ctx, c); err == nil {
			return nil
		}
	}
	return err
}

func (n *nodeAgent) State() NodeState {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state
}

func (n *nodeAgent) record(f func(*NodeState), err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.state.LastError, n.state.LastErrorTime = err.Error(), time.Now()
		return
	}
	f(&n.state)
}

// Run heartbeats until ctx ends. It wakes on the lease's tick and after
// each round of health checks.
func (n *nodeAgent) Run(ctx context.Context) {
	lease := time.NewTicker(leaseRenew)
	defer lease.Stop()
	renew := true
	var lastStatus time.Time
	var reported string // the component conditions last written, by componentsKey
	for {
		st := n.State()
		if !st.Registered {
			n.record(func(s *NodeState) { s.Registered = true }, n.register(ctx))
		}
		if st := n.State(); st.Registered {
			if !st.Labelled {
				n.record(func(s *NodeState) { s.Labelled = true }, n.label(ctx))
			}
			if renew {
				err := n.renewLease(ctx)
				n.record(func(s *NodeState) { s.LastLease = time.Now() }, err)
				renew = err != nil
			}
			health := n.health(metav1.Now())
			if key := componentsKey(health); key != reported || time.Since(lastStatus) >= n.refresh {
				err := n.updateStatus(ctx, health)
				n.record(func(s *NodeState) { s.LastStatus = time.Now() }, err)
				if err == nil {
					lastStatus, reported = time.Now(), key
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-lease.C:
			renew = true
		case <-n.a.prober.rounds:
		}
	}
}

// health is the machine's component conditions now.
func (n *nodeAgent) health(now metav1.Time) []corev1.NodeCondition {
	return componentConditions(nil, n.a.doc.Components, n.a.sup.Snapshot(), n.a.prober.snapshot(), now)
}

// componentsKey is what a change of conds is reported for: a condition's
// status or reason, not its message (a failing probe's error varies).
func componentsKey(conds []corev1.NodeCondition) string {
	var b strings.Builder
	for _, c := range conds {
		fmt.Fprintf(&b, "%s=%s/%s;", c.Type, c.Status, c.Reason)
	}
	return b.String()
}

func (n *nodeAgent) register(ctx context.Context) error {
	m := n.a.machine
	labels := map[string]string{
		"kubernetes.io/hostname":     m.Name,
		"kubernetes.io/os":           runtime.GOOS,
		"kubernetes.io/arch":         runtime.GOARCH,
		bootstrap.NoKubeletNodeLabel: "",
	}
	if m.FailureDomain != "" {
		labels[zoneLabel] = m.FailureDomain
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, Labels: labels},
		// As kubeadm's mark-control-plane phase taints its Nodes; nothing
		// but the agent runs here, so nothing else may be scheduled here.
		Spec: corev1.NodeSpec{ProviderID: m.ProviderID, Taints: []corev1.Taint{controlPlaneTaint}},
	}
	if n.a.registersNode() {
		node.Spec.Taints = []corev1.Taint{etcdTaint}
	}
	clients, _ := n.current()
	err := each(ctx, clients, func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("registering Node %s: %w", m.Name, err)
	}
	n.a.log.Info("node registered", "node", m.Name, "providerID", m.ProviderID, "zone", m.FailureDomain)
	return nil
}

// label marks the Node as a control plane's, with the role label (which
// NodeRestriction forbids a node to set itself), and the no-kubelet label
// and the taint on a Node an older agent registered without them. Taints
// merge by key.
func (n *nodeAgent) label(ctx context.Context) error {
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:"",%q:""}},"spec":{"taints":[{"key":%q,"effect":%q}]}}`,
		controlPlaneLb, bootstrap.NoKubeletNodeLabel, controlPlaneTaint.Key, controlPlaneTaint.Effect))
	_, admin := n.current()
	err := each(ctx, admin, func(ctx context.Context, c kubernetes.Interface) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, n.a.machine.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("labelling Node %s as control plane: %w", n.a.machine.Name, err)
	}
	return nil
}

func (n *nodeAgent) renewLease(ctx context.Context) error {
	name := n.a.machine.Name
	now := metav1.NewMicroTime(time.Now())
	clients, _ := n.current()
	err := each(ctx, clients, func(ctx context.Context, c kubernetes.Interface) error {
		leases := c.CoordinationV1().Leases(nodeLeaseNS)
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = leases.Create(ctx, n.newLease(ctx, c, now), metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		l.Spec.RenewTime = &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("renewing Lease %s/%s: %w", nodeLeaseNS, name, err)
	}
	return nil
}

func (n *nodeAgent) newLease(ctx context.Context, c kubernetes.Interface, now metav1.MicroTime) *coordinationv1.Lease {
	name := n.a.machine.Name
	dur := int32(leaseDuration)
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: nodeLeaseNS},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &dur, RenewTime: &now},
	}
	// Owned by the Node, as kubelet's, so deleting the Node collects it.
	if node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil {
		l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: node.UID}}
	}
	return l
}

// updateStatus writes the Node's status with health, the component
// conditions from n.health.
func (n *nodeAgent) updateStatus(ctx context.Context, health []corev1.NodeCondition) error {
	m := n.a.machine
	clients, _ := n.current()
	err := each(ctx, clients, func(ctx context.Context, c kubernetes.Interface) error {
		node, err := c.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			// Someone deleted the Node: register it again, as kubelet does.
			n.record(func(s *NodeState) { s.Registered, s.Labelled = false, false }, nil)
			return err
		}
		if err != nil {
			return err
		}
		conds := kubeletConditions(node.Status.Conditions, metav1.Now())
		for _, c := range health {
			conds = setNodeCondition(conds, c)
		}
		node.Status.Conditions = conds
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: m.Address}, {Type: corev1.NodeHostName, Address: m.Name}}
		node.Status.NodeInfo.KubeletVersion = n.a.doc.Versions.Kubernetes
		node.Status.NodeInfo.OperatingSystem = runtime.GOOS
		node.Status.NodeInfo.Architecture = runtime.GOARCH
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("updating status of Node %s: %w", m.Name, err)
	}
	return nil
}
