package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/quorum"
)

const (
	// renewalAddressRange is the renewal scenario's own: its manager
	// gives machines leaves of a few minutes, which no other scenario
	// wants.
	renewalAddressRange = "127.27.0.0/16"
	// leafLifetime is the life of every leaf the scenario's machines issue
	// themselves, and of its kubeconfig's client certificate: renewed
	// after two thirds (3 min 20 s), expired after 5 minutes.
	leafLifetime = 5 * time.Minute
)

// TestCertificateRenewal runs two clusters, under the writer and the
// monitor, on a manager whose machines issue leaves valid for five
// minutes: a 3-machine control plane on stacked etcd, and a control plane
// of 2 machines on an EtcdCluster of 3, whose <cluster>-apiserver-etcd-client
// also lives five minutes. Every leaf of every machine, in its files and
// its kubeconfigs, the kubeconfig Secret's certificate and the EtcdCluster's
// client pair (in its Secret and on each control plane machine) must be
// issued again before it expires, in place: the same machines, no
// acknowledged write lost, and the API through the control plane endpoint
// never silent for more than 5 s. Once every first certificate has
// expired, the machines still serve new connections with their renewed
// certificates, their agents hold no expired leaf, and etcd and the API
// still take writes.
func TestCertificateRenewal(t *testing.T) {
	requireShared(t)
	parallel(t, 10*time.Minute)
	mgmt := ownManagement(t, renewalAddressRange, []string{
		"--machine-certificate-lifetime=" + leafLifetime.String(), "--kubeconfig-lifetime=" + leafLifetime.String()})
	t.Run("stacked", func(t *testing.T) {
		t.Parallel()
		s := newScenario(t, mgmt, "renew", 3)
		s.startTraffic(3)
		s.waitAvailable(convergeTimeout, 3)
		machines, err := s.machines(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		w := s.firstLeaves(machines)
		firstKubeconfig := s.kubeconfigCert()
		probe := s.startAPIProbe(true)
		s.waitLeavesRenewed(w)
		if now := s.kubeconfigCert(); !now.NotAfter.After(firstKubeconfig.NotAfter) {
			t.Errorf("the kubeconfig's client certificate was not issued again: it expires at %s, as the first did", now.NotAfter)
		}
		s.waitExpired(w.lastExpiry())
		s.checkServedCertificates(machines, s.etcdAgentTLS(), agent.EtcdClientPort, agent.EtcdPeerPort, agent.APIServerPort, agent.KCMPort, agent.SchedulerPort)
		s.checkEtcdWrites()
		s.waitAvailable(time.Minute, 3)
		s.checkRenewedInPlace(machines, "QuorumControlPlane", s.machines)
		s.checkControlPlaneCertificates()
		s.checkAPIGap(probe)
		s.finish()
	})
	t.Run("etcdcluster", func(t *testing.T) {
		t.Parallel()
		s := newEtcdScenario(t, mgmt, "renew-etcd", 3, 1)
		s.startTraffic(3)
		s.waitEtcdReady(convergeTimeout, 3)
		s.waitExternalAvailable(convergeTimeout, etcdScenarioControlPlane)
		ctx := context.Background()
		etcdMachines, err := s.machines(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cpMachines, err := s.controlPlaneMachines(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The control plane machines' apiserver-etcd-client.crt is the
		// EtcdCluster's pair: it is renewed only once delivered.
		w := s.firstLeaves(append(slices.Clone(etcdMachines), cpMachines...))
		firstPair := s.etcdClientSecretCert()
		probe := s.startAPIProbe(true)
		s.waitLeavesRenewed(w)
		if now := s.etcdClientSecretCert(); !now.NotAfter.After(firstPair.NotAfter) || now.SerialNumber.Cmp(firstPair.SerialNumber) == 0 {
			t.Errorf("the EtcdCluster's client pair was not issued again: it expires at %s, as the first did", now.NotAfter)
		}
		s.waitExpired(w.lastExpiry())
		s.checkServedCertificates(etcdMachines, s.etcdAgentTLS(), agent.EtcdClientPort, agent.EtcdPeerPort)
		s.checkServedCertificates(cpMachines, s.clusterAgentTLS(), agent.APIServerPort, agent.KCMPort, agent.SchedulerPort)
		s.checkEtcdWrites()
		s.eventually(time.Minute, "a write through the API after the first certificates expired", func(ctx context.Context) error {
			wl, err := s.workload(ctx)
			if err != nil {
				return err
			}
			_, err = wl.CoreV1().ConfigMaps(metav1.NamespaceDefault).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "renewal-"}}, metav1.CreateOptions{})
			return err
		})
		s.waitExternalAvailable(time.Minute, etcdScenarioControlPlane)
		s.checkRenewedInPlace(etcdMachines, "EtcdCluster", s.machines)
		s.checkRenewedInPlace(cpMachines, "QuorumControlPlane", s.controlPlaneMachines)
		s.checkAPIGap(probe)
		s.finish()
	})
}

