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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// createMachine carries out CreateMachine: the machine's bootstrap data,
// its infrastructure machine cloned from the template, and the Machine. The
// first two are owned by the control plane until the Machine exists, so a
// crash in between leaves nothing that outlives the control plane; CAPI
// core then makes the infrastructure machine the Machine's, and the
// bootstrap Secret is handed to the Machine here.
func (r *Reconciler) createMachine(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane,
	secrets *clusterSecrets, obs *observation, d quorum.Decision) error {
	name := cp.Name + "-" + util.RandomString(5)
	owner := controlPlaneOwnerRef(cp)
	labels := machineLabels(cluster, cp)

	doc := bootstrapDocument(cluster, cp, secrets, obs)
	data, err := BootstrapDataSecret(&clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cp.Namespace},
		Spec: clusterv1.MachineSpec{ClusterName: cluster.Name}}, doc)
	if err != nil {
		return err
	}
	data.OwnerReferences = []metav1.OwnerReference{owner}
	if err := r.Client.Create(ctx, data); err != nil {
		return fmt.Errorf("creating the bootstrap data of machine %s: %w", name, err)
	}
	r.Failpoints.Hit(engine.FailpointAfterBootstrapData)

	ref := cp.Spec.MachineTemplate.Spec.InfrastructureRef
	infra, err := r.cloneInfrastructure(ctx, cluster, cp, name, labels)
	if err != nil {
		r.cleanUp(ctx, data)
		return fmt.Errorf("cloning %s %s for machine %s (check spec.machineTemplate.spec.infrastructureRef): %w", ref.Kind, ref.Name, name, err)
	}
	r.Failpoints.Hit(engine.FailpointAfterInfraMachine)

	machine := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: cp.Namespace, Labels: labels,
			Annotations:     mergeInto(maps.Clone(cp.Spec.MachineTemplate.ObjectMeta.Annotations), machineRecords(cp, obs)),
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		Spec: clusterv1.MachineSpec{
			ClusterName:       cluster.Name,
			Version:           cp.Spec.Version,
			FailureDomain:     d.FailureDomain,
			Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To(data.Name)},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: ref.APIGroup, Kind: infra.GetKind(), Name: infra.GetName()},
			MinReadySeconds:   ptr.To[int32](0),
			Deletion:          machineDeletion(cp),
		},
	}
	if err := r.Client.Create(ctx, machine); err != nil {
		r.cleanUp(ctx, data, infra)
		return fmt.Errorf("creating machine %s: %w", name, err)
	}
	r.Failpoints.Hit(engine.FailpointAfterMachine)
	if _, ok := readRemediation(cp, RemediationInProgressAnnotation); ok {
		delete(cp.Annotations, RemediationInProgressAnnotation) // the replacement carries it now
	}

	before := data.DeepCopy()
	data.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(machine, clusterv1.GroupVersion.WithKind("Machine"))}
	if err := r.Client.Patch(ctx, data, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("handing the bootstrap data of machine %s to the machine: %w", name, err)
	}
	return nil
}

// cloneInfrastructure creates the machine's infrastructure machine from
// the template, owned by the control plane (CAPI core moves it to the
// Machine, as it does for KubeadmControlPlane).
func (r *Reconciler) cloneInfrastructure(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane,
	name string, labels map[string]string) (*unstructured.Unstructured, error) {
	tmpl, err := external.GetObjectFromContractVersionedRef(ctx, r.Client, cp.Spec.MachineTemplate.Spec.InfrastructureRef, cp.Namespace)
	if err != nil {
		return nil, err
	}
	owner := controlPlaneOwnerRef(cp)
	infra, err := external.GenerateTemplate(&external.GenerateTemplateInput{
		Template:    tmpl,
		TemplateRef: &corev1.ObjectReference{APIVersion: tmpl.GetAPIVersion(), Kind: tmpl.GetKind(), Name: tmpl.GetName(), Namespace: tmpl.GetNamespace()},
		Namespace:   cp.Namespace, Name: name, ClusterName: cluster.Name, OwnerRef: &owner,
		Labels: labels, Annotations: cp.Spec.MachineTemplate.ObjectMeta.Annotations,
	})
	if err != nil {
		return nil, err
	}
	if err := r.Client.Create(ctx, infra); err != nil {
		return nil, err
	}
	return infra, nil
}

