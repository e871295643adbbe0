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
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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

// TestCertificateRenewal runs a 3-machine control plane, under the writer
// and the monitor, on a manager whose machines issue leaves valid for five
// minutes. Every leaf of every machine, in its files and its kubeconfigs,
// and the <cluster>-kubeconfig Secret's certificate must be issued again
// before it expires, in place: the same three machines, no acknowledged
// write lost, and the API through the control plane endpoint never silent
// for more than 5 s. Once every first certificate has expired, the
// machines still serve new connections with their renewed certificates,
// and etcd still takes writes.
func TestCertificateRenewal(t *testing.T) {
	requireShared(t)
	parallel(t, 10*time.Minute)
	mgmt := ownManagement(t, renewalAddressRange, []string{
		"--machine-certificate-lifetime=" + leafLifetime.String(), "--kubeconfig-lifetime=" + leafLifetime.String()})
	s := newScenario(t, mgmt, "renew", 3)
	s.startTraffic(3)
	s.waitAvailable(convergeTimeout, 3)

	ctx := context.Background()
	machines, err := s.machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	host := &machinehost.Host{Root: mgmt.env.MachineRoot()}
	first := map[string]map[string]*x509.Certificate{}
	for _, m := range machines {
		if first[m.Name], err = machineLeaves(host.Dir(ns, m.Name)); err != nil {
			t.Fatal(err)
		}
	}
	firstKubeconfig := s.kubeconfigCert()
	probe := s.startAPIProbe(true)

	// Each leaf must be seen renewed before it expires: the first look
	// that finds it issued again must come before its notAfter.
	renewed := map[string]time.Time{}
	s.eventually(leafLifetime+2*time.Minute, "every leaf of every machine issued again", func(ctx context.Context) error {
		now := time.Now()
		var waiting []string
		for _, m := range machines {
			leaves, err := machineLeaves(host.Dir(ns, m.Name))
			if err != nil {
				return err
			}
			for name, old := range first[m.Name] {
				key := m.Name + "/" + name
				if _, seen := renewed[key]; seen {
					continue
				}
				if c, ok := leaves[name]; ok && c.NotAfter.After(old.NotAfter) {
					renewed[key] = now
					if !now.Before(old.NotAfter) {
						t.Errorf("%s was issued again only after it expired (%s)", key, old.NotAfter.Format(time.TimeOnly))
					}
					continue
				}
				waiting = append(waiting, key)
			}
		}
		if len(waiting) > 0 {
			return fmt.Errorf("%d leaves not issued again yet, such as %s", len(waiting), waiting[0])
		}
		return nil
	})
	if now := s.kubeconfigCert(); !now.NotAfter.After(firstKubeconfig.NotAfter) {
		t.Errorf("the kubeconfig's client certificate was not issued again: it expires at %s, as the first did", now.NotAfter)
	}

	// Once every first certificate has expired, every new connection is
	// made with a renewed one, on every machine and every port.
	var last time.Time
	for _, leaves := range first {
		for _, c := range leaves {
			if c.NotAfter.After(last) {
				last = c.NotAfter
			}
		}
	}
	s.eventually(time.Until(last)+time.Minute, "every first certificate expired", func(context.Context) error {
		if time.Now().Before(last.Add(5 * time.Second)) {
			return fmt.Errorf("the last expires at %s", last.Format(time.TimeOnly))
		}
		return nil
	})
	s.checkServedCertificates(machines)
	s.eventually(time.Minute, "a write through a new etcd client after the first certificates expired", func(ctx context.Context) error {
		cli, _, err := s.etcdClient(ctx)
		if err != nil {
			return err
		}
		defer cli.Close()
		_, err = cli.Raw().Put(ctx, "/e2e/renewal", time.Now().String())
		return err
	})
	s.waitAvailable(time.Minute, 3)
	s.checkRenewedInPlace(machines)
	gap := probe.stop()
	t.Logf("longest time the API server did not answer while the machines renewed their certificates: %s", gap)
	if gap > maxAPIGap {
		t.Errorf("the API server went %s without answering while the machines renewed their certificates, more than %s", gap.Round(time.Millisecond), maxAPIGap)
	}
	s.finish()
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

// checkServedCertificates makes a new connection to each port of each
// machine that serves TLS, and checks each presents a certificate valid
// now; and it asks each machine's agent for every certificate it holds,
// in its files and in memory, and checks no leaf has expired.
func (s *scenario) checkServedCertificates(machines []clusterv1.Machine) {
	s.t.Helper()
	cfg, err := s.etcdConfig(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(cfg.CertPEM, cfg.KeyPEM)
	if err != nil {
		s.t.Fatal(err)
	}
	roots, err := certs.CertPool(cfg.CAPEM)
	if err != nil {
		s.t.Fatal(err)
	}
	agentTLS := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
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
		for _, port := range []int{agent.EtcdClientPort, agent.EtcdPeerPort, agent.APIServerPort, agent.KCMPort, agent.SchedulerPort} {
			addr := net.JoinHostPort(ip, fmt.Sprint(port))
			s.eventually(time.Minute, "machine "+m.Name+" serving a valid certificate on "+addr, func(ctx context.Context) error {
				d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}} //nolint:gosec // the test reads the served certificate's dates
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

// checkRenewedInPlace checks the renewals replaced nothing: the same
// machines, no other machine ever created, each renewal one event and
// status.certificates reporting the renewed machines' expiry.
func (s *scenario) checkRenewedInPlace(before []clusterv1.Machine) {
	s.t.Helper()
	ctx := context.Background()
	after, err := s.machines(ctx)
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
	if n := s.bound.machinesSeen(); n != len(before) {
		s.t.Errorf("%d machines were seen during the scenario; the renewals must create none", n)
	}
	var events corev1.EventList
	if err := s.c.List(ctx, &events, client.InNamespace(ns)); err != nil {
		s.t.Fatal(err)
	}
	renewedMachines := map[string]bool{}
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "QuorumControlPlane" && e.InvolvedObject.Name == s.name && e.Reason == string(quorum.RenewCertificates) {
			for _, m := range before {
				if strings.Contains(e.Message, m.Name) {
					renewedMachines[m.Name] = true
				}
			}
		}
	}
	if len(renewedMachines) != len(before) {
		s.t.Errorf("RenewCertificates events name %v; want each of the %d machines", renewedMachines, len(before))
	}
	cp, err := s.controlPlane(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, e := range cp.Status.Certificates {
		if e.Kind == controlplanev1.CertificateKindMachines && !e.NotAfter.After(time.Now()) {
			s.t.Errorf("status.certificates says the machines' first certificate expired at %s", e.NotAfter)
		}
	}
}
