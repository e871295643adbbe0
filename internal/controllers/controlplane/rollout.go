package controlplane

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/log"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/controllers/engine"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// MachineSpecAnnotation records on each Machine, as JSON, what QCP created
// it from besides its version (which the Machine's spec carries). A
// rollout compares it with the control plane's spec; a machine without it
// (adopted, or created by hand) rolls out only for its version,
// rollout.after or certificate expiry.
const MachineSpecAnnotation = "controlplane.cluster.x-k8s.io/qcp-machine-spec"

// machineSpec is what a machine is created from that a change of rolls it
// out. Labels, annotations, deletion timeouts and the certificate
// validity are not in it: they are propagated in place, or apply to new
// machines only.
type machineSpec struct {
	// InfrastructureTemplate is the template's Kind/name.
	InfrastructureTemplate string `json:"infrastructureTemplate"`
	// InfrastructureTemplateHash digests the template's spec.template.spec,
	// so that an edit in place (templates are meant to be immutable) is
	// seen too. Empty when the template could not be read.
	InfrastructureTemplateHash string `json:"infrastructureTemplateHash,omitempty"`
	EtcdVersion                string `json:"etcdVersion,omitempty"`
	// EtcdEndpoints are spec.etcd.external's: the API servers are
	// configured with them. An EtcdCluster's are not here: its agents
	// follow its member list, so no change of it rolls the control plane.
	EtcdEndpoints []string                                `json:"etcdEndpoints,omitempty"`
	ExtraArgs     map[bootstrap.Component][]bootstrap.Arg `json:"extraArgs,omitempty"`
	CertSANs      []string                                `json:"certSANs,omitempty"`
}

// desiredMachineSpec is the record a machine created now gets. tmpl is the
// infrastructure template, or nil when it cannot be read.
func desiredMachineSpec(cp *controlplanev1.QuorumControlPlane, tmpl *unstructured.Unstructured) machineSpec {
	ref := cp.Spec.MachineTemplate.Spec.InfrastructureRef
	s := machineSpec{
		InfrastructureTemplate: ref.Kind + "/" + ref.Name,
		EtcdVersion:            cp.Spec.Etcd.Stacked.Version,
		ExtraArgs:              extraArgs(cp),
		CertSANs:               cp.Spec.APIServer.CertSANs,
	}
	if ext := cp.Spec.Etcd.External; ext != nil {
		s.EtcdEndpoints = ext.Endpoints
	}
	if tmpl != nil {
		spec, _, _ := unstructured.NestedFieldNoCopy(tmpl.Object, "spec", "template", "spec")
		if data, err := json.Marshal(spec); err == nil {
			sum := sha256.Sum256(data)
			s.InfrastructureTemplateHash = hex.EncodeToString(sum[:8])
		}
	}
	return s
}

// extraArgs are the control plane's extra arguments by component, as the
// bootstrap data carries them.
func extraArgs(cp *controlplanev1.QuorumControlPlane) map[bootstrap.Component][]bootstrap.Arg {
	out := map[bootstrap.Component][]bootstrap.Arg{}
	for c, args := range map[bootstrap.Component][]controlplanev1.Arg{
		bootstrap.Etcd:                  cp.Spec.Etcd.Stacked.ExtraArgs,
		bootstrap.KubeAPIServer:         cp.Spec.APIServer.ExtraArgs,
		bootstrap.KubeControllerManager: cp.Spec.ControllerManager.ExtraArgs,
		bootstrap.KubeScheduler:         cp.Spec.Scheduler.ExtraArgs,
	} {
		for _, a := range args {
			out[c] = append(out[c], bootstrap.Arg{Name: a.Name, Value: a.Value})
		}
	}
	return out
}

func (s machineSpec) annotation() string {
	data, _ := json.Marshal(s) // a struct of strings and maps cannot fail
	return string(data)
}

// rollout judges whether a machine is up to date.
type rollout struct {
	version string
	want    machineSpec
	// after is spec.rollout.after (zero if unset).
	after time.Time
	// certThreshold is spec.rollout.before.certificatesExpiryDays (zero if
	// unset).
	certThreshold time.Duration
	now           time.Time
}

// newRollout reads the infrastructure template (a template that cannot be
// read is compared by name only) and the rollout settings.
func (r *Reconciler) newRollout(ctx context.Context, cp *controlplanev1.QuorumControlPlane) rollout {
	tmpl, err := engine.GetTemplate(ctx, r.Client, r.APIReader, cp.Spec.MachineTemplate.Spec.InfrastructureRef, cp.Namespace)
	if err != nil {
		tmpl = nil
	}
	return rollout{
		version:       cp.Spec.Version,
		want:          desiredMachineSpec(cp, tmpl),
		after:         cp.Spec.Rollout.After.Time,
		certThreshold: time.Duration(ptr.Deref(cp.Spec.Rollout.Before.CertificatesExpiryDays, 0)) * 24 * time.Hour,
		now:           r.Now(),
	}
}

// outdated lists why m must be rolled out, in the "* reason" lines of a
// CAPI condition message; none means it is up to date.
func (ro rollout) outdated(m *clusterv1.Machine) []string {
	var why []string
	if normalizeVersion(m.Spec.Version) != normalizeVersion(ro.version) {
		why = append(why, fmt.Sprintf("Version %s, %s required", m.Spec.Version, ro.version))
	}
	if raw, ok := m.Annotations[MachineSpecAnnotation]; ok {
		var had machineSpec
		if err := json.Unmarshal([]byte(raw), &had); err != nil {
			why = append(why, fmt.Sprintf("Annotation %s cannot be read: %v", MachineSpecAnnotation, err))
		} else {
			why = append(why, ro.specChanges(had)...)
		}
	}
	if !ro.after.IsZero() && !ro.now.Before(ro.after) && m.CreationTimestamp.Time.Before(ro.after) {
		why = append(why, fmt.Sprintf("Created before rollout.after %s", ro.after.UTC().Format(time.RFC3339)))
	}
	if expiry, ok := certificatesExpiry(m); ok && ro.certThreshold > 0 && expiry.Sub(ro.now) < ro.certThreshold {
		why = append(why, fmt.Sprintf("Certificates expire at %s, within rollout.before.certificatesExpiryDays (%d days)",
			expiry.UTC().Format(time.RFC3339), int(ro.certThreshold/(24*time.Hour))))
	}
	return why
}

