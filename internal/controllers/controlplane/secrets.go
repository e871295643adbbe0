// Package controlplane is the QuorumControlPlane provider. This file holds
// the Secrets a control plane owns: its certificate authorities, the
// kubeconfig CAPI core reaches the workload cluster through, and each
// machine's bootstrap data.
package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/kubeconfig"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// EnsureCertificateAuthorities looks up the cluster's authorities
// (<cluster>-ca, -etcd, -proxy and the service-account key <cluster>-sa)
// and creates those that are missing, owned by owner. CAPI's util/secret
// does both, with CAPI's names, type and cluster-name label, as KCP uses
// it; an authority that exists is never replaced.
func EnsureCertificateAuthorities(ctx context.Context, c client.Client, cluster client.ObjectKey, owner metav1.OwnerReference) (*certs.ClusterCAs, error) {
	return ensureAuthorities(ctx, c, cluster, owner, true)
}

// ensureAuthorities is EnsureCertificateAuthorities; without withEtcd (the
// control plane's etcd is external) it leaves the etcd CA alone: whoever
// runs etcd provides it (seed 002's contract), and QCP must never generate
// one of its own in its place.
func ensureAuthorities(ctx context.Context, c client.Client, cluster client.ObjectKey, owner metav1.OwnerReference, withEtcd bool) (*certs.ClusterCAs, error) {
	cs := secret.NewCertificatesForInitialControlPlane(&bootstrapv1.ClusterConfiguration{EncryptionAlgorithm: certs.AuthorityAlgorithm})
	if !withEtcd {
		cs = slices.DeleteFunc(cs, func(crt *secret.Certificate) bool { return crt.Purpose == secret.EtcdCA })
	}
	// An existing Secret that cannot be used stops everything first: the
	// others are then neither generated nor read, and nothing is issued
	// from a half-read set of authorities.
	for _, crt := range cs {
		if err := engine.CheckAuthoritySecret(ctx, c, cluster, crt.Purpose); err != nil {
			return nil, err
		}
	}
	if err := cs.LookupOrGenerate(ctx, c, cluster, owner); err != nil {
		return nil, fmt.Errorf("ensuring the certificate authorities of cluster %s: %w", cluster, err)
	}
	byName := map[string]*corev1.Secret{}
	for _, crt := range cs {
		if crt.Secret != nil {
			byName[crt.Secret.Name] = crt.Secret
		}
	}
	read := certs.ClusterCAsFromSecrets
	if !withEtcd {
		read = certs.ClusterCAsWithoutEtcd
	}
	cas, err := read(cluster.Name, byName)
	if err != nil {
		return nil, fmt.Errorf("reading the certificate authorities of cluster %s: %w", cluster, err)
	}
	return cas, nil
}

// AuthoritiesAnnotation records, on a QuorumControlPlane, the authorities
// its machines were issued from: each Secret's purpose and the SHA-256 of
// its certificate (the service-account Secret: of its public key), as
// "ca=<hex>,etcd=<hex>,...". It is written the first time the authorities
// are read, and then only compared.
const AuthoritiesAnnotation = "controlplane.cluster.x-k8s.io/qcp-authorities"

// replacedAuthorityError is an authority's Secret that holds another
// authority than the recorded one.
type replacedAuthorityError struct {
	secret string
}

func (e *replacedAuthorityError) Error() string {
	return fmt.Sprintf("Secret %s holds another certificate authority than the one this control plane's machines were issued from (annotation %s); "+
		"replacing an authority by hand is a rotation without its stages, which would cut the machines off from each other, so QCP does not use it "+
		"and changes nothing while it is there: put the previous authority back in the Secret, and rotate it with spec.certificates.rotation (EtcdCA, ClusterCA, FrontProxyCA, ServiceAccountKey)",
		e.secret, AuthoritiesAnnotation)
}

