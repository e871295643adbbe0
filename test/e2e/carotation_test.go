package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/transport"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/controlplane"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// rotationAddressRange is the etcd CA rotation scenario's own: it kills
// qcp-manager at every stage boundary.
const rotationAddressRange = "127.28.0.0/16"

// rotationCrashPoints are where the scenario kills qcp-manager, in the
// order the rotation reaches them: right after each stage is recorded,
// and between the write of the new authority into <cluster>-etcd and the
// record of the next stage.
var rotationCrashPoints = []string{
	engine.FailpointRotationRecorded + string(controlplanev1.RotationTrustBoth),
	engine.FailpointRotationRecorded + string(controlplanev1.RotationReissue),
	engine.FailpointRotationRecorded + string(controlplanev1.RotationSwitchSigner),
	engine.FailpointAfterSignerSwitch,
	engine.FailpointRotationRecorded + string(controlplanev1.RotationDistrust),
	engine.FailpointRotationRecorded + string(controlplanev1.RotationCompleted),
}

// TestEtcdCARotation rotates the etcd CA of a 3-machine control plane
// under the writer and the monitor, whose etcd client trusts both
// authorities and presents a certificate of whichever one the server asks
// for. The new authority is the user's: first a <cluster>-etcd-next Secret
// without a key, which is refused with a condition naming it while nothing
// changes; then a usable one. qcp-manager is killed at every stage boundary
// (rotationCrashPoints) and restarted, and each stage is seen in status
// (its event, sent asynchronously, dies with the process). A second rotation asked for meanwhile is
// refused. At the end no machine trusts or holds the old authority (read
// from each agent and from the machines' files), <cluster>-etcd holds the
// new one, the rotation's Secrets are gone, a client of the old authority
// is refused, no machine was replaced, no acknowledged write was lost, and
// the API through the control plane endpoint was never silent for more
// than 5 s.
func TestEtcdCARotation(t *testing.T) {
	requireShared(t)
	parallel(t, 4*time.Minute)
	mgmt := ownManagement(t, rotationAddressRange, nil)
	s := newScenario(t, mgmt, "rotate", 3)
	s.waitAvailable(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	before, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldCA := s.secretAuthority(ctx, secret.EtcdCA)
	newCA, err := certs.NewCA("etcd-ca-e2e-next", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.startRotatingTraffic(ctx, oldCA, newCA)
	probe := s.startAPIProbe(true)

	// A user-supplied authority without its key is refused; nothing
	// changes.
	next := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secret.Name(s.name, "etcd-next"),
		Labels: map[string]string{clusterv1.ClusterNameLabel: s.name}},
		Data: map[string][]byte{secret.TLSCrtDataName: newCA.CertPEM}}
	if err := s.c.Create(ctx, next); err != nil {
		t.Fatal(err)
	}
	s.restartManager(ctx, rotationCrashPoints[0])
	s.patchControlPlane(ctx, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Certificates.Rotation = &controlplanev1.CertificateRotation{Kind: controlplanev1.CertificateAuthorityEtcdCA, Trigger: "1"}
	})
	s.eventually(time.Minute, "the authority without a key refused", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		c := conditions.Get(cp, controlplanev1.CertificatesAvailableCondition)
		if c == nil || c.Reason != controlplanev1.CertificateAuthorityInvalidReason || !strings.Contains(c.Message, "Secret "+next.Name) || !strings.Contains(c.Message, "tls.key") {
			return fmt.Errorf("CertificatesAvailable %+v", c)
		}
		return nil
	})
	s.holds(10*time.Second, "nothing changed while the new authority is unusable", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if cp.Status.CertificateRotation != nil {
			return fmt.Errorf("a rotation started: %+v", cp.Status.CertificateRotation)
		}
		if got := s.secretAuthority(ctx, secret.EtcdCA); !got.Cert.Equal(oldCA.Cert) {
			return errors.New("<cluster>-etcd changed")
		}
		var prev corev1.Secret
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, "etcd-previous")}, &prev); !apierrors.IsNotFound(err) {
			return fmt.Errorf("<cluster>-etcd-previous: %v", err)
		}
		return s.sameMachines(before)(ctx)
	})

	// The usable authority: the rotation runs, and qcp-manager dies at
	// each stage boundary.
	next.Data[secret.TLSKeyDataName] = newCA.KeyPEM
	if err := s.c.Update(ctx, next); err != nil {
		t.Fatal(err)
	}
	for i, point := range rotationCrashPoints {
		s.eventually(10*time.Minute, "qcp-manager killed at failpoint "+point, func(context.Context) error {
			if !mgmt.manager.Exited() {
				return errors.New("still running")
			}
			return nil
		})
		if !mgmt.manager.Killed() {
			t.Fatalf("qcp-manager, armed with failpoint %s, ended otherwise than by the failpoint's SIGKILL: %v", point, mgmt.manager.Err())
		}
		s.checkRotationStage(ctx, point, oldCA, newCA)
		nextPoint := ""
		if i+1 < len(rotationCrashPoints) {
			nextPoint = rotationCrashPoints[i+1]
		}
		s.restartManager(ctx, nextPoint)
		if i == 0 {
			s.checkSecondRotationRefused(ctx)
		}
	}
	s.waitAvailable(5*time.Minute, 3)
	s.checkRotated(ctx, oldCA, newCA)
	if err := s.sameMachines(before)(ctx); err != nil {
		t.Error(err)
	}
	s.checkAPIGap(probe)
	s.finish()
}

