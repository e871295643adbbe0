package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// RotationAnnotation holds, on a QuorumControlPlane, where its CA
// rotation stands (JSON of rotationState): the stage, and the key
// identifiers of the old and the new authority. It is the record a
// restarted manager resumes from; status.certificateRotation mirrors it.
const RotationAnnotation = "controlplane.cluster.x-k8s.io/qcp-certificate-rotation"

// authorityOf is, by kind, the authority's Secret purpose (<cluster>-etcd,
// <cluster>-ca), the agent's name for it, the common name QCP gives an
// authority it generates, and the key of authenticationConfigMap that
// publishes it ("" for none). While a rotation runs, two more Secrets,
// owned by the control plane, hold its authorities: <purpose>-next the new
// one (QCP generates it, or takes the one a user put there before the
// rotation starts) and <purpose>-previous a copy of the old one. Both are
// deleted when the rotation completes.
var authorityOf = map[controlplanev1.CertificateAuthorityKind]struct {
	purpose    secret.Purpose
	agent      agent.AuthorityKind
	commonName string
	published  string
}{
	controlplanev1.CertificateAuthorityEtcdCA:       {secret.EtcdCA, agent.EtcdAuthorityKind, "etcd-ca", ""},
	controlplanev1.CertificateAuthorityClusterCA:    {secret.ClusterCA, agent.ClusterAuthorityKind, "kubernetes", "client-ca-file"},
	controlplanev1.CertificateAuthorityFrontProxyCA: {secret.FrontProxyCA, agent.FrontProxyAuthorityKind, "front-proxy-ca", "requestheader-client-ca-file"},
	// A key, not a certificate (certs.ServiceAccountKeyPair): no name.
	controlplanev1.CertificateAuthorityServiceAccountKey: {secret.ServiceAccount, agent.ServiceAccountAuthorityKind, "", ""},
}

// fieldsOf are cas's fields of the authority of kind: the authority, and
// the trust bundle machines hold (nil: the authority's alone).
func fieldsOf(cas *certs.ClusterCAs, kind controlplanev1.CertificateAuthorityKind) (**certs.KeyPair, *[]byte) {
	switch kind {
	case controlplanev1.CertificateAuthorityClusterCA:
		return &cas.Cluster, &cas.ClusterTrust
	case controlplanev1.CertificateAuthorityFrontProxyCA:
		return &cas.FrontProxy, &cas.FrontProxyTrust
	case controlplanev1.CertificateAuthorityServiceAccountKey:
		return &cas.ServiceAccount, &cas.ServiceAccountTrust
	}
	return &cas.Etcd, &cas.EtcdTrust
}

// current is the authority of kind in cas.
func current(cas *certs.ClusterCAs, kind controlplanev1.CertificateAuthorityKind) *certs.KeyPair {
	ca, _ := fieldsOf(cas, kind)
	return *ca
}

// rotationState is RotationAnnotation's value.
type rotationState struct {
	Kind    controlplanev1.CertificateAuthorityKind `json:"kind"`
	Trigger string                                  `json:"trigger"`
	Stage   controlplanev1.CertificateRotationStage `json:"stage"`
	Since   time.Time                               `json:"since"`
	// Old and New are the authorities' key identifiers.
	Old string `json:"old"`
	New string `json:"new"`
	// SignersMoved, in a cluster CA rotation, is when every control plane
	// machine's kube-controller-manager first signed certificate requests
	// with the new authority (the end of TrustBoth's machine steps): the
	// workers created until then hold kubelet certificates of the old one.
	SignersMoved time.Time `json:"signersMoved,omitzero"`
}

func (s rotationState) running() bool {
	return s.Stage != "" && s.Stage != controlplanev1.RotationCompleted
}

// nextStage follows each stage.
var nextStage = map[controlplanev1.CertificateRotationStage]controlplanev1.CertificateRotationStage{
	controlplanev1.RotationTrustBoth:    controlplanev1.RotationReissue,
	controlplanev1.RotationReissue:      controlplanev1.RotationSwitchSigner,
	controlplanev1.RotationSwitchSigner: controlplanev1.RotationDistrust,
	controlplanev1.RotationDistrust:     controlplanev1.RotationCompleted,
}