// cleanUp deletes what a failed createMachine made; what it cannot delete
// the control plane still owns, and garbage collection takes with it.
func (r *Reconciler) cleanUp(ctx context.Context, objs ...client.Object) {
	for _, o := range objs {
		if err := r.Client.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			log.FromContext(ctx).Error(err, "Cleaning up after a failed machine creation", "object", o.GetName())
		}
	}
}

// bootstrapDocument is the agent's bootstrap data for the next machine: it
// starts a new etcd cluster when etcd never had a member, and otherwise
// joins through the client URLs of the started members.
func bootstrapDocument(cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, secrets *clusterSecrets, obs *observation) *bootstrap.Document {
	member := bootstrap.NewMember()
	if obs.State.Bootstrapped {
		var endpoints []string
		for _, m := range obs.Machines {
			if mb, ok := obs.MemberOn(m); ok && mb.Started() && mb.Voter() {
				endpoints = append(endpoints, engine.ClientURL(m))
			}
		}
		member = bootstrap.JoinMember(endpoints...)
	}
	endpoint := cluster.Spec.ControlPlaneEndpoint
	doc := bootstrap.NewStacked(cluster.Name, secrets.cas, endpoint.Host+":"+strconv.Itoa(int(endpoint.Port)), member)
	doc.Versions.Kubernetes = cp.Spec.Version
	if v := cp.Spec.Etcd.Stacked.Version; v != "" {
		doc.Versions.Etcd = v
	}
	doc.CertSANs = cp.Spec.APIServer.CertSANs
	doc.ExtraArgs = extraArgs(cp)
	doc.Tunables.CertificateValidityDays = ptr.Deref(cp.Spec.CertificateValidityPeriodDays, controlplanev1.DefaultCertificateValidityPeriodDays)
	return doc
}

// tendMachines keeps each machine's records (see records.go) and what is
// propagated in place (template metadata, deletion timeouts,
// minReadySeconds, the UpToDate condition) current. These writes go through
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
		obs.Machines[i], changed = want, true
	}
	if changed {
		obs.rebuild(cp, cluster)
	}
	return nil
}

// keepRecords sets the records the planner needs on m (see
// engine.KeepRecords), and when its certificates expire.
func keepRecords(m *clusterv1.Machine, obs *observation, now time.Time) {
	if expiry, ok := obs.certExpiry[m.Name]; ok {
		engine.SetRecord(m, clusterv1.MachineCertificatesExpiryDateAnnotation, expiry.UTC().Format(time.RFC3339))
	}
	engine.KeepRecords(m, &obs.Observation, now)
}

// propagate sets what QCP changes on a machine in place, never by a
// rollout: the template's labels and annotations (added or changed; a key
// removed from the template stays), the deletion timeouts, minReadySeconds
// and the UpToDate condition, which lists why the machine is outdated.
func propagate(m *clusterv1.Machine, cp *controlplanev1.QuorumControlPlane, outdated []string) {
	meta := cp.Spec.MachineTemplate.ObjectMeta
	if len(meta.Labels) > 0 {
		m.Labels = mergeInto(m.Labels, meta.Labels)
	}
	if len(meta.Annotations) > 0 {
		m.Annotations = mergeInto(m.Annotations, meta.Annotations)
	}
	m.Spec.Deletion = machineDeletion(cp)
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

func machineDeletion(cp *controlplanev1.QuorumControlPlane) clusterv1.MachineDeletionSpec {
	d := cp.Spec.MachineTemplate.Spec.Deletion
	return clusterv1.MachineDeletionSpec{
		NodeDrainTimeoutSeconds:        d.NodeDrainTimeoutSeconds,
		NodeVolumeDetachTimeoutSeconds: d.NodeVolumeDetachTimeoutSeconds,
		NodeDeletionTimeoutSeconds:     d.NodeDeletionTimeoutSeconds,
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
	if d, ok := readRemediation(cp, RemediationInProgressAnnotation); ok {
		a[RemediationForAnnotation] = d.String()
	}
	return a
}
