package etcdcluster

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/secret"

	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// observation is one look at an EtcdCluster: the engine's (machines,
// members, State) and which machines are out of date.
type observation struct {
	engine.Observation
	rollout rollout
	restore restoreSource
}

// restoreSource is the snapshot the first member restores (res), or why it
// cannot be used (err); both nil when etcd starts empty, or has data
// already.
type restoreSource struct {
	res *engine.Restore
	err error
}

// machines lists ec's Machines, live (never from the cache), by name.
func (r *Reconciler) machines(ctx context.Context, cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster) ([]*clusterv1.Machine, error) {
	ms, err := collections.GetFilteredMachinesForCluster(ctx, r.APIReader, cluster,
		collections.OwnedMachines(ec, etcdv1.GroupVersion.WithKind("EtcdCluster").GroupKind()))
	if err != nil {
		return nil, fmt.Errorf("listing the machines of EtcdCluster %s: %w", klogRef(ec), err)
	}
	return engine.SortedByName(ms.UnsortedList()), nil
}

// observe reads everything the planner needs: the machines and the members
// (over TLS, with a client certificate QCP issues itself from ca).
func (r *Reconciler) observe(ctx context.Context, cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster, ca *certs.KeyPair, restore restoreSource) (*observation, error) {
	machines, err := r.machines(ctx, cluster, ec)
	if err != nil {
		return nil, err
	}
	obs := &observation{Observation: engine.Observation{Machines: machines}, rollout: newRollout(ec, r.Now()), restore: restore}
	obs.Etcd, obs.Members, obs.DepartedAlarms, obs.MembersErr = engine.ObserveEtcd(ctx, r.Etcd, poolKey(ec), ca, nil, r.EtcdClientLifetime, ec, machines)
	if obs.Etcd != nil {
		obs.AgentTLS = obs.Etcd.TLSConfig()
	}
	obs.Members = r.catchUp.Observe(obs.Members, r.Now())
	obs.Backup, obs.BackupErr = engine.LoadBackup(ctx, r.Client, ec, "EtcdCluster", ec.Spec.Backup)
	if obs.Backup != nil {
		// An encrypted backup holds the etcd CA, so that the API servers'
		// client certificate keeps working against a restore.
		obs.Backup.Authorities = map[string]string{string(secret.EtcdCA): secret.Name(cluster.Name, secret.EtcdCA)}
	}
	obs.build(ec, cluster, r.Now(), r.tunables(ec))
	obs.ObserveSurvivors(ctx, &obs.State)
	return obs, nil
}

// tunables are the manager's, with ec's unhealthy-member timeout.
func (r *Reconciler) tunables(ec *etcdv1.EtcdCluster) quorum.Tunables {
	t := r.Tunables
	if s := ec.Spec.UnhealthyMemberTimeoutSeconds; s != nil {
		t.UnhealthyTimeout = time.Duration(*s) * time.Second
	}
	return engine.MaintenanceTunables(t, ec.Spec.Maintenance)
}

// build turns the observation into the planner's State. An etcd machine
// is healthy when its member is (its Node, registered only once the
// control plane exists, is not asked).
func (o *observation) build(ec *etcdv1.EtcdCluster, cluster *clusterv1.Cluster, now time.Time, tun quorum.Tunables) {
	s := quorum.State{
		Desired:        int(ptr.Deref(ec.Spec.Replicas, 3)),
		Topology:       quorum.External,
		Strategy:       quorum.SurgeFirst,
		FailureDomains: engine.ControlPlaneFailureDomains(cluster),
		Members:        o.Members,
		MembersUnknown: o.MembersErr != nil,
		Bootstrapped:   ec.Status.Initialized || len(o.Members) > 0,
		DepartedAlarms: o.DepartedAlarms,
		// The spec's quota; a member running another one is restarted
		// in place with it.
		QuotaBackendBytes: engine.QuotaBackendBytes(ec.Spec.QuotaBackendBytes, ec.Spec.ExtraArgs),
		Now:               now,
		Tunables:          tun,
	}
	engine.ReadCompaction(ec, &s)
	engine.ReadBackup(ec, ec.Spec.Backup, o.Backup, o.BackupErr, &s)
	if !s.Bootstrapped {
		s.Restore = engine.PlannerRestore(o.restore.res, o.restore.err)
	}
	s.Recovery = engine.PlannerRecovery(ec, ec.Spec.QuorumLossRecovery)
	if s.Recovery.TriggerBackup && s.Bootstrapped {
		// The trigger recovers from a survivor here as anywhere; with none,
		// the planner reports why it cannot restore instead.
		s.Restore = quorum.RestoreState{Requested: true, Problem: "an EtcdCluster does not recover from a backup yet: restore a new EtcdCluster with spec.restore.from"}
	}
	for _, m := range o.Machines {
		pm := engine.PlannerMachine(m, len(o.rollout.outdated(m)) == 0)
		mb, ok := o.MemberOn(m)
		pm.ComponentsHealthy = ok && mb.Healthy
		s.Machines = append(s.Machines, pm)
	}
	o.State = s
}

// machineLabels are on every machine of ec: the cluster's name, and ec's,
// which status.selector selects.
func machineLabels(cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster) map[string]string {
	return map[string]string{clusterv1.ClusterNameLabel: cluster.Name, etcdv1.EtcdClusterNameLabel: ec.Name}
}

func machineSelector(cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster) string {
	return labels.SelectorFromSet(machineLabels(cluster, ec)).String()
}