// stageDoes says, for the condition and the event, what each stage of a
// rotation of kind does and which clients it affects.
func stageDoes(kind controlplanev1.CertificateAuthorityKind, stage controlplanev1.CertificateRotationStage) string {
	what, restarts, clients, secretName := "etcd CA", "kube-apiserver and etcd restart", "an etcd client", "<cluster>-etcd"
	switch kind {
	case controlplanev1.CertificateAuthorityClusterCA:
		what, restarts, clients, secretName = "cluster CA", "kube-controller-manager and kube-scheduler restart", "a client of the API servers (a kubeconfig)", "<cluster>-ca"
	case controlplanev1.CertificateAuthorityFrontProxyCA:
		what, restarts, clients, secretName = "front-proxy CA", "kube-apiserver, kube-controller-manager and kube-scheduler restart",
			"an aggregated API server with a request header client CA file of its own", "<cluster>-proxy"
	case controlplanev1.CertificateAuthorityServiceAccountKey:
		return serviceAccountStageDoes(stage)
	}
	switch stage {
	case controlplanev1.RotationTrustBoth:
		does := fmt.Sprintf("every machine trusts the new %s beside the old one (%s, one machine at a time)", what, restarts)
		if kind == controlplanev1.CertificateAuthorityClusterCA {
			does += "; kube-controller-manager signs the Nodes' certificates with the new one, and the worker machines created before it does " +
				"must be replaced (a MachineDeployment rollout) before Reissue: their kubelets trust the old one alone"
		}
		return does
	case controlplanev1.RotationReissue:
		return fmt.Sprintf("every certificate of the %s is issued again from the new one, one machine at a time; "+
			"%s that trusts only the old %s fails from now on: give it both (the %s-next Secret's tls.crt)", what, clients, what, secretName)
	case controlplanev1.RotationSwitchSigner:
		return fmt.Sprintf("the %s Secret takes the new %s", secretName, what)
	case controlplanev1.RotationDistrust:
		return fmt.Sprintf("every machine stops trusting the old %s (%s, one machine at a time)", what, restarts)
	}
	return fmt.Sprintf("nothing trusts or holds the old %s", what)
}

// serviceAccountStageDoes is stageDoes of a service-account key rotation.
// Tokens are no certificates: a token lives on after the key that signed
// it stops signing, and no machine can tell which tokens are out there.
func serviceAccountStageDoes(stage controlplanev1.CertificateRotationStage) string {
	switch stage {
	case controlplanev1.RotationTrustBoth:
		return "every API server takes service-account tokens of the new key beside the old one (kube-apiserver restarts, one machine at a time)"
	case controlplanev1.RotationReissue:
		return "every API server signs new service-account tokens with the new key, and every controller manager new legacy token Secrets " +
			"(kube-apiserver and kube-controller-manager restart, one machine at a time); tokens of the old key are still taken"
	case controlplanev1.RotationSwitchSigner:
		return "the <cluster>-sa Secret takes the new key; then QCP waits for the tokens the old key signed to expire (the API servers' maximum token lifetime). " +
			"Legacy token Secrets the old key signed never expire: they stop working at Distrust; empty their token field and kube-controller-manager signs them again"
	case controlplanev1.RotationDistrust:
		return "every API server stops taking service-account tokens of the old key (kube-apiserver restarts, one machine at a time)"
	}
	return "nothing takes tokens of, or holds, the old service-account key"
}

// rotation is a CA rotation that runs: its state and both authorities.
type rotation struct {
	state    rotationState
	old, new *certs.KeyPair
	// waiting says what the stage waits for, for the condition; until,
	// when the wait ends at a time, when.
	waiting string
	until   time.Time
}

// signer is the authority the stage issues etcd certificates from.
func (rt *rotation) signer() *certs.KeyPair {
	if rt.state.Stage == controlplanev1.RotationTrustBoth {
		return rt.old
	}
	return rt.new
}

// trust is the PEM bundle the stage trusts.
func (rt *rotation) trust() []byte {
	if rt.state.Stage == controlplanev1.RotationDistrust {
		return rt.new.CertPEM
	}
	return certs.Bundle(rt.old, rt.new)
}

