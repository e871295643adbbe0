package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/localenv"
)

// secretsWorld is a real API server and an owner object for the Secrets.
type secretsWorld struct {
	c       client.Client
	cluster client.ObjectKey
	owner   metav1.OwnerReference
}

func newSecretsWorld(t *testing.T, env *localenv.Env, name string) secretsWorld {
	t.Helper()
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name + "-owner", Namespace: "default"}}
	if err := env.Client.Create(context.Background(), owner); err != nil {
		t.Fatal(err)
	}
	return secretsWorld{c: env.Client, cluster: client.ObjectKey{Namespace: "default", Name: name},
		owner: *metav1.NewControllerRef(owner, corev1.SchemeGroupVersion.WithKind("ConfigMap"))}
}

func (w secretsWorld) secret(t *testing.T, purpose secret.Purpose) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	if err := w.c.Get(context.Background(), client.ObjectKey{Namespace: w.cluster.Namespace, Name: secret.Name(w.cluster.Name, purpose)}, &s); err != nil {
		t.Fatalf("reading the %s secret: %v", purpose, err)
	}
	return &s
}

func TestSecrets(t *testing.T) {
	env := localenv.StartForTest(t, localenv.Options{WithoutCAPI: true})
	t.Run("certificate authorities", func(t *testing.T) { testCertificateAuthorities(t, newSecretsWorld(t, env, "cas")) })
	t.Run("kubeconfig rotation", func(t *testing.T) { testKubeconfigRotation(t, newSecretsWorld(t, env, "kcfg")) })
	t.Run("an authority that cannot be used", func(t *testing.T) { testInvalidAuthority(t, newSecretsWorld(t, env, "bad")) })
	t.Run("an authority replaced by hand", func(t *testing.T) { testReplacedAuthority(t, newSecretsWorld(t, env, "replaced")) })
}

