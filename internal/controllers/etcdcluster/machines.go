package etcdcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// MachineSpecAnnotation records what an etcd machine was created from, so
// that a later change of the spec makes it out of date.
const MachineSpecAnnotation = "etcd.cluster.x-k8s.io/qcp-machine-spec"

// machineSpec is what an etcd machine is created from.
type machineSpec struct {
	Version        string               `json:"version"`
	ExtraArgs      []controlplanev1.Arg `json:"extraArgs,omitempty"`
	Infrastructure string               `json:"infrastructure"`
}

func specOf(ec *etcdv1.EtcdCluster) machineSpec {
	return machineSpec{Version: ec.Spec.Version, ExtraArgs: ec.Spec.ExtraArgs, Infrastructure: ec.Spec.InfrastructureRef.Kind + "/" + ec.Spec.InfrastructureRef.Name}
}

// rollout judges which machines are out of date.
type rollout struct {
	want  machineSpec
	after time.Time
	now   time.Time
}

func newRollout(ec *etcdv1.EtcdCluster, now time.Time) rollout {
	return rollout{want: specOf(ec), after: ec.Spec.Rollout.After.Time, now: now}
}

// recordedSpec is what m was created from, as MachineSpecAnnotation says.
func recordedSpec(m *clusterv1.Machine) (machineSpec, bool) {
	var had machineSpec
	err := json.Unmarshal([]byte(m.Annotations[MachineSpecAnnotation]), &had)
	return had, err == nil
}

// outdated says why m must be replaced; empty when it is up to date.
func (ro rollout) outdated(m *clusterv1.Machine) []string {
	var why []string
	had, ok := recordedSpec(m)
	if !ok {
		return []string{fmt.Sprintf("the %s annotation does not say what the machine was created from", MachineSpecAnnotation)}
	}
	if had.Version != ro.want.Version {
		why = append(why, fmt.Sprintf("etcd %s, want %s", had.Version, ro.want.Version))
	}
	if !slices.Equal(had.ExtraArgs, ro.want.ExtraArgs) {
		why = append(why, "spec.extraArgs changed")
	}
	if had.Infrastructure != ro.want.Infrastructure {
		why = append(why, fmt.Sprintf("infrastructure template %s, want %s", had.Infrastructure, ro.want.Infrastructure))
	}
	if !ro.after.IsZero() && !ro.after.After(ro.now) && m.CreationTimestamp.Time.Before(ro.after) {
		why = append(why, "created before spec.rollout.after ("+ro.after.UTC().Format(time.RFC3339)+")")
	}
	return why
}

// next is when a machine goes out of date with time (rollout.after), or
// zero.
func (ro rollout) next(ms []*clusterv1.Machine) time.Time {
	if ro.after.IsZero() || !ro.after.After(ro.now) {
		return time.Time{}
	}
	for _, m := range ms {
		if m.CreationTimestamp.Time.Before(ro.after) {
			return ro.after
		}
	}
	return time.Time{}
}