// csrSigner is, in a cluster CA rotation, the authority
// kube-controller-manager signs certificate requests with: the new one from
// the first stage on, so that a worker that joins during TrustBoth (and
// trusts both, from cluster-info) gets a kubelet certificate that
// survives Distrust. nil for other kinds.
func (rt *rotation) csrSigner() *certs.KeyPair {
	if rt.state.Kind != controlplanev1.CertificateAuthorityClusterCA {
		return nil
	}
	return rt.new
}

// want is what a machine at the stage reports (engine.AuthorityAnnotation).
func (rt *rotation) want() string {
	ids, _ := certs.BundleKeyIDs(rt.trust())
	rec := certs.KeyID(rt.signer().Cert) + "/" + ids
	if csr := rt.csrSigner(); csr != nil {
		rec += "/" + certs.KeyID(csr.Cert)
	}
	return rec
}

// authority is what SetAuthority gives a machine at the stage.
func (rt *rotation) authority() *agent.Authority {
	s := rt.signer()
	a := &agent.Authority{CA: bootstrap.CertKey{Cert: string(s.CertPEM), Key: string(s.KeyPEM)}, Trust: string(rt.trust())}
	if csr := rt.csrSigner(); csr != nil {
		a.Signer = &bootstrap.CertKey{Cert: string(csr.CertPEM), Key: string(csr.KeyPEM)}
	}
	return a
}

func readRotation(cp *controlplanev1.QuorumControlPlane) (rotationState, error) {
	var s rotationState
	v, ok := cp.Annotations[RotationAnnotation]
	if !ok {
		return s, nil
	}
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return s, fmt.Errorf("annotation %s does not parse (%w): it is QCP's record of a running certificate authority rotation; restore it", RotationAnnotation, err)
	}
	return s, nil
}

// ensureRotation reads the rotation that runs, or starts the one the spec
// asks for: it takes the new authority from <cluster>-etcd-next (generating
// it if the Secret does not exist), copies the old one to
// <cluster>-etcd-previous, and records the first stage. nil when none
// runs. An authority Secret that cannot be used is refused
// (engine.InvalidAuthorityError, which names it) and nothing changes.
func (r *Reconciler) ensureRotation(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, cas *certs.ClusterCAs) (*rotation, error) {
	st, err := readRotation(cp)
	if err != nil {
		return nil, err
	}
	key, owner := client.ObjectKeyFromObject(cluster), controlPlaneOwnerRef(cp)
	want := cp.Spec.Certificates.Rotation
	if !st.running() {
		if want == nil || want.Trigger == st.Trigger || current(cas, want.Kind) == nil {
			return nil, nil
		}
		in := current(cas, want.Kind)
		of := authorityOf[want.Kind]
		next, err := r.authoritySecret(ctx, key, engine.NextPurpose(of.purpose), of.commonName, owner, true)
		if err != nil {
			return nil, err
		}
		if next.Cert.Equal(in.Cert) {
			return nil, &engine.InvalidAuthorityError{Secret: secret.Name(cluster.Name, engine.NextPurpose(of.purpose)), Problem: "it holds the authority in use, not a new one"}
		}
		if err := r.writeAuthoritySecret(ctx, key, engine.PreviousPurpose(of.purpose), owner, in); err != nil {
			return nil, err
		}
		st = rotationState{Kind: want.Kind, Trigger: want.Trigger, Old: certs.KeyID(in.Cert), New: certs.KeyID(next.Cert)}
		rt := &rotation{state: st, old: in, new: next}
		if err := r.recordStage(ctx, cp, rt, controlplanev1.RotationTrustBoth); err != nil {
			return nil, err
		}
		return rt, nil
	}
	rt := &rotation{state: st}
	of := authorityOf[st.Kind]
	if rt.old, err = r.authoritySecret(ctx, key, engine.PreviousPurpose(of.purpose), "", owner, false); err == nil {
		rt.new, err = r.authoritySecret(ctx, key, engine.NextPurpose(of.purpose), "", owner, false)
	}
	if err != nil {
		return nil, err
	}
	for _, c := range []struct {
		kp      *certs.KeyPair
		want    string
		purpose secret.Purpose
	}{{rt.old, st.Old, engine.PreviousPurpose(of.purpose)}, {rt.new, st.New, engine.NextPurpose(of.purpose)}} {
		if got := certs.KeyID(c.kp.Cert); got != c.want {
			return nil, &engine.InvalidAuthorityError{Secret: secret.Name(cluster.Name, c.purpose),
				Problem: fmt.Sprintf("it holds authority %s, and the rotation that runs (%s) recorded %s; put that one back", got, RotationAnnotation, c.want)}
		}
	}
	return rt, nil
}