// leafWatch is the first leaves of a scenario's machines, by machine and
// file.
type leafWatch struct {
	host     *machinehost.Host
	machines []clusterv1.Machine
	first    map[string]map[string]*x509.Certificate
}

func (s *scenario) firstLeaves(machines []clusterv1.Machine) *leafWatch {
	s.t.Helper()
	w := &leafWatch{host: &machinehost.Host{Root: s.mgmt.env.MachineRoot()}, machines: machines, first: map[string]map[string]*x509.Certificate{}}
	for _, m := range machines {
		leaves, err := machineLeaves(w.host.DataDir(ns, m.Name))
		if err != nil {
			s.t.Fatal(err)
		}
		w.first[m.Name] = leaves
	}
	return w
}

// lastExpiry is when the last of the first leaves expires.
func (w *leafWatch) lastExpiry() time.Time {
	var last time.Time
	for _, leaves := range w.first {
		for _, c := range leaves {
			if c.NotAfter.After(last) {
				last = c.NotAfter
			}
		}
	}
	return last
}

// waitLeavesRenewed waits until every first leaf has been issued again,
// and fails the scenario for each one first seen renewed only after it
// expired.
func (s *scenario) waitLeavesRenewed(w *leafWatch) {
	s.t.Helper()
	renewed := map[string]bool{}
	s.eventually(leafLifetime+2*time.Minute, "every leaf of every machine issued again", func(ctx context.Context) error {
		now := time.Now()
		var waiting []string
		for _, m := range w.machines {
			leaves, err := machineLeaves(w.host.DataDir(ns, m.Name))
			if err != nil {
				return err
			}
			for name, old := range w.first[m.Name] {
				key := m.Name + "/" + name
				if renewed[key] {
					continue
				}
				if c, ok := leaves[name]; ok && c.NotAfter.After(old.NotAfter) {
					renewed[key] = true
					if !now.Before(old.NotAfter) {
						s.t.Errorf("%s was issued again only after it expired (%s)", key, old.NotAfter.Format(time.TimeOnly))
					}
					continue
				}
				waiting = append(waiting, key)
			}
		}
		if len(waiting) > 0 {
			slices.Sort(waiting)
			return fmt.Errorf("%d leaves not issued again yet, such as %s", len(waiting), waiting[0])
		}
		return nil
	})
}

// waitExpired waits until a moment after last.
func (s *scenario) waitExpired(last time.Time) {
	s.t.Helper()
	s.eventually(time.Until(last)+time.Minute, "every first certificate expired", func(context.Context) error {
		if time.Now().Before(last.Add(5 * time.Second)) {
			return fmt.Errorf("the last expires at %s", last.Format(time.TimeOnly))
		}
		return nil
	})
}

