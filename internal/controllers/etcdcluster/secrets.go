package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// APIServerEtcdClientName is the common name of the API servers' etcd
// client certificate.
const APIServerEtcdClientName = "kube-apiserver-etcd-client"

// ensureSecrets keeps the two Secrets of seed 002's contract, owned by ec:
// <cluster>-etcd, the etcd CA (CAPI's util/secret generates it, with
// CAPI's type and cluster-name label, or finds it if the cluster has one),
// and <cluster>-apiserver-etcd-client, the API servers' client certificate
// and key. It reports them in EtcdCACertificatesAvailable and returns the
// CA.
func (r *Reconciler) ensureSecrets(ctx context.Context, cluster *clusterv1.Cluster, ec *etcdv1.EtcdCluster) (*certs.KeyPair, error) {
	key, owner := client.ObjectKeyFromObject(cluster), ownerRef(ec)
	fail := func(err error) (*certs.KeyPair, error) {
		cond := metav1.Condition{Type: etcdv1.EtcdCACertificatesAvailableCondition, Status: metav1.ConditionFalse,
			Reason: etcdv1.EtcdCACertificatesInternalErrorReason, Message: "Please check controller logs for errors"}
		if invalid := (*engine.InvalidAuthorityError)(nil); errors.As(err, &invalid) {
			cond.Reason, cond.Message = etcdv1.EtcdCACertificateInvalidReason, invalid.Error()
		}
		conditions.Set(ec, cond)
		return nil, err
	}
	// An etcd CA Secret that cannot be used stops here, before util/secret
	// would write anything beside it.
	if err := engine.CheckAuthoritySecret(ctx, r.Client, key, secret.EtcdCA); err != nil {
		return fail(err)
	}
	cs := secret.Certificates{&secret.Certificate{Purpose: secret.EtcdCA, CertFile: "etcd/ca.crt", KeyFile: "etcd/ca.key",
		KeyEncryptionAlgorithm: certs.AuthorityAlgorithm}}
	if err := cs.LookupOrGenerate(ctx, r.Client, key, owner); err != nil {
		return fail(fmt.Errorf("ensuring the etcd CA of cluster %s: %w", key, err))
	}
	ca, err := certs.ParseKeyPair(cs[0].KeyPair.Cert, cs[0].KeyPair.Key)
	if err != nil {
		return fail(fmt.Errorf("reading the etcd CA of cluster %s: %w", key, err))
	}
	if err := r.ensureAPIServerClient(ctx, cluster, ca, owner); err != nil {
		return fail(err)
	}
	conditions.Set(ec, metav1.Condition{Type: etcdv1.EtcdCACertificatesAvailableCondition, Status: metav1.ConditionTrue,
		Reason: etcdv1.EtcdCACertificatesAvailableReason})
	return ca, nil
}

// ensureAPIServerClient keeps <cluster>-apiserver-etcd-client: it creates
// it, issued from ca, if it is missing, and once two thirds of its
// certificate's life have passed (certs.RenewAt) it signs the certificate
// again for the same key, so that an API server that reads the key and the
// certificate at separate moments never pairs them wrongly. The control
// planes on the EtcdCluster deliver the renewed pair to their machines.
// A Secret the EtcdCluster does not own, or whose certificate ca did not
// sign, is kept as it is: it is its owner's to renew.
func (r *Reconciler) ensureAPIServerClient(ctx context.Context, cluster *clusterv1.Cluster, ca *certs.KeyPair, owner metav1.OwnerReference) error {
	name := secret.Name(cluster.Name, secret.APIServerEtcdClient)
	ca = ca.WithLeafValidity(r.MachineCertificateLifetime)
	var s corev1.Secret
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, &s)
	if err == nil {
		return r.renewAPIServerClient(ctx, &s, ca, owner)
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	pair, err := certs.IssueEtcdClient(ca, APIServerEtcdClientName, r.Now())
	if err != nil {
		return err
	}
	s = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cluster.Namespace,
			Labels:          map[string]string{clusterv1.ClusterNameLabel: cluster.Name},
			OwnerReferences: []metav1.OwnerReference{owner}},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{secret.TLSCrtDataName: pair.CertPEM, secret.TLSKeyDataName: pair.KeyPEM},
	}
	if err := r.Client.Create(ctx, &s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	return nil
}

// renewAPIServerClient signs the pair in s again once it is due, if the
// EtcdCluster owns s and ca signed it.
func (r *Reconciler) renewAPIServerClient(ctx context.Context, s *corev1.Secret, ca *certs.KeyPair, owner metav1.OwnerReference) error {
	ref := metav1.GetControllerOf(s)
	if ref == nil || ref.UID != owner.UID {
		return nil
	}
	pair, err := certs.ParseKeyPair(s.Data[secret.TLSCrtDataName], s.Data[secret.TLSKeyDataName])
	if err != nil {
		return fmt.Errorf("reading %s: %w", s.Name, err)
	}
	if r.Now().Before(certs.RenewAt(pair.Cert.NotBefore, pair.Cert.NotAfter)) {
		return nil
	}
	renewed, err := ca.Reissue(pair, r.Now())
	if err != nil {
		return fmt.Errorf("renewing %s: %w", s.Name, err)
	}
	s.Data[secret.TLSCrtDataName] = renewed.CertPEM
	if err := r.Client.Update(ctx, s); err != nil {
		return fmt.Errorf("renewing %s: %w", s.Name, err)
	}
	log.FromContext(ctx).Info("Renewed the API servers' etcd client certificate", "secret", s.Name,
		"notAfter", renewed.Cert.NotAfter.UTC().Format(time.RFC3339), "previousNotAfter", pair.Cert.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

func ownerRef(ec *etcdv1.EtcdCluster) metav1.OwnerReference {
	return *metav1.NewControllerRef(ec, etcdv1.GroupVersion.WithKind("EtcdCluster"))
}