// authoritySecret reads the authority in the Secret of purpose; with
// generate, a missing one is generated, named commonName, and written.
func (r *Reconciler) authoritySecret(ctx context.Context, cluster client.ObjectKey, purpose secret.Purpose, commonName string, owner metav1.OwnerReference, generate bool) (*certs.KeyPair, error) {
	if err := engine.CheckAuthoritySecret(ctx, r.Client, cluster, purpose); err != nil {
		return nil, err
	}
	name := secret.Name(cluster.Name, purpose)
	var s corev1.Secret
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, &s)
	switch {
	case err == nil:
		return certs.ParseAuthority(purpose, s.Data[secret.TLSCrtDataName], s.Data[secret.TLSKeyDataName])
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("reading Secret %s: %w", name, err)
	case !generate:
		return nil, &engine.InvalidAuthorityError{Secret: name, Problem: "it is missing while the rotation recorded in " + RotationAnnotation + " runs"}
	}
	ca, err := certs.NewAuthority(purpose, commonName, r.Now())
	if err != nil {
		return nil, err
	}
	if err := r.writeAuthoritySecret(ctx, cluster, purpose, owner, ca); err != nil {
		return nil, err
	}
	return ca, nil
}

// writeAuthoritySecret creates or updates the Secret of purpose to hold
// ca, owned by the control plane.
func (r *Reconciler) writeAuthoritySecret(ctx context.Context, cluster client.ObjectKey, purpose secret.Purpose, owner metav1.OwnerReference, ca *certs.KeyPair) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: secret.Name(cluster.Name, purpose)}}
	data := map[string][]byte{secret.TLSCrtDataName: ca.CertPEM, secret.TLSKeyDataName: ca.KeyPEM}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(s), s)
	switch {
	case apierrors.IsNotFound(err):
		s.Labels = map[string]string{clusterv1.ClusterNameLabel: cluster.Name}
		s.OwnerReferences = []metav1.OwnerReference{owner}
		s.Type = clusterv1.ClusterSecretType
		s.Data = data
		err = r.Client.Create(ctx, s)
	case err == nil:
		s.Data = data
		err = r.Client.Update(ctx, s)
	}
	if err != nil {
		return fmt.Errorf("writing Secret %s: %w", s.Name, err)
	}
	return nil
}

// recordStage records that the rotation is at stage, on the control plane
// at once (the annotation, then status.certificateRotation), announces it
// with an event, and reaches the stage's failpoint.
func (r *Reconciler) recordStage(ctx context.Context, cp *controlplanev1.QuorumControlPlane, rt *rotation, stage controlplanev1.CertificateRotationStage) error {
	rt.state.Stage, rt.state.Since = stage, r.Now().UTC().Truncate(time.Second)
	if err := r.saveRotation(ctx, cp, rt); err != nil {
		return fmt.Errorf("recording stage %s of the %s rotation: %w", stage, rt.state.Kind, err)
	}
	rt.setStatus(cp)
	// A merge patch keeps a key it does not name: the message of the
	// last stage is removed by name.
	rot := map[string]any{"kind": rt.state.Kind, "trigger": rt.state.Trigger, "stage": stage,
		"stageStartTime": cp.Status.CertificateRotation.StageStartTime, "message": nil}
	if rt.waiting != "" {
		rot["message"] = rt.waiting
	}
	status, err := json.Marshal(map[string]any{"status": map[string]any{"certificateRotation": rot}})
	if err != nil {
		return err
	}
	if err := r.Client.Status().Patch(ctx, cp.DeepCopy(), client.RawPatch(types.MergePatchType, status)); err != nil {
		return fmt.Errorf("recording stage %s of the %s rotation in status: %w", stage, rt.state.Kind, err)
	}
	// A reason per stage: events of one reason and object beyond ten in ten
	// minutes are combined into one that keeps the last message alone, and
	// three rotations in a row announce fifteen stages.
	r.Recorder.Eventf(cp, corev1.EventTypeNormal, StageEventReason(stage), "%s rotation (trigger %q) at stage %s: %s", rt.state.Kind, rt.state.Trigger, stage, stageDoes(rt.state.Kind, stage))
	log.FromContext(ctx).Info("CA rotation stage recorded", "kind", rt.state.Kind, "stage", stage, "trigger", rt.state.Trigger, "old", rt.state.Old, "new", rt.state.New)
	r.Failpoints.Hit(engine.FailpointRotationRecorded + string(stage))
	return nil
}