// secretAuthority reads the authority in the scenario's Secret of purpose
// (the service-account key's, <cluster>-sa and a rotation's, too).
func (s *scenario) secretAuthority(ctx context.Context, purpose secret.Purpose) *certs.KeyPair {
	s.t.Helper()
	var sec corev1.Secret
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, purpose)}, &sec); err != nil {
		s.t.Fatal(err)
	}
	ca, err := certs.ParseAuthority(purpose, sec.Data[secret.TLSCrtDataName], sec.Data[secret.TLSKeyDataName])
	if err != nil {
		s.t.Fatal(err)
	}
	return ca
}

// rotatingClient trusts both authorities and presents, at each handshake,
// a client certificate of whichever one the server asks for: what a client
// given both authorities for the rotation does.
func rotatingClient(t testing.TB, oldCA, newCA *certs.KeyPair) etcd.Config {
	t.Helper()
	var pairs []tls.Certificate
	for _, ca := range []*certs.KeyPair{oldCA, newCA} {
		kp, err := certs.IssueEtcdClient(ca, "e2e", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		pairs = append(pairs, pair)
	}
	return etcd.Config{CAPEM: certs.Bundle(oldCA, newCA), ClientCertificate: func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
		for i := range pairs {
			if cri.SupportsCertificate(&pairs[i]) == nil {
				return &pairs[i], nil
			}
		}
		return &pairs[0], nil
	}}
}

