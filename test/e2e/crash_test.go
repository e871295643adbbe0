package e2e

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
)

// crashAddressRange and kubeconfigLifetime are the crash scenario's own:
// it runs on its own management cluster, because it kills qcp-manager.
const (
	crashAddressRange = "127.24.0.0/16"
	// kubeconfigLifetime is short, so that the kubeconfig is issued again
	// within the scenario.
	kubeconfigLifetime = time.Minute
)

// crashPoints are the failpoints the scenario kills qcp-manager at, in the
// order a scale-up from 3 to 5 reaches them: three while creating machines,
// one before and one after adding a learner (the member ID not yet
// recorded), one after the hook and one after the promotion.
var crashPoints = []string{
	engine.FailpointAfterBootstrapData,
	engine.FailpointAfterInfraMachine,
	engine.FailpointAfterMachine,
	engine.FailpointBeforeMemberAdd,
	engine.FailpointAfterMemberAdd,
	engine.FailpointAfterHook,
	engine.FailpointAfterPromote,
}

// TestCrashesAndRotation kills qcp-manager (SIGKILL, from a failpoint) at
// every point of crashPoints during one scale-up from 3 to 5, restarting it
// each time; the scale-up must end with 5 healthy voters, one per machine,
// no stray learner and no duplicate machine. Before that, the kubeconfig's
// short-lived client certificate is issued again and keeps working.
func TestCrashesAndRotation(t *testing.T) {
	requireShared(t)
	// Beside the others: its own management cluster needs inotify
	// instances, which the others' machines hold too; TestMain makes sure
	// the host allows enough (testkit.EnsureInotifyInstances).
	parallel(t, time.Minute+40*time.Second)
	mgmt := ownManagement(t, crashAddressRange, []string{"--kubeconfig-lifetime=" + kubeconfigLifetime.String()})
	s := newScenario(t, mgmt, "crash", 3)
	s.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)
	s.checkRotation()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s.restartManager(ctx, crashPoints[0])
	s.scale(ctx, 5)
	for i, point := range crashPoints {
		s.eventually(3*time.Minute, "qcp-manager killed at failpoint "+point, func(context.Context) error {
			if !mgmt.manager.Exited() {
				return errors.New("still running")
			}
			return nil
		})
		if !mgmt.manager.Killed() {
			t.Fatalf("qcp-manager, armed with failpoint %s, ended otherwise than by the failpoint's SIGKILL: %v", point, mgmt.manager.Err())
		}
		next := ""
		if i+1 < len(crashPoints) {
			next = crashPoints[i+1]
		}
		s.restartManager(ctx, next)
	}
	s.waitAvailable(8*time.Minute, 5)
	s.finish()
}

// restartManager starts qcp-manager again, with failpoint armed ("" for
// none), after the previous one stopped.
func (s *scenario) restartManager(ctx context.Context, failpoint string) {
	s.t.Helper()
	if !s.mgmt.manager.Exited() {
		if err := s.mgmt.manager.Stop(); err != nil {
			s.t.Fatal(err)
		}
	}
	if err := s.mgmt.startManager(ctx, failpoint); err != nil {
		s.t.Fatal(err)
	}
}

// checkRotation waits for <cluster>-kubeconfig to be issued again with a
// new client certificate, and checks the new one reaches the workload
// cluster.
func (s *scenario) checkRotation() {
	s.t.Helper()
	first := s.kubeconfigCert()
	s.eventually(2*kubeconfigLifetime, "the kubeconfig issued again", func(ctx context.Context) error {
		if now := s.kubeconfigCert(); now.SerialNumber.Cmp(first.SerialNumber) == 0 {
			return fmt.Errorf("still the certificate valid until %s", first.NotAfter.Format(time.TimeOnly))
		}
		return nil
	})
	if now := s.kubeconfigCert(); !now.NotAfter.After(first.NotAfter) {
		s.t.Errorf("the new client certificate expires at %s, not after the old one (%s)", now.NotAfter, first.NotAfter)
	}
	s.eventually(time.Minute, "the workload cluster through the new kubeconfig", func(ctx context.Context) error {
		wl, err := s.workload(ctx)
		if err != nil {
			return err
		}
		_, err = wl.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		return err
	})
}

// kubeconfigCert returns the client certificate in <cluster>-kubeconfig.
func (s *scenario) kubeconfigCert() *x509.Certificate {
	s.t.Helper()
	var sec corev1.Secret
	if err := s.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.Kubeconfig)}, &sec); err != nil {
		s.t.Fatal(err)
	}
	cfg, err := clientcmd.Load(sec.Data[secret.KubeconfigDataName])
	if err != nil {
		s.t.Fatal(err)
	}
	for _, user := range cfg.AuthInfos {
		crt, err := certs.ParseCert(user.ClientCertificateData)
		if err != nil {
			s.t.Fatal(err)
		}
		return crt
	}
	s.t.Fatal("the kubeconfig has no user")
	return nil
}