// createMachine carries out CreateMachine through the engine: an
// etcd-only machine whose member starts a new cluster or joins through the
// started voters.
func (r *Reconciler) createMachine(ctx context.Context, cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster, ca *certs.KeyPair,
	obs *observation, d quorum.Decision) error {
	spec, err := json.Marshal(specOf(ec))
	if err != nil {
		return err
	}
	doc := bootstrap.NewEtcdOnly(ec.Name, ca, obs.LocalMember())
	doc.Versions.Etcd = ec.Spec.Version
	doc.Etcd.Local.QuotaBackendBytes = obs.State.QuotaBackendBytes
	if res := obs.restore.res; res != nil && doc.Etcd.Local.Mode == bootstrap.EtcdModeNew {
		doc.Etcd.Local.Restore = res.Bootstrap()
		if err := engine.RecordRestore(ctx, r.Client, r.Recorder, ec, res, r.Now()); err != nil {
			return err
		}
	}
	if r.MachineCertificateLifetime > 0 {
		doc.Tunables.CertificateValidity = r.MachineCertificateLifetime.String()
	}
	if len(ec.Spec.ExtraArgs) > 0 {
		var args []bootstrap.Arg
		for _, a := range ec.Spec.ExtraArgs {
			args = append(args, bootstrap.Arg{Name: a.Name, Value: a.Value})
		}
		doc.ExtraArgs = map[bootstrap.Component][]bootstrap.Arg{bootstrap.Etcd: args}
	}
	infraOwner := ownerRef(ec)
	infraOwner.Controller = nil
	meta := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Labels: machineLabels(cluster, ec),
		Annotations: map[string]string{MachineSpecAnnotation: string(spec),
			engine.QuotaAnnotation: strconv.FormatInt(obs.State.QuotaBackendBytes, 10)}}}
	setNodeRole(meta)
	_, err = engine.CreateMachine(ctx, r.Client, r.APIReader, r.Failpoints, engine.NewMachine{
		Owner: ec, OwnerRef: ownerRef(ec), InfraOwnerRef: &infraOwner, Cluster: cluster,
		Name:          ec.Name + "-" + util.RandomString(5),
		Labels:        meta.Labels,
		Annotations:   meta.Annotations,
		InfraTemplate: ec.Spec.InfrastructureRef, InfraTemplatePath: "spec.infrastructureRef",
		FailureDomain:   d.FailureDomain,
		Bootstrap:       doc,
		BootstrapFormat: r.BootstrapFormat,
	})
	return err
}

// tendMachines keeps each machine's records, its UpToDate condition, its
// etcd role marks and its Node's registration (nodes.go) current, and
// rebuilds the State from the written machines.
func (r *Reconciler) tendMachines(ctx context.Context, cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster, obs *observation) error {
	nodes, err := r.nodeMaterial(ctx, cluster)
	if err != nil {
		return err
	}
	changed := false
	for i, m := range obs.Machines {
		want := m.DeepCopy()
		if !obs.MemberServes(m) {
			// Its agent's endpoint answers once its member does.
		} else if rec, ok, err := obs.ReadPKI(ctx, m); ok {
			rec.Set(want, false)
		} else if err != nil {
			log.FromContext(ctx).V(1).Info("Cannot read the machine's certificates yet", "machine", m.Name, "err", err.Error())
		}
		if nodes != nil && obs.MemberServes(m) && m.DeletionTimestamp.IsZero() {
			r.registerNode(ctx, ec, nodes, obs.AgentTLS, m, want)
		}
		setNodeRole(want)
		engine.KeepRecords(want, &obs.Observation, r.Now())
		cond := metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionTrue, Reason: clusterv1.MachineUpToDateReason}
		if why := obs.rollout.outdated(want); len(why) > 0 {
			cond = metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionFalse, Reason: clusterv1.MachineNotUpToDateReason,
				Message: "* " + strings.Join(why, "\n* ")}
		}
		conditions.Set(want, cond)
		if apiequality.Semantic.DeepEqual(m, want) {
			continue
		}
		helper, err := patch.NewHelper(m, r.Client)
		if err != nil {
			return err
		}
		if err := helper.Patch(ctx, want, patch.WithOwnedConditions{Conditions: []string{clusterv1.MachineUpToDateCondition}}); err != nil {
			return fmt.Errorf("updating machine %s: %w", m.Name, err)
		}
		obs.Machines[i], changed = want, true
	}
	if changed {
		obs.build(ec, cluster, obs.State.Now, obs.State.Tunables)
	}
	return nil
}

// setNodeRole marks m as an etcd machine for its Node (nodes.go): the
// role label, which CAPI copies to the Node (NodeRestriction forbids a
// node to set it itself), and the annotations that spare its deletion a
// drain and a wait for volumes. Nothing runs on a Node tainted NoExecute,
// and the workload cluster may be down while etcd machines are replaced.
func setNodeRole(m *clusterv1.Machine) {
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Labels[agent.EtcdNodeRole] = ""
	m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation] = ""
	m.Annotations[clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation] = ""
}
