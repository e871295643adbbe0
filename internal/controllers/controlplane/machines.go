package controlplane

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// createMachine carries out CreateMachine through the engine: a machine
// cloned from spec.machineTemplate, with the records it starts with. The
// replacement of a marked machine carries the remediation in progress.
func (r *Reconciler) createMachine(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane,
	secrets *clusterSecrets, obs *observation, d quorum.Decision) error {
	tmpl := cp.Spec.MachineTemplate
	doc := r.bootstrapDocument(cluster, cp, secrets, obs)
	if doc.Etcd.Local != nil && doc.Etcd.Local.Restore != nil && secrets.restore != nil {
		// spec.restore's; a recovery from a backup has its own record.
		if err := engine.RecordRestore(ctx, r.Client, r.Recorder, cp, secrets.restore, r.Now()); err != nil {
			return err
		}
	}
	machine, err := engine.CreateMachine(ctx, r.Client, r.APIReader, r.Failpoints, engine.NewMachine{
		Owner: cp, OwnerRef: controlPlaneOwnerRef(cp), Cluster: cluster,
		Name:             cp.Name + "-" + util.RandomString(5),
		Labels:           machineLabels(cluster, cp),
		Annotations:      mergeInto(maps.Clone(tmpl.ObjectMeta.Annotations), machineRecords(cp, obs)),
		InfraAnnotations: tmpl.ObjectMeta.Annotations,
		InfraTemplate:    tmpl.Spec.InfrastructureRef, InfraTemplatePath: "spec.machineTemplate.spec.infrastructureRef",
		Version:         cp.Spec.Version,
		FailureDomain:   d.FailureDomain,
		Bootstrap:       doc,
		BootstrapFormat: r.BootstrapFormat,
		Deletion:        machineDeletion(cp),
		ReadinessGates:  tmpl.Spec.ReadinessGates,
		Taints:          tmpl.Spec.Taints,
	})
	if _, ok := readRemediation(cp, RemediationInProgressAnnotation); ok && machine != nil {
		delete(cp.Annotations, RemediationInProgressAnnotation) // the replacement carries it now
	}
	return err
}

// bootstrapDocument is the agent's bootstrap data for the next machine.
// With stacked etcd it starts a new etcd cluster when etcd never had a
// member, and otherwise joins through the client URLs of the started
// members; with external etcd it runs no member.
func (r *Reconciler) bootstrapDocument(cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, secrets *clusterSecrets, obs *observation) *bootstrap.Document {
	endpoint := cluster.Spec.ControlPlaneEndpoint
	address := endpoint.Host + ":" + strconv.Itoa(int(endpoint.Port))
	var doc *bootstrap.Document
	if secrets.external != nil {
		doc = bootstrap.NewExternal(cluster.Name, secrets.cas, address, externalBootstrap(secrets.external))
	} else {
		doc = bootstrap.NewStacked(cluster.Name, secrets.cas, address, obs.LocalMember())
		doc.Etcd.Local.QuotaBackendBytes = obs.State.QuotaBackendBytes
		restore := secrets.restore
		if restore == nil && obs.State.Recovery.Restoring {
			restore = obs.Restore // a recovery from a backup's first machine
		}
		if restore != nil && doc.Etcd.Local.Mode == bootstrap.EtcdModeNew {
			doc.Etcd.Local.Restore = restore.Bootstrap()
		}
	}
	doc.Versions.Kubernetes = cp.Spec.Version
	if v := cp.Spec.Etcd.Stacked.Version; v != "" {
		doc.Versions.Etcd = v
	}
	// ensureClusterNetwork recorded it; a reconcile stops before this on
	// a record it cannot read.
	if network, err := recordedNetwork(cp); err == nil {
		network.apply(doc)
	}
	doc.CertSANs = cp.Spec.APIServer.CertSANs
	doc.ExtraArgs = extraArgs(cp)
	doc.Tunables.CertificateValidityDays = ptr.Deref(cp.Spec.CertificateValidityPeriodDays, controlplanev1.DefaultCertificateValidityPeriodDays)
	if r.MachineCertificateLifetime > 0 {
		doc.Tunables.CertificateValidity = r.MachineCertificateLifetime.String()
	}
	return doc
}

// tendMachines keeps each machine's records (see records.go) and what is
// propagated in place (template metadata, deletion timeouts,
// minReadySeconds, the UpToDate condition) current, and clears health-check
// marks that went stale. These writes go through
// CAPI's patch helper as plain merge patches, not conditional on the
// resourceVersion observed: they only add bookkeeping, and the planner's
// steps that follow are (see act.go). obs is rebuilt from the written
// machines, so the plan sees them as they now are.
func (r *Reconciler) tendMachines(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, obs *observation) error {
	changed := false
	for i, m := range obs.Machines {
		want := m.DeepCopy()
		keepRecords(want, obs, r.Now())
		if want.DeletionTimestamp.IsZero() {
			propagate(want, cp, obs.rollout.outdated(want))
		}
		setOwnerRemediated(want, obs.remediationRefused[m.Name])
		stale := clearStaleMark(want)
		if apiequality.Semantic.DeepEqual(m, want) {
			continue
		}
		helper, err := patch.NewHelper(m, r.Client)
		if err != nil {
			return err
		}
		if err := helper.Patch(ctx, want, patch.WithOwnedConditions{Conditions: []string{clusterv1.MachineUpToDateCondition, clusterv1.MachineOwnerRemediatedCondition}}); err != nil {
			return fmt.Errorf("updating machine %s: %w", m.Name, err)
		}
		if stale {
			r.Recorder.Eventf(cp, corev1.EventTypeNormal, "StaleRemediationMarkCleared",
				"Machine %s is healthy again (its health check no longer fails): cleared its OwnerRemediated mark; it is not remediated", m.Name)
		}
		obs.Machines[i], changed = want, true
	}
	if changed {
		obs.rebuild(cp, cluster)
	}
	return nil
}