// StageEventReason is the reason of the event that announces a rotation's
// stage: CertificateRotation<stage>, such as CertificateRotationTrustBoth.
func StageEventReason(stage controlplanev1.CertificateRotationStage) string {
	return "CertificateRotation" + string(stage)
}

// saveRotation records the rotation's state, and the authorities in use,
// on the control plane at once, in a merge patch of their own: a copy is
// patched, so that the server's answer does not replace what this round
// set on cp and writes at its end.
func (r *Reconciler) saveRotation(ctx context.Context, cp *controlplanev1.QuorumControlPlane, rt *rotation) error {
	data, err := json.Marshal(rt.state)
	if err != nil {
		return err
	}
	cp.Annotations[RotationAnnotation] = string(data)
	meta, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		RotationAnnotation: string(data), AuthoritiesAnnotation: cp.Annotations[AuthoritiesAnnotation]}}})
	if err != nil {
		return err
	}
	return r.Client.Patch(ctx, cp.DeepCopy(), client.RawPatch(types.MergePatchType, meta))
}

// setStatus mirrors the state into status.certificateRotation.
func (rt *rotation) setStatus(cp *controlplanev1.QuorumControlPlane) {
	cp.Status.CertificateRotation = &controlplanev1.CertificateRotationStatus{
		Kind: rt.state.Kind, Trigger: rt.state.Trigger, Stage: rt.state.Stage,
		StageStartTime: metav1.NewTime(rt.state.Since), Message: rt.waiting,
	}
}

// lagging names the first machine not yet at the stage, and what it
// lacks; "" when every machine is. A machine being deleted (a remediation's,
// whose components may not answer) is waited for until it is gone: until
// then its member or API server may still serve, and trust what the stage
// no longer does; a stage that moved on without it could record Completed
// while a member still took clients of the old authority.
func (rt *rotation) lagging(machines []*clusterv1.Machine) string {
	want, key := rt.want(), engine.AuthorityAnnotation(authorityOf[rt.state.Kind].agent)
	for _, m := range machines {
		switch rec := m.Annotations[key]; {
		case rec == want:
		case !m.DeletionTimestamp.IsZero():
			return fmt.Sprintf("waiting for machine %s, being deleted, to be gone: it reports authorities %q, the stage wants %s", m.Name, rec, want)
		case rec == "":
			return fmt.Sprintf("waiting for QCP to read machine %s's certificates", m.Name)
		case rec == engine.NoAuthority:
			return fmt.Sprintf("waiting for machine %s, which reports no %s authority (an agent older than QCP's rotations of it reports none): "+
				"roll the machine out (spec.rollout.after) and the rotation goes on with its replacement", m.Name, rt.state.Kind)
		default:
			return fmt.Sprintf("waiting for machine %s to take the stage's authorities (it reports %s, the stage wants %s)", m.Name, rec, want)
		}
	}
	return ""
}

// advanceRotation moves the rotation to its next stage once every machine
// is at its stage (lagging), after the stage's own work: SwitchSigner writes the new
// authority into <cluster>-etcd, and the end of Distrust deletes the
// rotation's two Secrets. It reports whether the stage changed.
func (r *Reconciler) advanceRotation(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, rt *rotation, machines []*clusterv1.Machine) (bool, error) {
	key, owner := client.ObjectKeyFromObject(cluster), controlPlaneOwnerRef(cp)
	stage, purpose := rt.state.Stage, authorityOf[rt.state.Kind].purpose
	switch stage {
	case controlplanev1.RotationSwitchSigner:
		if err := r.writeAuthoritySecret(ctx, key, purpose, owner, rt.new); err != nil {
			return false, err
		}
		r.Failpoints.Hit(engine.FailpointAfterSignerSwitch)
		recordAuthority(cp, purpose, rt.new)
		if rt.waiting = r.tokensOfOldKey(rt); rt.waiting != "" {
			return false, nil
		}
	default:
		if rt.waiting = rt.lagging(machines); rt.waiting != "" {
			return false, nil
		}
		if stage == controlplanev1.RotationTrustBoth && rt.state.Kind == controlplanev1.CertificateAuthorityClusterCA {
			waiting, err := r.oldWorkers(ctx, cluster, cp, rt)
			if rt.waiting = waiting; waiting != "" || err != nil {
				return false, err
			}
		}
	}
	if stage == controlplanev1.RotationDistrust {
		waiting, err := r.distrustPublished(ctx, cluster, cp, rt)
		if rt.waiting = waiting; waiting != "" || err != nil {
			return false, err
		}
		for _, p := range []secret.Purpose{engine.PreviousPurpose(purpose), engine.NextPurpose(purpose)} {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: secret.Name(cluster.Name, p)}}
			if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
				return false, fmt.Errorf("deleting Secret %s: %w", s.Name, err)
			}
		}
	}
	return true, r.recordStage(ctx, cp, rt, nextStage[stage])
}

