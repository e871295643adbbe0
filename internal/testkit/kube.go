package testkit

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// AdminClient is a system:masters client of the workload cluster named
// cluster through server, with a certificate of ca, trusting the PEM bundle
// trust (nil: ca alone), and a 5-s timeout per request.
func AdminClient(t testing.TB, cluster, server string, ca *certs.KeyPair, trust []byte) kubernetes.Interface {
	t.Helper()
	kc, err := certs.AdminKubeconfigValidFor(cluster, server, ca, trust, time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// HasControlPlaneTaint reports whether n carries kubeadm's control-plane
// NoSchedule taint, which keeps workloads off the Nodes of QCP's machines.
func HasControlPlaneTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == bootstrap.ControlPlaneNodeRole && t.Effect == corev1.TaintEffectNoSchedule {
			return true
		}
	}
	return false
}
