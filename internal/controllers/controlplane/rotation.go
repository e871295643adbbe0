package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// RotationAnnotation holds, on a QuorumControlPlane, where its etcd CA
// rotation stands (JSON of rotationState): the stage, and the key
// identifiers of the old and the new authority. It is the record a
// restarted manager resumes from; status.certificateRotation mirrors it.
const RotationAnnotation = "controlplane.cluster.x-k8s.io/qcp-certificate-rotation"

// The Secrets that hold a rotation's authorities while it runs, owned by
// the control plane: <cluster>-etcd-next the new one (QCP generates it, or
// takes the one a user put there before the rotation starts), and
// <cluster>-etcd-previous a copy of the old one. Both are deleted when the
// rotation completes.
const (
	nextEtcdCA     secret.Purpose = "etcd-next"
	previousEtcdCA secret.Purpose = "etcd-previous"
)

// rotationState is RotationAnnotation's value.
type rotationState struct {
	Kind    controlplanev1.CertificateAuthorityKind `json:"kind"`
	Trigger string                                  `json:"trigger"`
	Stage   controlplanev1.CertificateRotationStage `json:"stage"`
	Since   time.Time                               `json:"since"`
	// Old and New are the authorities' key identifiers.
	Old string `json:"old"`
	New string `json:"new"`
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

// stageDoes says, for the condition and the event, what each stage does
// and which clients it affects.
var stageDoes = map[controlplanev1.CertificateRotationStage]string{
	controlplanev1.RotationTrustBoth: "every machine trusts the new etcd CA beside the old one (kube-apiserver and etcd restart, one machine at a time)",
	controlplanev1.RotationReissue: "every etcd certificate is issued again from the new etcd CA, one machine at a time; " +
		"an etcd client that trusts only the old etcd CA fails from now on: give it both (the <cluster>-etcd-next Secret's tls.crt)",
	controlplanev1.RotationSwitchSigner: "the <cluster>-etcd Secret takes the new etcd CA",
	controlplanev1.RotationDistrust:     "every machine stops trusting the old etcd CA (kube-apiserver and etcd restart, one machine at a time)",
	controlplanev1.RotationCompleted:    "nothing trusts or holds the old etcd CA",
}

// rotation is an etcd CA rotation that runs: its state and both
// authorities.
type rotation struct {
	state    rotationState
	old, new *certs.KeyPair
	// waiting says what the stage waits for, for the condition.
	waiting string
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

// want is what a machine at the stage reports (EtcdAuthorityAnnotation).
func (rt *rotation) want() string {
	ids, _ := certs.BundleKeyIDs(rt.trust())
	return certs.KeyID(rt.signer().Cert) + "/" + ids
}

// authority is what SetEtcdAuthority gives a machine at the stage.
func (rt *rotation) authority() *agent.EtcdAuthority {
	s := rt.signer()
	return &agent.EtcdAuthority{CA: bootstrap.CertKey{Cert: string(s.CertPEM), Key: string(s.KeyPEM)}, Trust: string(rt.trust())}
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
		if want == nil || want.Trigger == st.Trigger || cas.Etcd == nil {
			return nil, nil
		}
		next, err := r.authoritySecret(ctx, key, nextEtcdCA, owner, true)
		if err != nil {
			return nil, err
		}
		if next.Cert.Equal(cas.Etcd.Cert) {
			return nil, &engine.InvalidAuthorityError{Secret: secret.Name(cluster.Name, nextEtcdCA), Problem: "it holds the etcd CA in use, not a new one"}
		}
		if err := r.writeAuthoritySecret(ctx, key, previousEtcdCA, owner, cas.Etcd); err != nil {
			return nil, err
		}
		st = rotationState{Kind: want.Kind, Trigger: want.Trigger, Old: certs.KeyID(cas.Etcd.Cert), New: certs.KeyID(next.Cert)}
		rt := &rotation{state: st, old: cas.Etcd, new: next}
		if err := r.recordStage(ctx, cp, rt, controlplanev1.RotationTrustBoth); err != nil {
			return nil, err
		}
		return rt, nil
	}
	rt := &rotation{state: st}
	if rt.old, err = r.authoritySecret(ctx, key, previousEtcdCA, owner, false); err == nil {
		rt.new, err = r.authoritySecret(ctx, key, nextEtcdCA, owner, false)
	}
	if err != nil {
		return nil, err
	}
	for _, c := range []struct {
		kp      *certs.KeyPair
		want    string
		purpose secret.Purpose
	}{{rt.old, st.Old, previousEtcdCA}, {rt.new, st.New, nextEtcdCA}} {
		if got := certs.KeyID(c.kp.Cert); got != c.want {
			return nil, &engine.InvalidAuthorityError{Secret: secret.Name(cluster.Name, c.purpose),
				Problem: fmt.Sprintf("it holds authority %s, and the rotation that runs (%s) recorded %s; put that one back", got, RotationAnnotation, c.want)}
		}
	}
	return rt, nil
}

// authoritySecret reads the authority in the Secret of purpose; with
// generate, a missing one is generated and written.
func (r *Reconciler) authoritySecret(ctx context.Context, cluster client.ObjectKey, purpose secret.Purpose, owner metav1.OwnerReference, generate bool) (*certs.KeyPair, error) {
	if err := engine.CheckAuthoritySecret(ctx, r.Client, cluster, purpose); err != nil {
		return nil, err
	}
	name := secret.Name(cluster.Name, purpose)
	var s corev1.Secret
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, &s)
	switch {
	case err == nil:
		return certs.ParseKeyPair(s.Data[secret.TLSCrtDataName], s.Data[secret.TLSKeyDataName])
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("reading Secret %s: %w", name, err)
	case !generate:
		return nil, &engine.InvalidAuthorityError{Secret: name, Problem: "it is missing while the rotation recorded in " + RotationAnnotation + " runs"}
	}
	ca, err := certs.NewCA("etcd-ca", r.Now())
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
	data, err := json.Marshal(rt.state)
	if err != nil {
		return err
	}
	// The stage and the authorities in use, together, in merge patches of
	// their own: a copy is patched, so that the server's answer does not
	// replace what this round set on cp and writes at its end.
	cp.Annotations[RotationAnnotation] = string(data)
	rt.setStatus(cp)
	meta, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		RotationAnnotation: string(data), AuthoritiesAnnotation: cp.Annotations[AuthoritiesAnnotation]}}})
	if err != nil {
		return err
	}
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
	if err := r.Client.Patch(ctx, cp.DeepCopy(), client.RawPatch(types.MergePatchType, meta)); err != nil {
		return fmt.Errorf("recording stage %s of the etcd CA rotation: %w", stage, err)
	}
	if err := r.Client.Status().Patch(ctx, cp.DeepCopy(), client.RawPatch(types.MergePatchType, status)); err != nil {
		return fmt.Errorf("recording stage %s of the etcd CA rotation in status: %w", stage, err)
	}
	r.Recorder.Eventf(cp, corev1.EventTypeNormal, "CertificateRotationStage", "etcd CA rotation (trigger %q) at stage %s: %s", rt.state.Trigger, stage, stageDoes[stage])
	log.FromContext(ctx).Info("etcd CA rotation stage recorded", "stage", stage, "trigger", rt.state.Trigger, "old", rt.state.Old, "new", rt.state.New)
	r.Failpoints.Hit(engine.FailpointRotationRecorded + string(stage))
	return nil
}