// keepAuthorities compares the authorities in use with the ones recorded
// on cp, and records them if none are: a replaced one is refused. ext's
// etcd CA, when etcd is external, is the owner's: its certificate counts.
func keepAuthorities(cp *controlplanev1.QuorumControlPlane, cluster string, cas *certs.ClusterCAs, ext *externalEtcd) error {
	now := map[secret.Purpose]string{secret.ClusterCA: authoritySum(secret.ClusterCA, cas.Cluster), secret.FrontProxyCA: authoritySum(secret.FrontProxyCA, cas.FrontProxy),
		secret.ServiceAccount: authoritySum(secret.ServiceAccount, cas.ServiceAccount)}
	switch {
	case ext != nil:
		now[secret.EtcdCA] = sum(ext.caCert)
	case cas.Etcd != nil:
		now[secret.EtcdCA] = authoritySum(secret.EtcdCA, cas.Etcd)
	}
	recorded, ok := cp.Annotations[AuthoritiesAnnotation]
	if !ok {
		parts := make([]string, 0, len(now))
		for p, h := range now {
			parts = append(parts, string(p)+"="+h)
		}
		slices.Sort(parts)
		if cp.Annotations == nil {
			cp.Annotations = map[string]string{}
		}
		cp.Annotations[AuthoritiesAnnotation] = strings.Join(parts, ",")
		return nil
	}
	for _, part := range strings.Split(recorded, ",") {
		p, h, _ := strings.Cut(part, "=")
		if have, ok := now[secret.Purpose(p)]; ok && have != h {
			return &replacedAuthorityError{secret: secret.Name(cluster, secret.Purpose(p))}
		}
	}
	return nil
}

// authoritySum is how AuthoritiesAnnotation names the authority of
// purpose: by its certificate's DER, or the service-account key by its PEM
// public key, as the Secret holds it.
func authoritySum(purpose secret.Purpose, ca *certs.KeyPair) string {
	if purpose == secret.ServiceAccount {
		return sum(ca.CertPEM)
	}
	return sum(ca.Cert.Raw)
}

func sum(data []byte) string { h := sha256.Sum256(data); return hex.EncodeToString(h[:8]) }

// recordAuthority records ca as the authority of purpose in
// AuthoritiesAnnotation: a rotation's switch of the signer.
func recordAuthority(cp *controlplanev1.QuorumControlPlane, purpose secret.Purpose, ca *certs.KeyPair) {
	recorded, ok := cp.Annotations[AuthoritiesAnnotation]
	if !ok {
		return // keepAuthorities records them all
	}
	parts := strings.Split(recorded, ",")
	for i, part := range parts {
		if p, _, _ := strings.Cut(part, "="); p == string(purpose) {
			parts[i] = p + "=" + authoritySum(purpose, ca)
		}
	}
	cp.Annotations[AuthoritiesAnnotation] = strings.Join(parts, ",")
}

// EnsureKubeconfig keeps <cluster>-kubeconfig, an administrator kubeconfig
// for endpoint, current: it creates it if it is missing, and issues it
// again when its client certificate has less than half of lifetime left,
// was not signed by ca, or points elsewhere. It returns when the kubeconfig
// next needs issuing, for the caller to requeue at.
func EnsureKubeconfig(ctx context.Context, c client.Client, cluster client.ObjectKey, endpoint string, ca *certs.KeyPair, trust []byte,
	owner metav1.OwnerReference, lifetime time.Duration, now time.Time) (time.Time, error) {
	if trust == nil {
		trust = ca.CertPEM
	}
	issue := func() ([]byte, time.Time, error) {
		data, err := certs.AdminKubeconfigValidFor(cluster.Name, endpoint, ca, trust, now, lifetime)
		return data, now.Add(lifetime / 2), err
	}
	var existing corev1.Secret
	err := c.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: secret.Name(cluster.Name, secret.Kubeconfig)}, &existing)
	if apierrors.IsNotFound(err) {
		data, renewAt, err := issue()
		if err != nil {
			return time.Time{}, err
		}
		if err := c.Create(ctx, kubeconfig.GenerateSecretWithOwner(cluster, data, owner)); err != nil {
			return time.Time{}, fmt.Errorf("creating the kubeconfig of cluster %s: %w", cluster, err)
		}
		return renewAt, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the kubeconfig of cluster %s: %w", cluster, err)
	}
	if renewAt, ok := kubeconfigCurrent(existing.Data[secret.KubeconfigDataName], cluster.Name, endpoint, ca, trust, lifetime, now); ok {
		return renewAt, nil
	}
	data, renewAt, err := issue()
	if err != nil {
		return time.Time{}, err
	}
	existing.Data = map[string][]byte{secret.KubeconfigDataName: data}
	if err := c.Update(ctx, &existing); err != nil {
		return time.Time{}, fmt.Errorf("issuing the kubeconfig of cluster %s again: %w", cluster, err)
	}
	return renewAt, nil
}