// startRotatingTraffic starts the writer and the monitor with
// rotatingClient.
func (s *scenario) startRotatingTraffic(ctx context.Context, oldCA, newCA *certs.KeyPair) {
	s.t.Helper()
	plain, err := s.etcdConfig(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	cfg := rotatingClient(s.t, oldCA, newCA)
	cfg.Endpoints = plain.Endpoints
	if s.traffic, err = startTraffic(cfg, 3, scenarioWriterPause); err != nil {
		s.t.Fatal(err)
	}
}

// checkRotationStage checks, while qcp-manager is down after failpoint
// point, that status shows the stage it recorded, that every machine
// reports the etcd authorities the stage before it left (the stages take
// turns), and after the switch of the signer that <cluster>-etcd holds the
// new authority.
func (s *scenario) checkRotationStage(ctx context.Context, point string, oldCA, newCA *certs.KeyPair) {
	s.t.Helper()
	cp, err := s.controlPlane(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	want := controlplanev1.CertificateRotationStage(strings.TrimPrefix(point, engine.FailpointRotationRecorded))
	if point == engine.FailpointAfterSignerSwitch {
		want = controlplanev1.RotationSwitchSigner
		if got, next := s.secretAuthority(ctx, secret.EtcdCA), s.secretAuthority(ctx, "etcd-next"); !got.Cert.Equal(next.Cert) {
			s.t.Errorf("after the signer switch, <cluster>-etcd does not hold the new authority")
		}
	}
	st := cp.Status.CertificateRotation
	if st == nil || st.Stage != want || st.Trigger != "1" || st.Kind != controlplanev1.CertificateAuthorityEtcdCA {
		s.t.Errorf("killed at %s: status.certificateRotation %+v; want stage %s of trigger 1", point, st, want)
	}
	oldID, newID := certs.KeyID(oldCA.Cert), certs.KeyID(newCA.Cert)
	both, _ := certs.BundleKeyIDs(certs.Bundle(oldCA, newCA))
	left := map[controlplanev1.CertificateRotationStage]string{
		controlplanev1.RotationTrustBoth:    oldID + "/" + oldID,
		controlplanev1.RotationReissue:      oldID + "/" + both,
		controlplanev1.RotationSwitchSigner: newID + "/" + both,
		controlplanev1.RotationDistrust:     newID + "/" + both,
		controlplanev1.RotationCompleted:    newID + "/" + newID,
	}[want]
	machines, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, m := range machines {
		if got := m.Annotations[engine.EtcdAuthorityAnnotation]; got != left {
			s.t.Errorf("killed at %s: machine %s reports etcd authorities %s; the stage before %s leaves %s", point, m.Name, got, want, left)
		}
	}
	s.t.Logf("qcp-manager killed at %s; status: %+v", point, st)
}

// checkSecondRotationRefused asks for another rotation while one runs.
func (s *scenario) checkSecondRotationRefused(ctx context.Context) {
	s.t.Helper()
	s.eventually(time.Minute, "a second rotation refused while one runs", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		cp.Spec.Certificates.Rotation.Trigger = "2"
		err = s.c.Update(ctx, cp)
		switch {
		case err == nil:
			return errors.New("accepted")
		case !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.certificates.rotation") || !strings.Contains(err.Error(), "wait until status.certificateRotation.stage is Completed"):
			return fmt.Errorf("refused otherwise: %w", err) // the webhook may not serve yet
		}
		return nil
	})
}

// checkRotated checks the end of the rotation: no machine trusts or holds
// the old authority, by its agent and by its files; <cluster>-etcd holds
// the new one and the rotation's Secrets are gone; a client of the new
// authority writes and one of the old is refused.
func (s *scenario) checkRotated(ctx context.Context, oldCA, newCA *certs.KeyPair) {
	s.t.Helper()
	if got := s.secretAuthority(ctx, secret.EtcdCA); !got.Cert.Equal(newCA.Cert) {
		s.t.Errorf("<cluster>-etcd holds %s, not the new authority", got.Cert.Subject.CommonName)
	}
	for _, p := range []secret.Purpose{"etcd-next", "etcd-previous"} {
		var sec corev1.Secret
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, p)}, &sec); !apierrors.IsNotFound(err) {
			s.t.Errorf("Secret %s after the rotation: %v", secret.Name(s.name, p), err)
		}
	}
	own := mustClient(s.t, newCA)
	s.checkMachinesFreeOf(ctx, agentTLS(s.t, newCA.CertPEM, own.CertPEM, own.KeyPEM), oldCA, "etcd CA", func(m clusterv1.Machine, rep agent.PKIReport) {
		if trusted := rep.All("etcd/ca.crt"); len(trusted) != 1 || trusted[0].KeyID != certs.KeyID(newCA.Cert) {
			s.t.Errorf("machine %s trusts %+v for etcd; want the new authority alone", m.Name, trusted)
		}
	})
	plain, err := s.etcdConfig(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, via := range []struct {
		name string
		ca   *certs.KeyPair
		ok   bool
	}{{"the new", newCA, true}, {"the old", oldCA, false}} {
		kp := mustClient(s.t, via.ca)
		c := etcd.Config{Endpoints: plain.Endpoints, CAPEM: certs.Bundle(oldCA, newCA), CertPEM: kp.CertPEM, KeyPEM: kp.KeyPEM}
		err := s.putWith(ctx, c)
		if (err == nil) != via.ok {
			s.t.Errorf("a write with a client of %s authority: %v; want success %v", via.name, err, via.ok)
		}
	}
}