// testReplacedAuthority: the authorities are recorded on the control plane
// the first time; a cluster CA Secret then replaced by hand with another
// valid authority is refused with a condition naming the Secret and the
// fix, and nothing is written (the kubeconfig is not issued from it); put
// back, it is taken again.
func testReplacedAuthority(t *testing.T, w secretsWorld) {
	ctx := context.Background()
	r := &Reconciler{Client: w.c, Now: time.Now}
	cp := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Name: w.cluster.Name, Namespace: w.cluster.Namespace, UID: w.owner.UID}}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: w.cluster.Name, Namespace: w.cluster.Namespace},
		Spec: clusterv1.ClusterSpec{ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "127.0.0.1", Port: 6443}}}
	// The Secrets are made first with the world's owner, which exists: the
	// local environment's garbage collector deletes Secrets whose owner
	// (cp, which is not stored) it cannot find.
	cas, err := EnsureCertificateAuthorities(ctx, w.c, w.cluster, w.owner)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureKubeconfig(ctx, w.c, w.cluster, "https://127.0.0.1:6443", cas.Cluster, nil, w.owner, DefaultKubeconfigLifetime, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ensureSecrets(ctx, cluster, cp, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cp.Annotations[AuthoritiesAnnotation], string(secret.ClusterCA)+"=") {
		t.Fatalf("the authorities were not recorded: %v", cp.Annotations)
	}
	original := w.secret(t, secret.ClusterCA)
	kubeconfig := w.secret(t, secret.Kubeconfig)
	other, err := certs.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	replaced := original.DeepCopy()
	replaced.Data = map[string][]byte{secret.TLSCrtDataName: other.CertPEM, secret.TLSKeyDataName: other.KeyPEM}
	if err := w.c.Update(ctx, replaced); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ensureSecrets(ctx, cluster, cp, nil); err == nil {
		t.Fatal("a cluster CA replaced by hand was used")
	}
	c := conditions.Get(cp, controlplanev1.CertificatesAvailableCondition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != controlplanev1.CertificateAuthorityReplacedReason ||
		!strings.Contains(c.Message, "Secret "+original.Name) || !strings.Contains(c.Message, "put the previous authority back") {
		t.Errorf("CertificatesAvailable %+v; want False, %s, naming Secret %s and the fix", c, controlplanev1.CertificateAuthorityReplacedReason, original.Name)
	}
	if got := w.secret(t, secret.Kubeconfig); got.ResourceVersion != kubeconfig.ResourceVersion {
		t.Error("the kubeconfig was written while the cluster CA was replaced")
	}
	back := w.secret(t, secret.ClusterCA)
	back.Data = original.Data
	if err := w.c.Update(ctx, back); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ensureSecrets(ctx, cluster, cp, nil); err != nil || !conditions.IsTrue(cp, controlplanev1.CertificatesAvailableCondition) {
		t.Errorf("the authority put back was not taken: %v", err)
	}
}

// testInvalidAuthority: a CA Secret whose certificate does not parse, or
// whose key is missing, stops the control plane's Secrets before anything
// is written: no other authority is generated, the Secret is left as it
// is, and CertificatesAvailable names the Secret, the problem and the fix.
func testInvalidAuthority(t *testing.T, w secretsWorld) {
	ctx := context.Background()
	good, err := certs.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		data    map[string][]byte
		problem string
	}{
		{"a certificate that does not parse", map[string][]byte{secret.TLSCrtDataName: []byte("not PEM"), secret.TLSKeyDataName: good.KeyPEM}, "PEM"},
		{"no private key", map[string][]byte{secret.TLSCrtDataName: good.CertPEM}, "tls.key is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.cluster.Namespace, Name: secret.Name(w.cluster.Name, secret.ClusterCA)},
				Type: clusterv1.ClusterSecretType, Data: tc.data}
			if err := w.c.Create(ctx, bad); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = w.c.Delete(ctx, bad) }()

			r := &Reconciler{Client: w.c}
			cp := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Name: w.cluster.Name, Namespace: w.cluster.Namespace, UID: w.owner.UID}}
			cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: w.cluster.Name, Namespace: w.cluster.Namespace}}
			if _, err := r.ensureSecrets(ctx, cluster, cp, nil); err == nil {
				t.Fatal("an unusable cluster CA Secret was accepted")
			}
			c := conditions.Get(cp, controlplanev1.CertificatesAvailableCondition)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != controlplanev1.CertificateAuthorityInvalidReason ||
				!strings.Contains(c.Message, "Secret "+bad.Name) || !strings.Contains(c.Message, tc.problem) || !strings.Contains(c.Message, "in tls.crt and its PEM private key in tls.key") {
				t.Errorf("CertificatesAvailable %+v; want False, %s, naming Secret %s, the problem (%s) and the fix",
					c, controlplanev1.CertificateAuthorityInvalidReason, bad.Name, tc.problem)
			}
			for _, p := range []secret.Purpose{secret.EtcdCA, secret.FrontProxyCA, secret.ServiceAccount, secret.Kubeconfig} {
				err := w.c.Get(ctx, client.ObjectKey{Namespace: w.cluster.Namespace, Name: secret.Name(w.cluster.Name, p)}, &corev1.Secret{})
				if !apierrors.IsNotFound(err) {
					t.Errorf("the %s Secret was written although the cluster CA cannot be used (%v)", p, err)
				}
			}
			if got := w.secret(t, secret.ClusterCA); got.ResourceVersion != bad.ResourceVersion {
				t.Errorf("the unusable Secret was changed (resourceVersion %s → %s)", bad.ResourceVersion, got.ResourceVersion)
			}
		})
	}
}

// testCertificateAuthorities: the four Secrets are created once, with
// CAPI's names, type, label and the owner; a second call changes nothing;
// a deleted one is created again and the others are kept.
func testCertificateAuthorities(t *testing.T, w secretsWorld) {
	ctx := context.Background()
	cas, err := EnsureCertificateAuthorities(ctx, w.c, w.cluster, w.owner)
	if err != nil {
		t.Fatal(err)
	}
	purposes := []secret.Purpose{secret.ClusterCA, secret.EtcdCA, secret.FrontProxyCA, secret.ServiceAccount}
	versions := map[secret.Purpose]string{}
	for _, p := range purposes {
		s := w.secret(t, p)
		if s.Type != clusterv1.ClusterSecretType || s.Labels[clusterv1.ClusterNameLabel] != w.cluster.Name {
			t.Errorf("%s: type %q, labels %v; want CAPI's type and the cluster-name label", s.Name, s.Type, s.Labels)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != w.owner.UID || s.OwnerReferences[0].Controller == nil || !*s.OwnerReferences[0].Controller {
			t.Errorf("%s: owner references %v, want the control plane as controller", s.Name, s.OwnerReferences)
		}
		versions[p] = s.ResourceVersion
	}
	for name, ca := range map[string]*certs.KeyPair{"cluster": cas.Cluster, "etcd": cas.Etcd, "front-proxy": cas.FrontProxy} {
		if !ca.Cert.IsCA || ca.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
			t.Errorf("the %s authority is not a CA that can sign", name)
		}
		if k, ok := ca.Key.(*ecdsa.PrivateKey); !ok || k.Curve != elliptic.P256() {
			t.Errorf("the %s authority's key is a %T, want ECDSA P-256 (an RSA key takes tens of ms to generate)", name, ca.Key)
		}
	}
	if cas.ServiceAccount == nil {
		t.Fatal("no service-account key pair")
	}
	if block, _ := pem.Decode(cas.ServiceAccount.KeyPEM); block == nil || block.Type != "EC PRIVATE KEY" {
		t.Error("the service-account key is not an ECDSA key")
	}

	again, err := EnsureCertificateAuthorities(ctx, w.c, w.cluster, w.owner)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Cluster.Cert.Equal(cas.Cluster.Cert) || !again.Etcd.Cert.Equal(cas.Etcd.Cert) {
		t.Error("a second call replaced an existing authority")
	}
	if err := w.c.Delete(ctx, w.secret(t, secret.FrontProxyCA)); err != nil {
		t.Fatal(err)
	}
	third, err := EnsureCertificateAuthorities(ctx, w.c, w.cluster, w.owner)
	if err != nil {
		t.Fatal(err)
	}
	if third.FrontProxy.Cert.Equal(cas.FrontProxy.Cert) {
		t.Error("the deleted front-proxy authority was not generated again")
	}
	for _, p := range []secret.Purpose{secret.ClusterCA, secret.EtcdCA, secret.ServiceAccount} {
		if v := w.secret(t, p).ResourceVersion; v != versions[p] {
			t.Errorf("%s changed (resourceVersion %s → %s) although it existed", p, versions[p], v)
		}
	}
}

