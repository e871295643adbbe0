package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// plannerMachine is what machine, and its Node (nil until it registers),
// tell the planner. upToDate is the caller's rollout verdict on the machine.
func plannerMachine(machine *clusterv1.Machine, node *corev1.Node, upToDate bool) quorum.Machine {
	m := engine.PlannerMachine(machine, upToDate)
	m.Remediate = marked(machine)
	m.NodeReady, m.ComponentsHealthy = nodeHealth(node)
	return m
}

// nodeHealth reads the Node's Ready condition and the agent's component
// conditions; every component condition present must be True, and there
// must be at least one (a Node the agent has not reported on yet is not
// known to be healthy).
func nodeHealth(node *corev1.Node) (ready, components bool) {
	if node == nil {
		return false, false
	}
	seen := 0
	components = true
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
			continue
		}
		if agent.IsComponentCondition(c.Type) {
			seen++
			components = components && c.Status == corev1.ConditionTrue
		}
	}
	return ready, components && seen > 0
}

// machineReportFresh is how old a machine's report of its etcd, read from
// its Node, may be and still count (etcdAnswersOnMachine): the agent writes
// its Node's status at least every 10 s, and this is the lease duration it
// gives the Node. A machine that stopped reporting (frozen, or its agent
// gone), or a Node read from a cache that no longer hears from the
// workload cluster, tells nothing after that.
const machineReportFresh = 40 * time.Second

// etcdAnswersOnMachine reads the machine's own word, from its Node, that
// its etcd member answers its health check there
// (quorum.Machine.EtcdAnswersOnMachine): the Node is Ready, and the agent's
// EtcdHealthy condition is True with a heartbeat at most
// machineReportFresh before now. The agent probes etcd's /health on the
// machine itself, which a partition between the management cluster and
// the machine does not touch; it passes only on a member with a leader that
// serves a linearizable read. A machine without the agent's condition (one
// adopted from kubeadm) says nothing.
func etcdAnswersOnMachine(node *corev1.Node, now time.Time) bool {
	if node == nil {
		return false
	}
	ready := agent.NodeCondition(node, corev1.NodeReady)
	etcdOK := agent.NodeCondition(node, agent.ComponentConditionTypes[bootstrap.Etcd])
	return ready != nil && ready.Status == corev1.ConditionTrue && etcdOK != nil && etcdOK.Status == corev1.ConditionTrue &&
		now.Sub(etcdOK.LastHeartbeatTime.Time) <= machineReportFresh
}

// observation is one look at a control plane: the objects it was built
// from, and the planner's State built from them.
type observation struct {
	// Observation holds the control plane's Machines (read live, never
	// from the cache, sorted by name), its etcd members and the State.
	engine.Observation
	// nodes are the workload Nodes by name; nil while the workload cluster
	// cannot be reached (nodesErr says why).
	nodes    map[string]*corev1.Node
	nodesErr error
	// nodesDirect: the Nodes were read without the ClusterCache, which has
	// not connected yet, so no Node watch wakes the controller.
	nodesDirect bool
	// initialized is whether the first API server has answered.
	initialized bool
	// external is the external etcd; nil when etcd is stacked.
	external *externalEtcd
	// restore is the snapshot the first machine restores; nil when etcd
	// starts empty, or has data already, or when it cannot be used
	// (restoreErr).
	restore    *engine.Restore
	restoreErr error
	// rollout judges which machines are outdated.
	rollout rollout
	// remediation judges the marked machines; remediationRefused says why
	// each one QCP may not remediate now waits, and remediationNext what
	// remediating each of the others records.
	remediation        remediationPolicy
	remediationRefused map[string]string
	remediationNext    map[string]remediationData
	// certificates are what the machines QCP had not read the certificates
	// of yet told it, for those that answered.
	certificates map[string]engine.PKIRecords
}