// putWith writes one key with a new client of cfg.
func (s *scenario) putWith(ctx context.Context, cfg etcd.Config) error {
	cfg.DialTimeout = 3 * time.Second
	cli, err := etcd.New(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = cli.Raw().Put(cctx, "/e2e/rotation", time.Now().String())
	return err
}

// mustClient issues an etcd client certificate of ca.
func mustClient(t testing.TB, ca *certs.KeyPair) *certs.KeyPair {
	t.Helper()
	kp, err := certs.IssueEtcdClient(ca, "e2e-check", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// sameMachines is a check that the scenario's machines are still those of
// before, none deleting.
func (s *scenario) sameMachines(before []clusterv1.Machine) func(context.Context) error {
	return func(ctx context.Context) error {
		now, err := s.machines(ctx)
		if err != nil {
			return err
		}
		var was, is []string
		for _, m := range before {
			was = append(was, string(m.UID))
		}
		for _, m := range now {
			if !m.DeletionTimestamp.IsZero() {
				return fmt.Errorf("machine %s is being deleted", m.Name)
			}
			is = append(is, string(m.UID))
		}
		slices.Sort(was)
		slices.Sort(is)
		if !slices.Equal(was, is) {
			return fmt.Errorf("the machines changed: %d now, %d before", len(is), len(was))
		}
		return nil
	}
}

// TestClusterCARotation rotates the cluster CA of a 3-machine control
// plane, on the shared management cluster, under the writer, the monitor
// and an API probe that re-reads <cluster>-kubeconfig before every request
// (a client that takes the re-issued kubeconfig). QCP generates the new
// authority. A worker Machine created before the rotation holds it at
// TrustBoth until it is gone, while one created later does not, and a
// Node's certificate request is signed by the new authority then
// (checkWorkersGate). Every stage is announced by an event, and each stage that
// lasts is seen in status. At the end no certificate on any machine, by its
// agent and by its files, is or chains to the old authority, nor does the
// kubeconfig, kube-root-ca.crt or extension-apiserver-authentication hold
// it; <cluster>-ca holds the new one, the rotation's Secrets are gone, an
// admin client of the old authority is refused. Then the front-proxy CA
// is rotated on the same machines: a request header client (an
// authenticating proxy's request, with a front-proxy-client certificate
// and X-Remote-User) of the old authority is taken before and refused
// after, one of the new is taken, and no machine file or
// extension-apiserver-authentication holds the old authority. Then the
// service-account key (rotateServiceAccountKey). Through all three, no
// machine was replaced, no acknowledged write was lost, and the
// probe never went more than 5 s without an answer.
func TestClusterCARotation(t *testing.T) {
	mgmt := requireShared(t)
	parallel(t, 10*time.Minute)
	s := newScenario(t, mgmt, "rotate-ca", 3)
	s.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	before, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldCA := s.secretAuthority(ctx, secret.ClusterCA)
	probe := s.startAPIProbe(true)
	oldWorker := s.createAbsentWorker(ctx, "old-worker")
	var young *clusterv1.Machine
	s.rotateAuthority(ctx, controlplanev1.CertificateAuthorityClusterCA, "1", func(ctx context.Context, stage controlplanev1.CertificateRotationStage) {
		if stage == controlplanev1.RotationTrustBoth {
			young = s.checkWorkersGate(ctx, oldWorker)
		}
	})
	if young == nil {
		t.Fatal("the cluster CA rotation was never seen at TrustBoth")
	}
	s.deleteWorker(ctx, young)
	s.waitAvailable(5*time.Minute, 3)
	newCA := s.secretAuthority(ctx, secret.ClusterCA)
	if newCA.Cert.Equal(oldCA.Cert) {
		t.Fatal("<cluster>-ca still holds the old authority")
	}
	s.checkClusterRotated(ctx, oldCA, newCA)

	// Then the front-proxy CA, on the same machines, with the probe still
	// running: a client of the request header authenticator (as an
	// aggregated API server's caller is, behind the API server) of the old
	// authority is taken before and refused after.
	oldFP := s.secretAuthority(ctx, secret.FrontProxyCA)
	s.checkRequestHeaderClient(ctx, oldFP, true)
	s.rotateAuthority(ctx, controlplanev1.CertificateAuthorityFrontProxyCA, "2", nil)
	s.waitAvailable(5*time.Minute, 3)
	newFP := s.secretAuthority(ctx, secret.FrontProxyCA)
	if newFP.Cert.Equal(oldFP.Cert) {
		t.Fatal("<cluster>-proxy still holds the old authority")
	}
	s.checkRotationSecretsGone(ctx, secret.FrontProxyCA)
	s.checkPublishedTrust(ctx, "requestheader-client-ca-file", oldFP, newFP)
	s.checkMachinesFreeOf(ctx, s.etcdAgentTLS(), oldFP, "front-proxy CA", nil)
	s.checkRequestHeaderClient(ctx, newFP, true)
	s.checkRequestHeaderClient(ctx, oldFP, false)

	// Then the service-account key, with tokens of the old key.
	s.rotateServiceAccountKey(ctx)
	if err := s.sameMachines(before)(ctx); err != nil {
		t.Error(err)
		for _, reason := range []string{"RemoveMember", "CreateMachine", "DeleteMachine"} {
			for _, e := range s.controlPlaneEvents(ctx, reason) {
				t.Logf("event %s: %s", e.Reason, e.Message)
			}
		}
	}
	s.checkAPIGap(probe)
	s.finish()
}

// rotateAuthority asks for a rotation of kind with trigger and waits for
// it to complete; every stage must be announced by an event, and each
// stage that lasts must be seen in status. atStage, if not nil, is called
// the first time each stage is seen.
func (s *scenario) rotateAuthority(ctx context.Context, kind controlplanev1.CertificateAuthorityKind, trigger string,
	atStage func(context.Context, controlplanev1.CertificateRotationStage)) {
	s.t.Helper()
	s.patchControlPlane(ctx, func(cp *controlplanev1.QuorumControlPlane) {
		cp.Spec.Certificates.Rotation = &controlplanev1.CertificateRotation{Kind: kind, Trigger: trigger}
	})
	seen := map[controlplanev1.CertificateRotationStage]bool{}
	s.eventually(10*time.Minute, fmt.Sprintf("the %s rotation completed", kind), func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		st := cp.Status.CertificateRotation
		if st == nil || st.Trigger != trigger {
			return fmt.Errorf("status.certificateRotation is %+v", st)
		}
		if !seen[st.Stage] {
			s.t.Logf("%s: %s stage %s since %s", time.Now().Format("15:04:05.000"), kind, st.Stage, st.StageStartTime.Format(time.TimeOnly))
			if atStage != nil && st.Kind == kind {
				atStage(ctx, st.Stage)
			}
		}
		seen[st.Stage] = true
		if st.Stage != controlplanev1.RotationCompleted || st.Kind != kind {
			return fmt.Errorf("stage %s: %s", st.Stage, st.Message)
		}
		return nil
	})
	for _, stage := range []controlplanev1.CertificateRotationStage{controlplanev1.RotationTrustBoth, controlplanev1.RotationReissue,
		controlplanev1.RotationSwitchSigner, controlplanev1.RotationDistrust, controlplanev1.RotationCompleted} {
		s.checkEvent(ctx, controlplane.StageEventReason(stage), fmt.Sprintf("%s rotation (trigger %q) at stage %s", kind, trigger, stage))
	}
	for _, stage := range []controlplanev1.CertificateRotationStage{controlplanev1.RotationTrustBoth, controlplanev1.RotationReissue, controlplanev1.RotationDistrust} {
		if !seen[stage] {
			s.t.Errorf("%s stage %s was never seen in status (seen: %v)", kind, stage, seen)
		}
	}
}

// checkRotationSecretsGone checks that a rotation of the authority of
// purpose left neither of its Secrets.
func (s *scenario) checkRotationSecretsGone(ctx context.Context, purpose secret.Purpose) {
	s.t.Helper()
	for _, p := range []secret.Purpose{purpose + "-next", purpose + "-previous"} {
		var sec corev1.Secret
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, p)}, &sec); !apierrors.IsNotFound(err) {
			s.t.Errorf("Secret %s after the rotation: %v", secret.Name(s.name, p), err)
		}
	}
}