// testKubeconfigRotation: the kubeconfig is created with a client
// certificate of the given lifetime, kept until half of it is gone, then
// issued again; a new endpoint or a new CA also issues it again.
func testKubeconfigRotation(t *testing.T, w secretsWorld) {
	ctx := context.Background()
	cas, err := EnsureCertificateAuthorities(ctx, w.c, w.cluster, w.owner)
	if err != nil {
		t.Fatal(err)
	}
	const lifetime = time.Hour
	t0 := time.Now().Truncate(time.Second)
	endpoint := "https://127.0.9.1:6443"
	ensure := func(at time.Time, endpoint string, ca *certs.KeyPair) (*corev1.Secret, time.Time) {
		t.Helper()
		renewAt, err := EnsureKubeconfig(ctx, w.c, w.cluster, endpoint, ca, nil, w.owner, lifetime, at)
		if err != nil {
			t.Fatal(err)
		}
		return w.secret(t, secret.Kubeconfig), renewAt
	}
	check := func(s *corev1.Secret, endpoint string, ca *certs.KeyPair, issuedAt time.Time) {
		t.Helper()
		cfg, err := clientcmd.Load(s.Data[secret.KubeconfigDataName])
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Clusters[w.cluster.Name].Server; got != endpoint {
			t.Errorf("kubeconfig server %s, want %s", got, endpoint)
		}
		crt, err := certs.ParseCert(cfg.AuthInfos["kubernetes-admin"].ClientCertificateData)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		if _, err := crt.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: issuedAt, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("client certificate does not verify as a client of the cluster CA: %v", err)
		}
		if !crt.NotAfter.Equal(issuedAt.Add(lifetime)) {
			t.Errorf("client certificate expires %s, want %s (issued %s, lifetime %s)", crt.NotAfter, issuedAt.Add(lifetime), issuedAt, lifetime)
		}
	}

	first, renewAt := ensure(t0, endpoint, cas.Cluster)
	check(first, endpoint, cas.Cluster, t0)
	if !renewAt.Equal(t0.Add(lifetime / 2)) {
		t.Errorf("renew at %s, want half-life %s", renewAt, t0.Add(lifetime/2))
	}
	if s, _ := ensure(t0.Add(29*time.Minute), endpoint, cas.Cluster); s.ResourceVersion != first.ResourceVersion {
		t.Error("issued again before half of its lifetime was gone")
	}
	t1 := t0.Add(31 * time.Minute)
	second, _ := ensure(t1, endpoint, cas.Cluster)
	if second.ResourceVersion == first.ResourceVersion {
		t.Fatal("not issued again after half of its lifetime")
	}
	check(second, endpoint, cas.Cluster, t1)

	moved := "https://127.0.9.2:6443"
	third, _ := ensure(t1, moved, cas.Cluster)
	check(third, moved, cas.Cluster, t1)
	otherCA, err := certs.NewCA("kubernetes", t1)
	if err != nil {
		t.Fatal(err)
	}
	fourth, _ := ensure(t1, moved, otherCA)
	check(fourth, moved, otherCA, t1)
}