// oldWorkers says, at the end of a cluster CA rotation's TrustBoth, which
// worker machines the rotation waits to see replaced before Reissue: those
// created before every control plane machine's kube-controller-manager
// signed with the new authority (recorded, the first time, as
// SignersMoved). Such a worker's kubelet trusts the old authority alone
// (the ca.crt it took from cluster-info) and holds a certificate of it:
// from Reissue on the API servers serve certificates of the new one, and
// from Distrust they refuse its certificate. QCP cannot change a kubelet's
// files; the worker's owner replaces it (a MachineDeployment rollout). A
// worker created later joined trusting both (cluster-info holds both from
// TrustBoth on) with a certificate of the new authority, and survives the
// rest. "" once none is left.
func (r *Reconciler) oldWorkers(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, rt *rotation) (string, error) {
	if rt.state.SignersMoved.IsZero() {
		rt.state.SignersMoved = r.Now().UTC().Truncate(time.Second)
		if err := r.saveRotation(ctx, cp, rt); err != nil {
			return "", err
		}
	}
	all, err := collections.GetFilteredMachinesForCluster(ctx, r.APIReader, cluster)
	if err != nil {
		return "", fmt.Errorf("listing the machines of cluster %s: %w", klogRef(cluster), err)
	}
	// A creation time has whole seconds: one in the second the signers
	// moved counts as before.
	old := all.Filter(collections.Not(collections.ControlPlaneMachines(cluster.Name)), collections.Not(engine.EtcdMachines),
		func(m *clusterv1.Machine) bool { return !m.CreationTimestamp.After(rt.state.SignersMoved) })
	if old.Len() == 0 {
		return "", nil
	}
	return fmt.Sprintf("waiting for the worker machines created by %s, when every kube-controller-manager signed with the new cluster CA, to be replaced: "+
		"their kubelets trust the old authority alone, and from Reissue on the API servers serve certificates of the new one; "+
		"roll out their MachineDeployments (for example clusterctl alpha rollout restart machinedeployment/<name>): %s",
		rt.state.SignersMoved.Format(time.RFC3339), strings.Join(sortedNames(old), ", ")), nil
}

// tokensOfOldKey says, at SwitchSigner of a service-account key rotation,
// until when the tokens the old key signed may still be valid: the stage
// started once no API server signed with the old key any more, and no
// token lives longer than ServiceAccountTokenLifetime. "" once none can
// be.
func (r *Reconciler) tokensOfOldKey(rt *rotation) string {
	if rt.state.Kind != controlplanev1.CertificateAuthorityServiceAccountKey {
		return ""
	}
	rt.until = rt.state.Since.Add(r.ServiceAccountTokenLifetime)
	if !r.Now().Before(rt.until) {
		return ""
	}
	return fmt.Sprintf("waiting until %s for the service-account tokens the old key signed to expire (the API servers' maximum token lifetime, %s, after the last one stopped signing with it)",
		rt.until.UTC().Format(time.RFC3339), r.ServiceAccountTokenLifetime)
}

// authenticationConfigMap is where kube-apiserver publishes, in the
// workload cluster, the authorities it takes clients of, for aggregated
// API servers and webhooks to authenticate its callers with.
var authenticationConfigMap = client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "extension-apiserver-authentication"}