// keepRecords sets the records the planner needs on m (see
// engine.KeepRecords), and what its certificates told QCP: when they
// expire and, where they can be renewed in place, when they are due.
func keepRecords(m *clusterv1.Machine, obs *observation, now time.Time) {
	if rec, ok := obs.certificates[m.Name]; ok {
		if rec.RenewAt.IsZero() {
			engine.SetRecord(m, clusterv1.MachineCertificatesExpiryDateAnnotation, engine.FormatTime(rec.Expiry))
		} else {
			rec.Set(m, obs.external != nil)
		}
	}
	engine.KeepRecords(m, &obs.Observation, now)
}

// propagate sets what QCP changes on a machine in place, never by a
// rollout: the template's labels and annotations (added or changed; a key
// removed from the template stays), the deletion timeouts, the readiness
// gates and taints, minReadySeconds and the UpToDate condition, which
// lists why the machine is outdated.
func propagate(m *clusterv1.Machine, cp *controlplanev1.QuorumControlPlane, outdated []string) {
	meta := cp.Spec.MachineTemplate.ObjectMeta
	if len(meta.Labels) > 0 {
		m.Labels = mergeInto(m.Labels, meta.Labels)
	}
	if len(meta.Annotations) > 0 {
		m.Annotations = mergeInto(m.Annotations, meta.Annotations)
	}
	m.Spec.Deletion = machineDeletion(cp)
	m.Spec.ReadinessGates = cp.Spec.MachineTemplate.Spec.ReadinessGates
	m.Spec.Taints = cp.Spec.MachineTemplate.Spec.Taints
	m.Spec.MinReadySeconds = ptr.To[int32](0)
	cond := metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionTrue, Reason: clusterv1.MachineUpToDateReason}
	if len(outdated) > 0 {
		cond = metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionFalse, Reason: clusterv1.MachineNotUpToDateReason,
			Message: "* " + strings.Join(outdated, "\n* ")}
	}
	conditions.Set(m, cond)
}

func normalizeVersion(v string) string { return "v" + strings.TrimPrefix(v, "v") }

func machineLabels(cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane) map[string]string {
	return mergeInto(map[string]string{
		clusterv1.ClusterNameLabel:             cluster.Name,
		clusterv1.MachineControlPlaneLabel:     "",
		clusterv1.MachineControlPlaneNameLabel: cp.Name,
	}, cp.Spec.MachineTemplate.ObjectMeta.Labels)
}

// nodeDeletionTimeoutSeconds is CAPI's default for a Machine's node
// deletion timeout, which its Machine webhook sets when it is unset
// (sigs.k8s.io/cluster-api/core/webhooks/admission; importing that package
// would link CAPI core's webhook dependencies into qcp-manager).
const nodeDeletionTimeoutSeconds = int32(10)

// machineDeletion is the machines' deletion spec, with the node deletion
// timeout defaulted as CAPI's Machine webhook defaults it: otherwise every
// reconcile patched it back to unset on every machine, and the webhook set
// it again (a write to the API server per machine per reconcile, in vain).
func machineDeletion(cp *controlplanev1.QuorumControlPlane) clusterv1.MachineDeletionSpec {
	d := cp.Spec.MachineTemplate.Spec.Deletion
	return clusterv1.MachineDeletionSpec{
		NodeDrainTimeoutSeconds:        d.NodeDrainTimeoutSeconds,
		NodeVolumeDetachTimeoutSeconds: d.NodeVolumeDetachTimeoutSeconds,
		NodeDeletionTimeoutSeconds:     ptr.To(ptr.Deref(d.NodeDeletionTimeoutSeconds, nodeDeletionTimeoutSeconds)),
	}
}

func mergeInto(dst, src map[string]string) map[string]string {
	if dst == nil {
		dst = map[string]string{}
	}
	maps.Copy(dst, src)
	return dst
}

func controlPlaneOwnerRef(cp *controlplanev1.QuorumControlPlane) metav1.OwnerReference {
	return *metav1.NewControllerRef(cp, controlplanev1.GroupVersion.WithKind("QuorumControlPlane"))
}

// machineRecords are the annotations a new machine starts with: what it is
// created from and, when it replaces a machine a health check marked,
// which one (RemediationForAnnotation).
func machineRecords(cp *controlplanev1.QuorumControlPlane, obs *observation) map[string]string {
	a := map[string]string{MachineSpecAnnotation: obs.rollout.want.annotation()}
	if cp.Spec.Etcd.IsStacked() {
		a[engine.QuotaAnnotation] = strconv.FormatInt(obs.State.QuotaBackendBytes, 10)
	}
	if pair := obs.EtcdClientPair; pair != nil {
		a[engine.EtcdClientSerialAnnotation] = engine.SerialOf(pair)
	}
	if d, ok := readRemediation(cp, RemediationInProgressAnnotation); ok {
		a[RemediationForAnnotation] = d.String()
	}
	return a
}
