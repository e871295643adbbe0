package etcdcluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
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
		conditions.Set(ec, metav1.Condition{Type: etcdv1.EtcdCACertificatesAvailableCondition, Status: metav1.ConditionFalse,
			Reason: etcdv1.EtcdCACertificatesInternalErrorReason, Message: "Please check controller logs for errors"})
		return nil, err
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

// ensureAPIServerClient creates <cluster>-apiserver-etcd-client, issued
// from ca, if it is missing; one that exists is kept.
func (r *Reconciler) ensureAPIServerClient(ctx context.Context, cluster *clusterv1.Cluster, ca *certs.KeyPair, owner metav1.OwnerReference) error {
	name := secret.Name(cluster.Name, secret.APIServerEtcdClient)
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: name}, &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		return err
	}
	pair, err := certs.IssueEtcdClient(ca, APIServerEtcdClientName, r.Now())
	if err != nil {
		return err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cluster.Namespace,
			Labels:          map[string]string{clusterv1.ClusterNameLabel: cluster.Name},
			OwnerReferences: []metav1.OwnerReference{owner}},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{secret.TLSCrtDataName: pair.CertPEM, secret.TLSKeyDataName: pair.KeyPEM},
	}
	if err := r.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	return nil
}

func ownerRef(ec *etcdv1.EtcdCluster) metav1.OwnerReference {
	return *metav1.NewControllerRef(ec, etcdv1.GroupVersion.WithKind("EtcdCluster"))
}