// checkPublishedTrust checks what the API servers publish, in the
// workload cluster's kube-system/extension-apiserver-authentication, for
// aggregated API servers to take their callers by: key holds the new
// authority and not the old. Each API server adds to it, so the old
// authority stays unless QCP removes it.
func (s *scenario) checkPublishedTrust(ctx context.Context, key string, oldCA, newCA *certs.KeyPair) {
	s.t.Helper()
	wl, err := s.workload(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	s.eventually(time.Minute, fmt.Sprintf("kube-system/extension-apiserver-authentication's %s holding the new authority, not the old", key), func(ctx context.Context) error {
		cm, err := wl.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
		if err != nil {
			return err
		}
		data := []byte(cm.Data[key])
		if ids, err := certs.BundleKeyIDs(data); err != nil || holds(data, oldCA) || !holds(data, newCA) {
			return fmt.Errorf("it holds %s (%v); want %s and not %s", ids, err, certs.KeyID(newCA.Cert), certs.KeyID(oldCA.Cert))
		}
		return nil
	})
}

// requestHeaderUser is the user a request header client says it acts for.
const requestHeaderUser = "qcp-e2e-proxied-user"

// checkRequestHeaderClient sends, through the control plane endpoint, a
// request as an authenticating proxy does: with a front-proxy-client
// certificate signed by signer and the user in X-Remote-User. Taken, the
// API server answers a SelfSubjectReview with that user; refused, it
// fails.
func (s *scenario) checkRequestHeaderClient(ctx context.Context, signer *certs.KeyPair, taken bool) {
	s.t.Helper()
	kp, err := signer.Issue(certs.Request{CommonName: certs.FrontProxyClientName, Usages: certs.ClientUsage}, time.Now())
	if err != nil {
		s.t.Fatal(err)
	}
	cfg := s.kubeconfig(ctx)
	rc := &rest.Config{Host: cfg.Clusters[s.name].Server, Timeout: 10 * time.Second, TLSClientConfig: rest.TLSClientConfig{
		CAData: cfg.Clusters[s.name].CertificateAuthorityData, CertData: kp.CertPEM, KeyData: kp.KeyPEM}}
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return transport.NewAuthProxyRoundTripper(requestHeaderUser, "", []string{"system:authenticated"}, nil, rt)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		s.t.Fatal(err)
	}
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	switch {
	case taken && err != nil:
		s.t.Errorf("a request header client of front-proxy authority %s: %v; want it taken", certs.KeyID(signer.Cert), err)
	case taken && review.Status.UserInfo.Username != requestHeaderUser:
		s.t.Errorf("a request header client of front-proxy authority %s was taken as %q; want %q", certs.KeyID(signer.Cert), review.Status.UserInfo.Username, requestHeaderUser)
	case !taken && err == nil:
		s.t.Errorf("a request header client of front-proxy authority %s was taken as %q; want it refused", certs.KeyID(signer.Cert), review.Status.UserInfo.Username)
	}
}