// observe reads everything the planner needs: the Machines (live, or of
// listed: the cluster's Machines the round has just read live), the
// workload Nodes (through the ClusterCache, once initialized) and the etcd
// members (through the pool, over TLS with the manager's client
// certificate).
func (r *Reconciler) observe(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, secrets *clusterSecrets, listed collections.Machines) (*observation, error) {
	ours := []collections.Func{collections.ControlPlaneMachines(cluster.Name), collections.OwnedMachines(cp, controlplanev1.GroupVersion.WithKind("QuorumControlPlane").GroupKind())}
	var machines collections.Machines
	var err error
	if listed != nil {
		machines = listed.Filter(ours...)
	} else if machines, err = collections.GetFilteredMachinesForCluster(ctx, r.APIReader, cluster, ours...); err != nil {
		return nil, fmt.Errorf("listing the control plane machines of cluster %s: %w", klogRef(cluster), err)
	}
	obs := &observation{
		Observation: engine.Observation{Machines: engine.SortedByName(machines.UnsortedList())},
		initialized: ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false),
	}
	if obs.initialized {
		obs.nodes, obs.nodesDirect, obs.nodesErr = r.workloadNodes(ctx, cluster)
	}
	obs.external, obs.restore, obs.restoreErr = secrets.external, secrets.restore, secrets.restoreErr
	if obs.external == nil {
		obs.Etcd, obs.Members, obs.DepartedAlarms, obs.MembersErr = r.observeEtcd(ctx, cluster, cp, secrets, obs.Machines)
		if obs.Etcd != nil {
			obs.AgentTLS = obs.Etcd.TLSConfig()
		}
	} else {
		if obs.AgentTLS, err = r.agentClients.TLSConfig(klogRef(cluster), secrets.cas.Cluster, secrets.cas.ClusterTrust, r.EtcdClientLifetime); err != nil {
			return nil, err
		}
		if obs.EtcdClientPair, err = certs.ParseKeyPair(obs.external.clientCert, obs.external.clientKey); err != nil {
			return nil, fmt.Errorf("the API servers' etcd client pair: %w", err)
		}
	}
	if rt := secrets.rotation; rt != nil {
		obs.Authority, obs.AuthorityKind, obs.AuthorityWant = rt.authority(), authorityOf[rt.state.Kind].agent, rt.want()
	}
	if obs.external == nil {
		obs.Backup, obs.BackupErr = engine.LoadBackup(ctx, r.Client, cp, "QuorumControlPlane", cp.Spec.Backup)
		if obs.Backup != nil {
			obs.Backup.Authorities = authoritySecrets(cluster.Name)
		}
	}
	obs.rollout = r.newRollout(ctx, cp)
	obs.remediation = newRemediationPolicy(cp, r.Now())
	obs.certificates = observeCertificates(ctx, secrets, obs)
	obs.build(cp, cluster, r.Now(), r.Tunables)
	obs.ObserveSurvivors(ctx, &obs.State)
	if obs.external == nil {
		obs.Restore = engine.ResolveRecoveryRestore(ctx, r.Client, cp, "QuorumControlPlane", cp.Spec.Backup, &obs.State, r.Now())
	}
	return obs, nil
}

// workloadNodes lists the workload cluster's Nodes from the ClusterCache.
// Until the ClusterCache connects (after a failed attempt it waits 30 s,
// and CAPI core connects only once the control plane is initialized), it
// reads them straight from the API server, so that the preflight checks do
// not wait on the cache; direct says so, and the caller then polls.
func (r *Reconciler) workloadNodes(ctx context.Context, cluster *clusterv1.Cluster) (nodes map[string]*corev1.Node, direct bool, err error) {
	var list corev1.NodeList
	if reader, err := r.ClusterCache.GetReader(ctx, client.ObjectKeyFromObject(cluster)); err == nil {
		if err := reader.List(ctx, &list); err != nil {
			return nil, false, fmt.Errorf("listing the workload cluster's Nodes: %w", err)
		}
		return engine.NodesByName(list.Items), false, nil
	}
	cs, err := r.directWorkloadClient(ctx, cluster)
	if err != nil {
		return nil, true, fmt.Errorf("the workload cluster is not reachable yet: %w", err)
	}
	// One probe, retries included: client-go retries a GET that meets a
	// closed connection up to ten times, a second apart, which is what
	// the control plane endpoint's load balancer gives while no API server
	// runs behind it (every machine lost), and each observation waited
	// that out.
	ctx, cancel := context.WithTimeout(ctx, initializeProbeTimeout)
	defer cancel()
	fresh, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, true, fmt.Errorf("listing the workload cluster's Nodes: %w", err)
	}
	return engine.NodesByName(fresh.Items), true, nil
}

// observeEtcd reads the stacked members through the machines' client URLs
// (engine.ObserveEtcd), with a client certificate QCP issues itself from
// the etcd CA.
func (r *Reconciler) observeEtcd(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, secrets *clusterSecrets, machines []*clusterv1.Machine) (*etcd.Client, []quorum.Member, []quorum.Alarm, error) {
	cli, members, departed, err := engine.ObserveEtcd(ctx, r.Etcd, klogRef(cluster), secrets.cas.Etcd, secrets.cas.EtcdTrust, r.EtcdClientLifetime, cp, machines)
	return cli, r.catchUp.Observe(members, r.Now()), departed, err
}