// distrustPublished removes the old authority from authenticationConfigMap
// once every API server has stopped trusting it, and says what it waits
// for ("" once done). Each API server adds the authorities it trusts to
// those the ConfigMap holds and removes none but expired ones (so that API
// servers of different trust can run side by side), so without it an
// aggregated API server would go on taking client certificates of the
// distrusted authority for as long as that authority is valid. Every API
// server trusts the new authority alone by now (the stage's lagging
// check), so none adds the old one back.
func (r *Reconciler) distrustPublished(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, rt *rotation) (string, error) {
	key := authorityOf[rt.state.Kind].published
	if key == "" {
		return "", nil
	}
	waiting := fmt.Sprintf("waiting to remove the old authority from the workload cluster's ConfigMap %s", authenticationConfigMap)
	c, err := r.ClusterCache.GetUncachedClient(ctx, client.ObjectKeyFromObject(cluster))
	if err != nil {
		log.FromContext(ctx).Info("The workload cluster cannot be reached yet", "waitingFor", waiting, "err", err.Error())
		return waiting + ": the workload cluster cannot be reached yet", nil
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, authenticationConfigMap, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return waiting, fmt.Errorf("reading ConfigMap %s: %w", authenticationConfigMap, err)
	}
	if cm.Data[key] == "" {
		return "", nil
	}
	kept, removed, err := certs.WithoutAuthority([]byte(cm.Data[key]), rt.old.Cert)
	if err != nil {
		return waiting, fmt.Errorf("ConfigMap %s, key %s: %w", authenticationConfigMap, key, err)
	}
	if !removed {
		return "", nil
	}
	cm.Data[key] = string(kept)
	// An update, not a patch: it fails if an API server wrote the
	// ConfigMap since it was read, and the next round reads it again.
	if err := c.Update(ctx, &cm); err != nil {
		return waiting, fmt.Errorf("removing the old authority from ConfigMap %s: %w", authenticationConfigMap, err)
	}
	r.Recorder.Eventf(cp, corev1.EventTypeNormal, "AuthorityUnpublished", "The %s rotation removed the old authority %s from the workload cluster's ConfigMap %s", rt.state.Kind, rt.state.Old, authenticationConfigMap)
	return "", nil
}

// rotationCondition is CertificatesAvailable while a rotation runs.
func (rt *rotation) condition() metav1.Condition {
	msg := fmt.Sprintf("%s rotation (trigger %q) at stage %s since %s: %s", rt.state.Kind, rt.state.Trigger, rt.state.Stage,
		rt.state.Since.Format(time.RFC3339), stageDoes(rt.state.Kind, rt.state.Stage))
	if rt.waiting != "" {
		msg += "; " + rt.waiting
	}
	return metav1.Condition{Type: controlplanev1.CertificatesAvailableCondition, Status: metav1.ConditionTrue,
		Reason: controlplanev1.CertificateAuthorityRotatingReason, Message: msg}
}

// keepRotatedAuthority records the new authority as the one in use when a
// manager stopped between SwitchSigner's write of the authority's Secret and
// the record of the next stage, which records it too: without, the Secret
// would be taken for one replaced by hand.
func keepRotatedAuthority(cp *controlplanev1.QuorumControlPlane, cas *certs.ClusterCAs) error {
	st, err := readRotation(cp)
	if err != nil {
		return err
	}
	if in := current(cas, st.Kind); st.Stage == controlplanev1.RotationSwitchSigner && in != nil && certs.KeyID(in.Cert) == st.New {
		recordAuthority(cp, authorityOf[st.Kind].purpose, in)
	}
	return nil
}

// mirrorRotation writes status.certificateRotation from the record, for a
// rotation that completed (a running one's is rotation.setStatus).
func mirrorRotation(cp *controlplanev1.QuorumControlPlane) {
	if st, err := readRotation(cp); err == nil && st.Stage != "" {
		(&rotation{state: st}).setStatus(cp)
	}
}

// apply makes cas issue from, and trust, what the stage does, for new
// machines, the kubeconfig and qcp-manager's own clients.
func (rt *rotation) apply(cas *certs.ClusterCAs) {
	ca, trust := fieldsOf(cas, rt.state.Kind)
	*ca, *trust = rt.signer(), rt.trust()
	if csr := rt.csrSigner(); csr != nil {
		cas.ClusterSigner = csr
	}
}