// kubeconfig is <cluster>-kubeconfig's.
func (s *scenario) kubeconfig(ctx context.Context) *clientcmdapi.Config {
	s.t.Helper()
	var kc corev1.Secret
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.Kubeconfig)}, &kc); err != nil {
		s.t.Fatal(err)
	}
	cfg, err := clientcmd.Load(kc.Data[secret.KubeconfigDataName])
	if err != nil {
		s.t.Fatal(err)
	}
	return cfg
}

// checkClusterRotated checks the end of a cluster CA rotation.
func (s *scenario) checkClusterRotated(ctx context.Context, oldCA, newCA *certs.KeyPair) {
	s.t.Helper()
	s.checkRotationSecretsGone(ctx, secret.ClusterCA)
	// The kubeconfig: its CA and its client certificate.
	cfg := s.kubeconfig(ctx)
	for _, what := range kubeconfigHolding(cfg, oldCA) {
		s.t.Errorf("<cluster>-kubeconfig: %s the old authority", what)
	}
	// kube-root-ca.crt in every namespace, and cluster-info.
	wl, err := s.workload(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	s.eventually(2*time.Minute, "kube-root-ca.crt holding the new authority alone in every namespace", func(ctx context.Context) error {
		cms, err := wl.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=kube-root-ca.crt"})
		if err != nil {
			return err
		}
		if len(cms.Items) == 0 {
			return errors.New("none yet")
		}
		for _, cm := range cms.Items {
			if ids, err := certs.BundleKeyIDs([]byte(cm.Data["ca.crt"])); err != nil || ids != certs.KeyID(newCA.Cert) {
				return fmt.Errorf("namespace %s: it holds %s (%v)", cm.Namespace, ids, err)
			}
		}
		return nil
	})
	s.eventually(time.Minute, "kube-public/cluster-info holding the new authority alone", func(ctx context.Context) error {
		ci, err := wl.CoreV1().ConfigMaps("kube-public").Get(ctx, "cluster-info", metav1.GetOptions{})
		if err != nil {
			return err
		}
		info, err := clientcmd.Load([]byte(ci.Data["kubeconfig"]))
		if err != nil {
			return err
		}
		for _, c := range info.Clusters {
			if ids, err := certs.BundleKeyIDs(c.CertificateAuthorityData); err != nil || ids != certs.KeyID(newCA.Cert) {
				return fmt.Errorf("it holds %s (%v)", ids, err)
			}
		}
		return nil
	})
	s.checkPublishedTrust(ctx, "client-ca-file", oldCA, newCA)
	// Every machine, by its agent and by its files.
	s.checkMachinesFreeOf(ctx, s.etcdAgentTLS(), oldCA, "cluster CA", nil)
	// An admin client of the old authority is refused; one of the new is
	// taken.
	server := cfg.Clusters[s.name].Server
	for _, via := range []struct {
		name string
		ca   *certs.KeyPair
		ok   bool
	}{{"the new", newCA, true}, {"the old", oldCA, false}} {
		cs := testkit.AdminClient(s.t, s.name, server, via.ca, certs.Bundle(oldCA, newCA))
		_, err = cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		if (err == nil) != via.ok {
			s.t.Errorf("an admin client of %s authority: %v; want success %v", via.name, err, via.ok)
		}
	}
}

// holds reports whether PEM data holds ca or a certificate it signed.
func holds(data []byte, ca *certs.KeyPair) bool {
	id := certs.KeyID(ca.Cert)
	cs, err := certs.ParseCerts(data)
	return err == nil && slices.ContainsFunc(cs, func(c *x509.Certificate) bool { return certs.KeyID(c) == id || certs.IssuerKeyID(c) == id })
}

// kubeconfigHolding names what of cfg trusts ca or holds a certificate it
// signed.
func kubeconfigHolding(cfg *clientcmdapi.Config, ca *certs.KeyPair) []string {
	var out []string
	for name, c := range cfg.Clusters {
		if holds(c.CertificateAuthorityData, ca) {
			out = append(out, "cluster "+name+" trusts")
		}
	}
	for name, u := range cfg.AuthInfos {
		if holds(u.ClientCertificateData, ca) {
			out = append(out, "user "+name+" holds a certificate of")
		}
	}
	return out
}

// checkMachinesFreeOf fails the scenario for every certificate of each of
// its machines that is or chains to old (what names it): in the report of
// its agent, reached with via, and in its PKI directory, certificate files
// and kubeconfigs. each, when set, checks more of each machine's report.
func (s *scenario) checkMachinesFreeOf(ctx context.Context, via *tls.Config, old *certs.KeyPair, what string, each func(clusterv1.Machine, agent.PKIReport)) {
	s.t.Helper()
	machines, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	host := &machinehost.Host{Root: s.mgmt.env.MachineRoot()}
	oldID := certs.KeyID(old.Cert)
	for _, m := range machines {
		rep, err := agent.GetPKI(ctx, via, internalIP(&m))
		if err != nil {
			s.t.Errorf("machine %s: %v", m.Name, err)
			continue
		}
		for _, c := range rep.Certificates {
			if c.KeyID == oldID || c.IssuerKeyID == oldID {
				s.t.Errorf("machine %s: %s is or chains to the old %s", m.Name, c.Name, what)
			}
		}
		if each != nil {
			each(m, rep)
		}
		dir := filepath.Join(host.DataDir(ns, m.Name), agent.PKIDir)
		err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			switch {
			case strings.HasSuffix(path, ".crt") && holds(data, old):
				s.t.Errorf("machine %s: %s holds or chains to the old %s", m.Name, path, what)
			case strings.HasSuffix(path, ".conf"):
				kc, err := clientcmd.Load(data)
				if err != nil {
					return err
				}
				for _, h := range kubeconfigHolding(kc, old) {
					s.t.Errorf("machine %s: %s: %s the old %s", m.Name, path, h, what)
				}
			}
			return nil
		})
		if err != nil {
			s.t.Error(err)
		}
	}
}