// build turns the observation into the planner's State.
func (o *observation) build(cp *controlplanev1.QuorumControlPlane, cluster *clusterv1.Cluster, now time.Time, tun quorum.Tunables) {
	s := quorum.State{
		Desired:        int(ptr.Deref(cp.Spec.Replicas, 1)),
		Topology:       o.topology(),
		Strategy:       strategy(cp.Spec.Rollout.Strategy),
		FailureDomains: engine.ControlPlaneFailureDomains(cluster),
		Members:        o.Members,
		MembersUnknown: o.MembersErr != nil,
		Bootstrapped:   o.initialized || etcdBootstrapped(cp) || len(o.Members) > 0,
		DepartedAlarms: o.DepartedAlarms,
		// The spec's quota; a member running another one is restarted
		// in place with it.
		QuotaBackendBytes: engine.QuotaBackendBytes(cp.Spec.Etcd.Stacked.QuotaBackendBytes, cp.Spec.Etcd.Stacked.ExtraArgs),
		Now:               now,
		Tunables:          engine.MaintenanceTunables(tun, cp.Spec.Etcd.Stacked.Maintenance),
	}
	if o.external != nil {
		s.ExternalEtcdProblem = o.external.problem
	}
	engine.ReadCompaction(cp, &s)
	engine.ReadBackup(cp, backupSpecOf(cp, o.external != nil), o.Backup, o.BackupErr, &s)
	if !s.Bootstrapped {
		s.Restore = engine.PlannerRestore(o.restore, o.restoreErr)
	}
	if o.external == nil {
		s.Recovery = engine.PlannerRecovery(cp, cp.Spec.QuorumLossRecovery)
	}
	noSpace := quorum.NoSpaceRaised(s)
	o.remediationRefused, o.remediationNext = map[string]string{}, map[string]remediationData{}
	for _, m := range o.Machines {
		node := o.node(m)
		pm := plannerMachine(m, node, len(o.rollout.outdated(m)) == 0)
		pm.EtcdAnswersOnMachine = o.external == nil && etcdAnswersOnMachine(node, now)
		pastTimeout := o.unhealthyPastTimeout(m, pm, now, tun)
		if pm.Remediate && noSpace && !pastTimeout {
			pm.Remediate, pm.HoldRemediation = false, true
			o.remediationRefused[m.Name] = "held while etcd's NOSPACE alarm is raised: nothing can be written to the workload cluster, so Node health there is stale whatever the machines' health; QCP is recovering from the alarm, and remediates once it is disarmed"
		} else if pm.Remediate || pastTimeout {
			next, why, queued := o.remediation.verdict(m)
			if why != "" {
				pm.Remediate, pm.HoldRemediation, pm.RemediationQueued = false, true, queued
				o.remediationRefused[m.Name] = why
			} else {
				o.remediationNext[m.Name] = next
			}
		}
		if pair := o.EtcdClientPair; pair != nil && engine.EtcdClientStale(m, pair) && !pm.CertificatesRenewAt.IsZero() && pair.Cert.NotBefore.Before(pm.CertificatesRenewAt) {
			// Due since the pair it must hold was issued: the renewal
			// delivers it.
			pm.CertificatesRenewAt = pair.Cert.NotBefore
		}
		pm.AuthorityUpdate = engine.AuthorityUpdate(m, o.AuthorityKind, o.AuthorityWant)
		s.Machines = append(s.Machines, pm)
	}
	o.State = s
}

// unhealthyPastTimeout reports whether m, not being deleted, hosts a voter
// unhealthy for UnhealthyTimeout, which its machine (pm, as the planner
// sees it) does not say answers there: the planner then removes the member
// and replaces m without a health check's mark
// (quorum.view.dueForRemediation), so the remediation policy (one at a
// time, maxRetry, retryPeriod) must judge it as it judges a mark.
func (o *observation) unhealthyPastTimeout(m *clusterv1.Machine, pm quorum.Machine, now time.Time, tun quorum.Tunables) bool {
	if !m.DeletionTimestamp.IsZero() || pm.EtcdAnswersOnMachine {
		return false
	}
	mb, ok := o.MemberOn(m)
	if !ok || !mb.Voter() || mb.Healthy || mb.UnhealthySince.IsZero() {
		return false
	}
	return now.Sub(mb.UnhealthySince) >= tun.WithDefaults().UnhealthyTimeout
}

// remediating reports whether m is one the remediation policy judged: a
// machine marked, or one whose voter is unhealthy past the timeout.
func (o *observation) remediating(m *clusterv1.Machine) bool {
	_, refused := o.remediationRefused[m.Name]
	_, next := o.remediationNext[m.Name]
	return marked(m) || refused || next
}

// topology is where the control plane's etcd runs: on its machines, or
// elsewhere, which leaves the planner the machines alone.
func (o *observation) topology() quorum.Topology {
	if o.external != nil {
		return quorum.APIServersOnly
	}
	return quorum.Stacked
}

// rebuild builds the State again after the caller wrote some machines.
func (o *observation) rebuild(cp *controlplanev1.QuorumControlPlane, cluster *clusterv1.Cluster) {
	o.build(cp, cluster, o.State.Now, o.State.Tunables)
}

// node is machine's Node: the one CAPI core linked, else the one named
// after the machine (the agent registers under the machine's name).
func (o *observation) node(m *clusterv1.Machine) *corev1.Node {
	if m.Status.NodeRef.IsDefined() {
		if n, ok := o.nodes[m.Status.NodeRef.Name]; ok {
			return n
		}
	}
	return o.nodes[m.Name]
}

// inFlight reports whether something no watch reports is under way: the
// engine's membership changes (stacked etcd), or Nodes read without a
// watch. The reconciler then polls instead of waiting for one.
func (o *observation) inFlight() bool {
	return (o.external == nil && o.MembershipInFlight()) || o.nodesDirect || (o.initialized && o.nodes == nil)
}

// backupSpecOf is cp's spec.backup, which only stacked etcd has (the
// webhook refuses it on external etcd).
func backupSpecOf(cp *controlplanev1.QuorumControlPlane, external bool) *controlplanev1.BackupSpec {
	if external {
		return nil
	}
	return cp.Spec.Backup
}
