package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// serviceAccountTokenLifetime is how long the scenarios' qcp-manager waits,
// in a service-account key rotation, for tokens of the old key to expire.
// The API servers let a token live 24 hours (agent.ServiceAccountTokenMaxLifetime,
// and kube-apiserver takes no maximum under one); no suite can wait that
// out, so the scenarios shorten the wait and hold tokens that outlive it,
// which Distrust then cuts off, as it would cut off a token that outlived
// the real maximum.
const serviceAccountTokenLifetime = 30 * time.Second

// tokenAccount is the ServiceAccount the scenario's tokens are of.
const tokenAccount = "qcp-e2e-tokens"

// rotateServiceAccountKey rotates the service-account key of the
// scenario's control plane and checks what tokens of each key do. Before
// it, a bound token and a legacy token Secret (which kube-controller-manager
// signs) are taken; both are still taken at SwitchSigner, when a new token
// is signed by the new key. After it, <cluster>-sa holds the new key, the
// rotation's Secrets are gone, every machine signs with the new key and
// takes its tokens alone (by its agent and by its files), the old bound
// token and the legacy Secret's token are refused, a new token is taken,
// and the legacy Secret, its token emptied, is signed again and taken.
func (s *scenario) rotateServiceAccountKey(ctx context.Context) {
	s.t.Helper()
	oldKey := s.secretAuthority(ctx, secret.ServiceAccount)
	wl, err := s.workload(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: tokenAccount, Namespace: metav1.NamespaceDefault}}
	if _, err := wl.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		s.t.Fatal(err)
	}
	legacy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: tokenAccount + "-legacy", Namespace: sa.Namespace,
		Annotations: map[string]string{corev1.ServiceAccountNameKey: tokenAccount}}, Type: corev1.SecretTypeServiceAccountToken}
	if _, err := wl.CoreV1().Secrets(sa.Namespace).Create(ctx, legacy, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	oldToken := s.boundToken(ctx, wl, oldKey)
	oldLegacy := s.legacyToken(ctx, wl, legacy.Name, oldKey)
	s.checkToken(ctx, "the bound token of the old key", oldToken, true)
	s.checkToken(ctx, "the legacy token of the old key", oldLegacy, true)

	var newKey *certs.KeyPair
	s.rotateAuthority(ctx, controlplanev1.CertificateAuthorityServiceAccountKey, "3", func(ctx context.Context, stage controlplanev1.CertificateRotationStage) {
		if stage != controlplanev1.RotationSwitchSigner {
			return
		}
		// <cluster>-sa takes it during the stage.
		newKey = s.secretAuthority(ctx, secret.ServiceAccount+"-next")
		s.checkToken(ctx, "at SwitchSigner, the bound token of the old key", oldToken, true)
		s.checkToken(ctx, "at SwitchSigner, the legacy token of the old key", oldLegacy, true)
		s.checkToken(ctx, "at SwitchSigner, a new bound token", s.boundToken(ctx, wl, newKey), true)
	})
	if newKey == nil {
		s.t.Fatal("the rotation was never seen at SwitchSigner")
	}
	if got := s.secretAuthority(ctx, secret.ServiceAccount); !got.Cert.Equal(newKey.Cert) || got.Cert.Equal(oldKey.Cert) {
		s.t.Errorf("<cluster>-sa holds key %s; want the new key %s", certs.KeyID(got.Cert), certs.KeyID(newKey.Cert))
	}
	s.checkRotationSecretsGone(ctx, secret.ServiceAccount)
	s.checkMachinesSignWith(ctx, newKey)
	s.checkToken(ctx, "after the rotation, the bound token of the old key", oldToken, false)
	s.checkToken(ctx, "after the rotation, the legacy token of the old key", oldLegacy, false)
	s.checkToken(ctx, "after the rotation, a new bound token", s.boundToken(ctx, wl, newKey), true)

	// A legacy token Secret whose token is emptied is signed again, by the
	// new key.
	got, err := wl.CoreV1().Secrets(sa.Namespace).Get(ctx, legacy.Name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	delete(got.Data, corev1.ServiceAccountTokenKey)
	if _, err := wl.CoreV1().Secrets(sa.Namespace).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.checkToken(ctx, "the legacy token signed again", s.legacyToken(ctx, wl, legacy.Name, newKey), true)
}

// boundToken requests a token of tokenAccount, for the shortest lifetime
// the API server grants (10 minutes: longer than the rest of the
// scenario), and checks that key signed it.
func (s *scenario) boundToken(ctx context.Context, wl *kubernetes.Clientset, key *certs.KeyPair) string {
	s.t.Helper()
	seconds := int64(600)
	var token string
	s.eventually(time.Minute, "a token of "+tokenAccount, func(ctx context.Context) error {
		tr, err := wl.CoreV1().ServiceAccounts(metav1.NamespaceDefault).CreateToken(ctx, tokenAccount,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		token = tr.Status.Token
		return nil
	})
	s.checkSignedBy("a bound token", token, key)
	return token
}

// legacyToken waits for kube-controller-manager to put a token in the
// legacy token Secret name, and checks that key signed it.
func (s *scenario) legacyToken(ctx context.Context, wl *kubernetes.Clientset, name string, key *certs.KeyPair) string {
	s.t.Helper()
	var token string
	s.eventually(2*time.Minute, "kube-controller-manager's token in Secret "+name, func(ctx context.Context) error {
		sec, err := wl.CoreV1().Secrets(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if token = string(sec.Data[corev1.ServiceAccountTokenKey]); token == "" {
			return errors.New("no token yet")
		}
		return nil
	})
	s.checkSignedBy("the token of Secret "+name, token, key)
	return token
}

// checkSignedBy checks that token's key identifier is key's: the API
// server names a key by the SHA-256 of its public key's DER, which is what
// certs.KeyID holds of a service-account key.
func (s *scenario) checkSignedBy(what, token string, key *certs.KeyPair) {
	s.t.Helper()
	header, _, _ := strings.Cut(token, ".")
	data, err := base64.RawURLEncoding.DecodeString(header)
	var h struct {
		KeyID string `json:"kid"`
	}
	if err == nil {
		err = json.Unmarshal(data, &h)
	}
	if err != nil {
		s.t.Fatalf("%s: its header does not parse: %v", what, err)
	}
	if want := base64.RawURLEncoding.EncodeToString(key.Cert.SubjectKeyId); h.KeyID != want {
		s.t.Errorf("%s was signed by key %s; want %s", what, h.KeyID, want)
	}
}

// checkToken authenticates with token through the control plane endpoint
// (a SelfSubjectReview) and checks that it is taken, as tokenAccount, or
// refused (401). Other failures, a restarting API server's, are tried
// again for a minute.
func (s *scenario) checkToken(ctx context.Context, what, token string, taken bool) {
	s.t.Helper()
	cfg := s.kubeconfig(ctx)
	rc := &rest.Config{Host: cfg.Clusters[s.name].Server, Timeout: 10 * time.Second, BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cfg.Clusters[s.name].CertificateAuthorityData}}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		s.t.Fatal(err)
	}
	user := "system:serviceaccount:" + metav1.NamespaceDefault + ":" + tokenAccount
	var got error
	s.eventually(time.Minute, what+" answered", func(ctx context.Context) error {
		review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		switch {
		case apierrors.IsUnauthorized(err):
			got = err
		case err != nil:
			return err
		case review.Status.UserInfo.Username != user:
			got = fmt.Errorf("taken as %q", review.Status.UserInfo.Username)
		default:
			got = nil
		}
		return nil
	})
	switch {
	case taken && got != nil:
		s.t.Errorf("%s: %v; want it taken as %s", what, got, user)
	case !taken && got == nil:
		s.t.Errorf("%s was taken; want it refused", what)
	}
}

// checkMachinesSignWith checks that every machine signs tokens with key
// and takes tokens of key alone: by its agent's report and by its files.
func (s *scenario) checkMachinesSignWith(ctx context.Context, key *certs.KeyPair) {
	s.t.Helper()
	machines, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	host := &machinehost.Host{Root: s.mgmt.env.MachineRoot()}
	id := certs.KeyID(key.Cert)
	for _, m := range machines {
		rep, err := agent.GetPKI(ctx, s.etcdAgentTLS(), internalIP(&m))
		if err != nil {
			s.t.Errorf("machine %s: %v", m.Name, err)
			continue
		}
		if k := rep.ServiceAccountKeys; k == nil || k.Signer != id || strings.Join(k.Trusted, ",") != id {
			s.t.Errorf("machine %s reports service-account keys %+v; want %s alone", m.Name, k, id)
		}
		s.checkServiceAccountFiles(m, filepath.Join(host.DataDir(ns, m.Name), agent.PKIDir), id)
	}
}

// checkServiceAccountFiles checks machine m's sa.key and sa.pub under dir.
func (s *scenario) checkServiceAccountFiles(m clusterv1.Machine, dir, id string) {
	s.t.Helper()
	keyPEM, err := os.ReadFile(filepath.Join(dir, agent.ServiceAccountKeyFile))
	if err != nil {
		s.t.Error(err)
		return
	}
	if kp, err := certs.ServiceAccountKeyPair(keyPEM); err != nil || certs.KeyID(kp.Cert) != id {
		s.t.Errorf("machine %s: %s is not the new key (%v)", m.Name, agent.ServiceAccountKeyFile, err)
	}
	pub, err := os.ReadFile(filepath.Join(dir, agent.ServiceAccountTrustFile))
	if err != nil {
		s.t.Error(err)
		return
	}
	if ids, err := certs.BundleKeyIDs(pub); err != nil || ids != id {
		s.t.Errorf("machine %s: %s holds %s (%v); want the new key alone", m.Name, agent.ServiceAccountTrustFile, ids, err)
	}
}