// createAbsentWorker creates a worker Machine of the scenario's cluster
// whose infrastructure never comes (a ProcessMachine that does not
// exist): what a rotation sees of a worker is its Machine, and QCP must
// wait for an old one whatever runs it.
func (s *scenario) createAbsentWorker(ctx context.Context, suffix string) *clusterv1.Machine {
	s.t.Helper()
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: s.name + "-" + suffix, Namespace: ns, Labels: map[string]string{clusterv1.ClusterNameLabel: s.name}},
		Spec: clusterv1.MachineSpec{
			ClusterName: s.name, Version: version, Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(s.name + "-" + suffix + "-absent")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessMachine", Name: s.name + "-" + suffix + "-absent"},
		},
	}
	if err := s.c.Create(ctx, m); err != nil {
		s.t.Fatal(err)
	}
	return m
}

// checkWorkersGate checks, during a cluster CA rotation's TrustBoth, that
// once every control plane machine took the stage the rotation waits for
// old, a worker created before, naming it; that kube-controller-manager
// then signs a Node's certificate request with the new authority; that a
// worker created now is not waited for; and that deleting old lets the
// rotation go on. It returns the new worker, for the caller to delete.
func (s *scenario) checkWorkersGate(ctx context.Context, old *clusterv1.Machine) *clusterv1.Machine {
	s.t.Helper()
	s.eventually(10*time.Minute, "the rotation waiting for worker "+old.Name, func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if st := cp.Status.CertificateRotation; st == nil || st.Stage != controlplanev1.RotationTrustBoth || !strings.Contains(st.Message, old.Name) {
			return fmt.Errorf("status.certificateRotation %+v", st)
		}
		return nil
	})
	newCA := s.secretAuthority(ctx, "ca-next")
	wl, err := s.workload(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	certPEM, _ := nodeClientCertificate(ctx, s.t, wl, "qcp-e2e-rotation-worker")
	c, err := certs.ParseCert(certPEM)
	if err != nil {
		s.t.Fatal(err)
	}
	if certs.IssuerKeyID(c) != certs.KeyID(newCA.Cert) {
		s.t.Errorf("a Node's certificate request at TrustBoth was signed by authority %s; want the new one, %s", certs.IssuerKeyID(c), certs.KeyID(newCA.Cert))
	}
	// A creation time has whole seconds, and one in the second the signers
	// moved counts as before it: the young worker is created after it.
	cp, err := s.controlPlane(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	var recorded struct {
		SignersMoved time.Time `json:"signersMoved"`
	}
	if err := json.Unmarshal([]byte(cp.Annotations[controlplane.RotationAnnotation]), &recorded); err != nil || recorded.SignersMoved.IsZero() {
		s.t.Fatalf("%s records no signersMoved (%v): %s", controlplane.RotationAnnotation, err, cp.Annotations[controlplane.RotationAnnotation])
	}
	s.eventually(time.Minute, "the second after the signers moved to pass", func(context.Context) error {
		if !time.Now().After(recorded.SignersMoved.Add(time.Second)) {
			return fmt.Errorf("the signers moved at %s", recorded.SignersMoved)
		}
		return nil
	})
	young := s.createAbsentWorker(ctx, "young-worker")
	s.holds(5*time.Second, "the rotation held at TrustBoth while worker "+old.Name+" exists", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if st := cp.Status.CertificateRotation; st == nil || st.Stage != controlplanev1.RotationTrustBoth || strings.Contains(st.Message, young.Name) {
			return fmt.Errorf("status.certificateRotation %+v", st)
		}
		return nil
	})
	if err := s.c.Delete(ctx, old); err != nil {
		s.t.Fatal(err)
	}
	return young
}

// deleteWorker deletes m and waits until it is gone.
func (s *scenario) deleteWorker(ctx context.Context, m *clusterv1.Machine) {
	s.t.Helper()
	if err := s.c.Delete(ctx, m); client.IgnoreNotFound(err) != nil {
		s.t.Fatal(err)
	}
	s.eventually(2*time.Minute, "worker "+m.Name+" gone", func(ctx context.Context) error {
		if err := s.reader(ctx).Get(ctx, client.ObjectKeyFromObject(m), &clusterv1.Machine{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
}