// setStatus mirrors the state into status.certificateRotation.
func (rt *rotation) setStatus(cp *controlplanev1.QuorumControlPlane) {
	cp.Status.CertificateRotation = &controlplanev1.CertificateRotationStatus{
		Kind: rt.state.Kind, Trigger: rt.state.Trigger, Stage: rt.state.Stage,
		StageStartTime: metav1.NewTime(rt.state.Since), Message: rt.waiting,
	}
}

// lagging names the first machine not yet at the stage, and what it
// lacks; "" when every machine that stays is.
func (rt *rotation) lagging(machines []*clusterv1.Machine) string {
	want := rt.want()
	for _, m := range machines {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		switch rec := m.Annotations[engine.EtcdAuthorityAnnotation]; {
		case rec == "":
			return fmt.Sprintf("waiting for QCP to read machine %s's certificates", m.Name)
		case rec != want:
			return fmt.Sprintf("waiting for machine %s to take the stage's etcd authorities (it reports %s, the stage wants %s)", m.Name, rec, want)
		}
	}
	return ""
}

// advanceRotation moves the rotation to its next stage once every machine
// is at its stage, after the stage's own work: SwitchSigner writes the new
// authority into <cluster>-etcd, and the end of Distrust deletes the
// rotation's two Secrets. It reports whether the stage changed.
func (r *Reconciler) advanceRotation(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, rt *rotation, machines []*clusterv1.Machine) (bool, error) {
	key, owner := client.ObjectKeyFromObject(cluster), controlPlaneOwnerRef(cp)
	stage := rt.state.Stage
	switch stage {
	case controlplanev1.RotationSwitchSigner:
		if err := r.writeAuthoritySecret(ctx, key, secret.EtcdCA, owner, rt.new); err != nil {
			return false, err
		}
		r.Failpoints.Hit(engine.FailpointAfterSignerSwitch)
		recordAuthority(cp, secret.EtcdCA, rt.new.Cert.Raw)
	default:
		if rt.waiting = rt.lagging(machines); rt.waiting != "" {
			return false, nil
		}
	}
	if stage == controlplanev1.RotationDistrust {
		for _, p := range []secret.Purpose{previousEtcdCA, nextEtcdCA} {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: secret.Name(cluster.Name, p)}}
			if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
				return false, fmt.Errorf("deleting Secret %s: %w", s.Name, err)
			}
		}
	}
	return true, r.recordStage(ctx, cp, rt, nextStage[stage])
}

// rotationCondition is CertificatesAvailable while a rotation runs.
func (rt *rotation) condition() metav1.Condition {
	msg := fmt.Sprintf("etcd CA rotation (trigger %q) at stage %s since %s: %s", rt.state.Trigger, rt.state.Stage,
		rt.state.Since.Format(time.RFC3339), stageDoes[rt.state.Stage])
	if rt.waiting != "" {
		msg += "; " + rt.waiting
	}
	return metav1.Condition{Type: controlplanev1.CertificatesAvailableCondition, Status: metav1.ConditionTrue,
		Reason: controlplanev1.CertificateAuthorityRotatingReason, Message: msg}
}

// keepRotatedAuthority records the new authority as the etcd CA in use
// when a manager stopped between SwitchSigner's write of <cluster>-etcd and
// the record of the next stage, which records it too: without, the Secret
// would be taken for one replaced by hand.
func keepRotatedAuthority(cp *controlplanev1.QuorumControlPlane, cas *certs.ClusterCAs) error {
	st, err := readRotation(cp)
	if err != nil {
		return err
	}
	if st.Stage == controlplanev1.RotationSwitchSigner && cas.Etcd != nil && certs.KeyID(cas.Etcd.Cert) == st.New {
		recordAuthority(cp, secret.EtcdCA, cas.Etcd.Cert.Raw)
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