// specChanges compares what a machine was created from with what a new
// machine would be.
func (ro rollout) specChanges(had machineSpec) []string {
	want := ro.want
	var why []string
	switch {
	case had.InfrastructureTemplate != want.InfrastructureTemplate:
		why = append(why, fmt.Sprintf("InfrastructureMachine cloned from %s, %s required", had.InfrastructureTemplate, want.InfrastructureTemplate))
	case want.InfrastructureTemplateHash != "" && had.InfrastructureTemplateHash != want.InfrastructureTemplateHash:
		why = append(why, fmt.Sprintf("InfrastructureMachine template %s changed since the machine was created", want.InfrastructureTemplate))
	}
	if normalizeVersion(had.EtcdVersion) != normalizeVersion(want.EtcdVersion) {
		why = append(why, fmt.Sprintf("etcd version %q, %q required", had.EtcdVersion, want.EtcdVersion))
	}
	components := map[bootstrap.Component]bool{}
	for c := range had.ExtraArgs {
		components[c] = true
	}
	for c := range want.ExtraArgs {
		components[c] = true
	}
	for _, c := range slices.Sorted(maps.Keys(components)) {
		if !slices.Equal(had.ExtraArgs[c], want.ExtraArgs[c]) {
			why = append(why, fmt.Sprintf("%s extra args changed", c))
		}
	}
	if !slices.Equal(had.CertSANs, want.CertSANs) {
		why = append(why, "apiServer.certSANs changed")
	}
	return why
}

// next is when a machine that is up to date now becomes outdated through
// time alone (rollout.after arriving, certificates nearing expiry), or zero
// if never. The reconciler wakes then, as no watch would.
func (ro rollout) next(machines []*clusterv1.Machine) time.Time {
	var at time.Time
	earliest := func(t time.Time) {
		if t.After(ro.now) && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	for _, m := range machines {
		if m.CreationTimestamp.Time.Before(ro.after) {
			earliest(ro.after)
		}
		if expiry, ok := certificatesExpiry(m); ok && ro.certThreshold > 0 {
			earliest(expiry.Add(-ro.certThreshold))
		}
	}
	return at
}

// certificatesExpiry reads the CAPI certificates-expiry annotation.
func certificatesExpiry(m *clusterv1.Machine) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339, m.Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation])
	return t, err == nil
}

// readCertificatesExpiry reads when machine's certificates expire from the
// certificate its API server serves, verified against the cluster CA: the
// agent issues all of a machine's certificates at once, with one validity.
func readCertificatesExpiry(ctx context.Context, caPEM []byte, m *clusterv1.Machine) (time.Time, error) {
	ip := engine.MachineIP(m)
	if ip == "" {
		return time.Time{}, errors.New("the machine has no address yet")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return time.Time{}, errors.New("the cluster CA cannot be parsed")
	}
	dialer := &tls.Dialer{NetDialer: &net.Dialer{Timeout: time.Second}, Config: &tls.Config{RootCAs: pool, ServerName: ip, MinVersion: tls.VersionTLS12}}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(agent.APIServerPort)))
	if err != nil {
		return time.Time{}, err
	}
	defer conn.Close()
	leaf := conn.(*tls.Conn).ConnectionState().PeerCertificates[0]
	return leaf.NotAfter, nil
}

// strategy is the planner's name for a rollout strategy.
func strategy(s controlplanev1.RolloutStrategy) quorum.Strategy {
	switch {
	case s.Type == controlplanev1.OnDelete:
		return quorum.OnDelete
	case ptr.Deref(s.RollingUpdate.MaxSurge, 1) == 0:
		return quorum.RemoveFirst
	}
	return quorum.SurgeFirst
}

// observeCertificates reads the certificates of each machine QCP has not
// read yet and that runs: its member serves (stacked etcd), or its Node is
// Ready (external etcd, where machines host no member). Its agent's
// endpoint lists every leaf, which gives the renewal time the planner
// renews it at. A machine on an external etcd whose agent predates the
// endpoint cannot be renewed in place: its expiry is read from the
// certificate its API server serves instead. A machine that does not
// answer is asked again next time.
func observeCertificates(ctx context.Context, secrets *clusterSecrets, obs *observation) map[string]engine.PKIRecords {
	out := map[string]engine.PKIRecords{}
	for _, m := range obs.Machines {
		if ready, _ := nodeHealth(obs.node(m)); !ready || (obs.external == nil && !obs.MemberServes(m)) {
			continue
		}
		rec, ok, err := obs.ReadPKI(ctx, m)
		if _, known := certificatesExpiry(m); err != nil && obs.external != nil && !known {
			if rec.Expiry, err = readCertificatesExpiry(ctx, secrets.cas.Cluster.CertPEM, m); err == nil {
				out[m.Name] = rec
				continue
			}
		}
		if err != nil {
			log.FromContext(ctx).V(1).Info("Cannot read the machine's certificates yet", "machine", m.Name, "err", err.Error())
		}
		if ok {
			out[m.Name] = rec
		}
	}
	return out
}