// checkEtcdWrites writes through a new etcd client: new connections, new
// handshakes with the members' renewed certificates.
func (s *scenario) checkEtcdWrites() {
	s.t.Helper()
	s.eventually(time.Minute, "a write through a new etcd client after the first certificates expired", func(ctx context.Context) error {
		cli, _, err := s.etcdClient(ctx)
		if err != nil {
			return err
		}
		defer cli.Close()
		_, err = cli.Raw().Put(ctx, "/e2e/renewal", time.Now().String())
		return err
	})
}

// checkAPIGap stops probe and fails the scenario on a gap over maxAPIGap.
func (s *scenario) checkAPIGap(probe *apiProbe) {
	s.t.Helper()
	gap := probe.stop()
	s.t.Logf("longest time the API server did not answer while the machines renewed their certificates: %s, ending at %s (last error: %v)",
		gap, probe.worstEnd.Format("15:04:05.000"), probe.worstErr)
	if gap > maxAPIGap {
		s.t.Errorf("the API server went %s without answering while the machines renewed their certificates, more than %s", gap.Round(time.Millisecond), maxAPIGap)
	}
}

// etcdClientSecretCert is the certificate of <cluster>-apiserver-etcd-client.
func (s *scenario) etcdClientSecretCert() *x509.Certificate {
	s.t.Helper()
	var sec corev1.Secret
	if err := s.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.APIServerEtcdClient)}, &sec); err != nil {
		s.t.Fatal(err)
	}
	c, err := certs.ParseCert(sec.Data[secret.TLSCrtDataName])
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// etcdAgentTLS reaches the agents of machines that run etcd: a client
// certificate of the etcd CA.
func (s *scenario) etcdAgentTLS() *tls.Config {
	s.t.Helper()
	cfg, err := s.etcdConfig(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	return agentTLS(s.t, cfg.CAPEM, cfg.CertPEM, cfg.KeyPEM)
}

// clusterAgentTLS reaches the agents of control plane machines without an
// etcd member: a client certificate of the cluster CA named qcp-manager.
func (s *scenario) clusterAgentTLS() *tls.Config {
	s.t.Helper()
	var sec corev1.Secret
	if err := s.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.ClusterCA)}, &sec); err != nil {
		s.t.Fatal(err)
	}
	ca, err := certs.ParseKeyPair(sec.Data[secret.TLSCrtDataName], sec.Data[secret.TLSKeyDataName])
	if err != nil {
		s.t.Fatal(err)
	}
	pair, err := ca.Issue(certs.Request{CommonName: agent.ManagerCommonName, Usages: certs.ClientUsage}, time.Now())
	if err != nil {
		s.t.Fatal(err)
	}
	return agentTLS(s.t, ca.CertPEM, pair.CertPEM, pair.KeyPEM)
}

func agentTLS(t testing.TB, caPEM, certPEM, keyPEM []byte) *tls.Config {
	t.Helper()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := certs.CertPool(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
}

// machineLeaves reads every leaf certificate a machine holds in its PKI
// directory, by file: each certificate file that is not an authority, and
// the client certificate each kubeconfig embeds.
func machineLeaves(dir string) (map[string]*x509.Certificate, error) {
	pki := filepath.Join(dir, agent.PKIDir)
	out := map[string]*x509.Certificate{}
	err := filepath.WalkDir(pki, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name, _ := filepath.Rel(pki, path)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		switch filepath.Ext(path) {
		case ".crt":
			c, err := certs.ParseCert(data)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if !c.IsCA {
				out[name] = c
			}
		case ".conf":
			cfg, err := clientcmd.Load(data)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			for user, auth := range cfg.AuthInfos {
				c, err := certs.ParseCert(auth.ClientCertificateData)
				if err != nil {
					return fmt.Errorf("%s, user %s: %w", path, user, err)
				}
				out[name+"#"+user] = c
			}
		}
		return nil
	})
	if err == nil && len(out) == 0 {
		err = fmt.Errorf("no leaf certificate under %s", pki)
	}
	return out, err
}

