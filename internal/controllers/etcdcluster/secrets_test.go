package etcdcluster

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/localenv"
)

// TestSecrets runs the EtcdCluster's Secrets against a real API server:
// an etcd CA Secret that cannot be used stops them before anything is
// written, with a condition naming the Secret and the fix; the client pair
// is issued, then signed again for the same key once two thirds of its
// life have passed.
func TestSecrets(t *testing.T) {
	env := localenv.StartForTest(t, localenv.Options{WithoutCAPI: true})
	ctx := context.Background()
	now := time.Now()
	r := &Reconciler{Client: env.Client, Now: func() time.Time { return now }, MachineCertificateLifetime: 6 * time.Minute}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "etcd-secrets", Namespace: "default"}}
	// A stored EtcdCluster: the local environment's garbage collector
	// deletes Secrets whose owner it cannot find.
	ec := &etcdv1.EtcdCluster{ObjectMeta: metav1.ObjectMeta{Name: "etcd-secrets", Namespace: "default"},
		Spec: etcdv1.EtcdClusterSpec{Version: "v3.6.16",
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "ProcessMachineTemplate", Name: "etcd-secrets"}}}
	if err := env.Client.Create(ctx, ec); err != nil {
		t.Fatal(err)
	}
	caName := secret.Name(cluster.Name, secret.EtcdCA)
	clientKey := client.ObjectKey{Namespace: "default", Name: secret.Name(cluster.Name, secret.APIServerEtcdClient)}

	t.Run("an etcd CA that cannot be used", func(t *testing.T) {
		bad := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: caName}, Type: clusterv1.ClusterSecretType,
			Data: map[string][]byte{secret.TLSCrtDataName: []byte("not PEM")}}
		if err := env.Client.Create(ctx, bad); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = env.Client.Delete(ctx, bad) }()
		if _, err := r.ensureSecrets(ctx, cluster, ec); err == nil {
			t.Fatal("an unusable etcd CA Secret was accepted")
		}
		c := conditions.Get(ec, etcdv1.EtcdCACertificatesAvailableCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != etcdv1.EtcdCACertificateInvalidReason ||
			!strings.Contains(c.Message, "Secret "+caName) || !strings.Contains(c.Message, "tls.key is missing") || !strings.Contains(c.Message, "put the authority's PEM certificate") {
			t.Errorf("EtcdCACertificatesAvailable %+v; want False, %s, naming the Secret, the problem and the fix", c, etcdv1.EtcdCACertificateInvalidReason)
		}
		if err := env.Client.Get(ctx, clientKey, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Errorf("the client pair was written beside an unusable etcd CA (%v)", err)
		}
	})

	t.Run("the client pair renewed for the same key", func(t *testing.T) {
		ca, err := r.ensureSecrets(ctx, cluster, ec)
		if err != nil {
			t.Fatal(err)
		}
		first := clientPair(t, env.Client, clientKey)
		if life := first.Cert.NotAfter.Sub(now); life <= 6*time.Minute-time.Second || life > 6*time.Minute {
			t.Errorf("the client pair lives %s; want the 6m of MachineCertificateLifetime", life)
		}
		now = now.Add(3 * time.Minute) // half its life: not due
		if _, err := r.ensureSecrets(ctx, cluster, ec); err != nil {
			t.Fatal(err)
		}
		if got := clientPair(t, env.Client, clientKey); got.Cert.SerialNumber.Cmp(first.Cert.SerialNumber) != 0 {
			t.Fatal("the client pair was renewed before two thirds of its life")
		}
		now = now.Add(2 * time.Minute) // five sixths: due
		if _, err := r.ensureSecrets(ctx, cluster, ec); err != nil {
			t.Fatal(err)
		}
		renewed := clientPair(t, env.Client, clientKey)
		if renewed.Cert.SerialNumber.Cmp(first.Cert.SerialNumber) == 0 || !renewed.Cert.NotAfter.After(first.Cert.NotAfter) {
			t.Fatalf("the client pair was not renewed once due: serial %s, notAfter %s", renewed.Cert.SerialNumber, renewed.Cert.NotAfter)
		}
		if string(renewed.KeyPEM) != string(first.KeyPEM) {
			t.Error("the renewal changed the key")
		}
		if err := renewed.Cert.CheckSignatureFrom(ca.Cert); err != nil {
			t.Errorf("the renewed certificate is not the etcd CA's: %v", err)
		}
	})
}

func clientPair(t *testing.T, c client.Client, key client.ObjectKey) *certs.KeyPair {
	t.Helper()
	var s corev1.Secret
	if err := c.Get(context.Background(), key, &s); err != nil {
		t.Fatal(err)
	}
	kp, err := certs.ParseKeyPair(s.Data[secret.TLSCrtDataName], s.Data[secret.TLSKeyDataName])
	if err != nil {
		t.Fatal(err)
	}
	return kp
}