// kubeconfigCurrent reports whether data points at endpoint, trusting
// trust, with a client certificate from ca that has at least half of
// lifetime left, and when it will not.
func kubeconfigCurrent(data []byte, clusterName, endpoint string, ca *certs.KeyPair, trust []byte, lifetime time.Duration, now time.Time) (time.Time, bool) {
	cfg, err := clientcmd.Load(data)
	if err != nil || cfg.Clusters[clusterName] == nil || cfg.Clusters[clusterName].Server != endpoint ||
		!bytes.Equal(cfg.Clusters[clusterName].CertificateAuthorityData, trust) {
		return time.Time{}, false
	}
	for _, user := range cfg.AuthInfos {
		crt, err := certs.ParseCert(user.ClientCertificateData)
		if err != nil || crt.CheckSignatureFrom(ca.Cert) != nil {
			return time.Time{}, false
		}
		renewAt := crt.NotAfter.Add(-lifetime / 2)
		return renewAt, now.Before(renewAt)
	}
	return time.Time{}, false
}

// clusterSecrets is what reconciling the control plane's Secrets yields.
type clusterSecrets struct {
	cas *certs.ClusterCAs
	// external is the external etcd and the contract Secrets' material;
	// nil for stacked etcd.
	external *externalEtcd
	// renewAt is when the kubeconfig next needs issuing.
	renewAt time.Time
	// rotation is the CA rotation that runs; nil if none.
	rotation *rotation
	// restore is the snapshot the first machine restores, found and
	// checked before the authorities; nil when etcd starts empty, or
	// has data already. restoreErr is why it cannot be used, once the
	// first machine was created.
	restore    *engine.Restore
	restoreErr error
}

// ensureSecrets keeps the authorities and the kubeconfig, owned by cp, and
// reports them in CertificatesAvailable. ext is the external etcd, nil for
// stacked etcd.
func (r *Reconciler) ensureSecrets(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane, ext *externalEtcd) (*clusterSecrets, error) {
	key, owner := client.ObjectKeyFromObject(cluster), controlPlaneOwnerRef(cp)
	fail := func(err error) (*clusterSecrets, error) {
		cond := metav1.Condition{Type: controlplanev1.CertificatesAvailableCondition, Status: metav1.ConditionFalse,
			Reason: controlplanev1.CertificatesInternalErrorReason, Message: "Please check controller logs for errors"}
		if invalid := (*engine.InvalidAuthorityError)(nil); errors.As(err, &invalid) {
			cond.Reason, cond.Message = controlplanev1.CertificateAuthorityInvalidReason, invalid.Error()
		}
		if replaced := (*replacedAuthorityError)(nil); errors.As(err, &replaced) {
			cond.Reason, cond.Message = controlplanev1.CertificateAuthorityReplacedReason, replaced.Error()
		}
		conditions.Set(cp, cond)
		return nil, err
	}
	cas, err := ensureAuthorities(ctx, r.Client, key, owner, ext == nil)
	if err != nil {
		return fail(err)
	}
	if err := keepRotatedAuthority(cp, cas); err != nil {
		return fail(err)
	}
	if err := keepAuthorities(cp, cluster.Name, cas, ext); err != nil {
		return fail(err)
	}
	rt, err := r.ensureRotation(ctx, cluster, cp, cas)
	if err != nil {
		return fail(err)
	}
	if rt != nil {
		rt.apply(cas)
	}
	endpoint := cluster.Spec.ControlPlaneEndpoint
	renewAt, err := EnsureKubeconfig(ctx, r.Client, key, "https://"+net.JoinHostPort(endpoint.Host, strconv.Itoa(int(endpoint.Port))),
		cas.Cluster, cas.ClusterTrust, owner, r.KubeconfigLifetime, r.Now())
	if err != nil {
		return fail(err)
	}
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.CertificatesAvailableCondition, Status: metav1.ConditionTrue,
		Reason: controlplanev1.CertificatesAvailableReason})
	return &clusterSecrets{cas: cas, external: ext, renewAt: renewAt, rotation: rt}, nil
}