// checkServedCertificates asks each machine's agent, with agentTLS, for
// every certificate it holds, in its files and in memory, and checks no
// leaf has expired; then it makes a new connection to each of ports on
// each machine (with agentTLS's client certificate, which etcd's peer port
// asks for) and checks each presents a certificate valid now.
func (s *scenario) checkServedCertificates(machines []clusterv1.Machine, agentTLS *tls.Config, ports ...int) {
	s.t.Helper()
	for _, m := range machines {
		ip := internalIP(&m)
		var rep agent.PKIReport
		s.eventually(time.Minute, "machine "+m.Name+"'s agent listing its certificates", func(ctx context.Context) (err error) {
			rep, err = agent.GetPKI(ctx, agentTLS, ip)
			return err
		})
		for _, c := range rep.Leaves() {
			if time.Now().After(c.NotAfter) {
				s.t.Errorf("machine %s still holds %s, which expired at %s", m.Name, c.Name, c.NotAfter.Format(time.TimeOnly))
			}
		}
		for _, port := range ports {
			addr := net.JoinHostPort(ip, fmt.Sprint(port))
			s.eventually(time.Minute, "machine "+m.Name+" serving a valid certificate on "+addr, func(ctx context.Context) error {
				d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, Certificates: agentTLS.Certificates, MinVersion: tls.VersionTLS12}} //nolint:gosec // the test reads the served certificate's dates
				conn, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					return err
				}
				defer conn.Close()
				c := conn.(*tls.Conn).ConnectionState().PeerCertificates[0]
				if now := time.Now(); now.After(c.NotAfter) {
					return fmt.Errorf("serves a certificate that expired at %s", c.NotAfter.Format(time.TimeOnly))
				}
				return nil
			})
		}
	}
}

// checkRenewedInPlace checks the renewals replaced none of before (listed
// again by list), and that each machine's renewal was a RenewCertificates
// event of its owner, of kind ownerKind.
func (s *scenario) checkRenewedInPlace(before []clusterv1.Machine, ownerKind string, list func(context.Context) ([]clusterv1.Machine, error)) {
	s.t.Helper()
	ctx := context.Background()
	after, err := list(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	uids := map[string]bool{}
	for _, m := range after {
		uids[string(m.UID)] = true
	}
	for _, m := range before {
		if !uids[string(m.UID)] {
			s.t.Errorf("machine %s was replaced", m.Name)
		}
	}
	if len(after) != len(before) {
		s.t.Errorf("%d machines now, %d before the renewals", len(after), len(before))
	}
	var events corev1.EventList
	if err := s.reader(ctx).List(ctx, &events, client.InNamespace(ns)); err != nil {
		s.t.Fatal(err)
	}
	renewedMachines := map[string]bool{}
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == ownerKind && e.InvolvedObject.Name == s.name && e.Reason == string(quorum.RenewCertificates) {
			for _, m := range before {
				if strings.Contains(e.Message, m.Name) {
					renewedMachines[m.Name] = true
				}
			}
		}
	}
	if len(renewedMachines) != len(before) {
		s.t.Errorf("RenewCertificates events of the %s name %v; want each of the %d machines", ownerKind, renewedMachines, len(before))
	}
}

// checkControlPlaneCertificates checks that no machine was ever added to
// the control plane's three, and that status.certificates reports the
// renewed machines' expiry.
func (s *scenario) checkControlPlaneCertificates() {
	s.t.Helper()
	if n := s.bound.machinesSeen(); n != 3 {
		s.t.Errorf("%d machines were seen during the scenario; the renewals must create none", n)
	}
	cp, err := s.controlPlane(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	for _, e := range cp.Status.Certificates {
		if e.Kind == controlplanev1.CertificateKindMachines && !e.NotAfter.After(time.Now()) {
			s.t.Errorf("status.certificates says the machines' first certificate expired at %s", e.NotAfter)
		}
	}
}
