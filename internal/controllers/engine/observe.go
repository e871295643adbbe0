package engine

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// Observation is what every owner's look at its machines has: the Machines
// (read live, never from the cache, sorted by name), the etcd members as
// observed with the records kept on the machines, and the planner's State
// built from them.
type Observation struct {
	Machines []*clusterv1.Machine
	// Etcd is the client the members were read through; nil with no
	// machine address to dial.
	Etcd *etcd.Client
	// Members as observed, with the caller's records; MembersErr is why
	// they are unknown.
	Members    []quorum.Member
	MembersErr error
	// DepartedAlarms are the active alarms of members no longer listed
	// (see etcd.Client.Observe).
	DepartedAlarms []quorum.Alarm
	State          quorum.State
	// AgentTLS is how qcp-manager reaches the machines' agents (their
	// certificates, on :2382): with its etcd client certificate where the
	// machines run etcd members, with a cluster-CA one (AgentClients)
	// where they do not; nil while neither can be had.
	AgentTLS *tls.Config
	// EtcdClientPair is the etcd client pair the machines' API servers
	// must hold, which a renewal delivers: the <cluster>-apiserver-etcd-client
	// Secret's on an external etcd or an EtcdCluster; nil where the machines
	// issue their own.
	EtcdClientPair *certs.KeyPair
	// Authority is, while a CA rotation runs, what its stage gives each
	// machine (of AuthorityKind), and AuthorityWant the machines' record of
	// it (AuthorityAnnotation's form); nil and "" otherwise.
	Authority     *agent.Authority
	AuthorityKind agent.AuthorityKind
	AuthorityWant string
	// Backup is the owner's backup configuration with its Secrets read;
	// BackupErr is why it cannot be used. Both are nil without
	// spec.backup.
	Backup    *BackupConfig
	BackupErr error
	// Restore is the snapshot a recovery from a backup restores, found
	// and checked while one may come of it or runs
	// (ResolveRecoveryRestore); nil otherwise.
	Restore *Restore
}

// PlannerMachine is what every owner's machine tells the planner: where it
// is, its address, its age and records, and whether it is being deleted or
// carries the hook. upToDate is the owner's rollout verdict on it; the
// owner adds the machine's health.
func PlannerMachine(machine *clusterv1.Machine, upToDate bool) quorum.Machine {
	hook := quorum.HasHook(machine.Annotations)
	_, deleteMe := machine.Annotations[quorum.DeleteAnnotation]
	m := quorum.Machine{
		Name:            machine.Name,
		FailureDomain:   machine.Spec.FailureDomain,
		PeerURL:         PeerURL(machine),
		UpToDate:        upToDate,
		CreatedAt:       machine.CreationTimestamp.Time,
		ResourceVersion: machine.ResourceVersion,
		Deleting:        !machine.DeletionTimestamp.IsZero(),
		DeleteAnnotated: deleteMe,
		HasHook:         hook,
		ConfirmedLost:   ConfirmedLost(machine),
	}
	ReadRecords(machine).Apply(&m)
	return m
}

// Machine returns the observed Machine named name, or nil.
func (o *Observation) Machine(name string) *clusterv1.Machine {
	for _, m := range o.Machines {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// HostOf returns the first observed Machine that hosts mb (MemberOn), or
// nil.
func (o *Observation) HostOf(mb quorum.Member) *clusterv1.Machine {
	for _, m := range o.Machines {
		if on, ok := o.MemberOn(m); ok && on.ID == mb.ID {
			return m
		}
	}
	return nil
}

// MemberOn returns the member hosted on machine m (see FindMember); none
// when the match is ambiguous.
func (o *Observation) MemberOn(m *clusterv1.Machine) (quorum.Member, bool) {
	mb, ok, _ := o.FindMember(m)
	return mb, ok
}

// FindMember returns the member hosted on machine m: by recorded ID, then
// by name, then, for a machine without a recorded ID, by peer URL among
// members that have not started (a learner added just before a crash has
// neither a record nor a name yet). A started member is never matched by
// address: an address reused by a new machine would otherwise hand it an
// old member's ID, which KeepRecords records and the new machine would
// rejoin as, with an empty data directory. A pass that finds more than one
// candidate, or a peer URL other unrecorded machines share, matches
// nothing, and refused says why, for the owner's status.
func (o *Observation) FindMember(m *clusterv1.Machine) (mb quorum.Member, ok bool, refused string) {
	id, url := ReadRecords(m).MemberID, PeerURL(m)
	passes := []struct {
		by    string
		match func(quorum.Member) bool
	}{
		{"member ID", func(mb quorum.Member) bool { return id != 0 && mb.ID == id }},
		{"name", func(mb quorum.Member) bool { return mb.Name != "" && mb.Name == m.Name }},
		{"peer URL", func(mb quorum.Member) bool { return id == 0 && url != "" && !mb.Started() && mb.PeerURL == url }},
	}
	for _, pass := range passes {
		var found []quorum.Member
		for _, mb := range o.Members {
			if pass.match(mb) {
				found = append(found, mb)
			}
		}
		switch {
		case len(found) > 1:
			return quorum.Member{}, false, fmt.Sprintf("members %s all match it by %s; not mapping any of them to it", memberIDs(found), pass.by)
		case len(found) == 0:
			continue
		case pass.by == "peer URL":
			if others := o.unrecordedAt(url, m.Name); len(others) > 0 {
				return quorum.Member{}, false, fmt.Sprintf("its address %s is also that of machine %s, so unstarted member %s may be any of theirs; not mapping it",
					url, strings.Join(others, ", "), FormatMemberID(found[0].ID))
			}
		}
		return found[0], true, ""
	}
	return quorum.Member{}, false, ""
}

// unrecordedAt names the machines other than except with peer URL url and
// no recorded member ID: the ones an unstarted member at url may belong to.
func (o *Observation) unrecordedAt(url, except string) []string {
	var out []string
	for _, m := range o.Machines {
		if m.Name != except && PeerURL(m) == url && ReadRecords(m).MemberID == 0 {
			out = append(out, m.Name)
		}
	}
	return out
}

// RefusedMatches lists, per machine, why no member was mapped to it when a
// match was ambiguous.
func (o *Observation) RefusedMatches() []string {
	var out []string
	for _, m := range o.Machines {
		if _, _, refused := o.FindMember(m); refused != "" {
			out = append(out, fmt.Sprintf("Machine %s: %s", m.Name, refused))
		}
	}
	return out
}

func memberIDs(ms []quorum.Member) string {
	ids := make([]string, 0, len(ms))
	for _, mb := range ms {
		ids = append(ids, FormatMemberID(mb.ID))
	}
	return strings.Join(ids, ", ")
}

// MembershipInFlight reports whether a membership change no watch reports
// is under way: a learner, a member that is down, a machine that hosts no
// member yet, a machine being deleted, or a membership that cannot be
// read. The reconciler then polls instead of waiting for a watch.
func (o *Observation) MembershipInFlight() bool {
	if o.MembersErr != nil {
		return true
	}
	for _, mb := range o.Members {
		if mb.Learner || !mb.Healthy {
			return true
		}
	}
	for _, m := range o.Machines {
		if _, ok := o.MemberOn(m); !ok || !m.DeletionTimestamp.IsZero() {
			return true
		}
	}
	return false
}

// LocalMember is the etcd section of the next machine's bootstrap data: a
// new cluster when etcd never had a member, and otherwise a join through
// the client URLs of the started voters.
func (o *Observation) LocalMember() bootstrap.LocalEtcd {
	if !o.State.Bootstrapped || o.State.Recovery.Restoring {
		// A new cluster, or the one a recovery from a backup restores.
		return bootstrap.NewMember()
	}
	var endpoints []string
	for _, m := range o.Machines {
		if mb, ok := o.MemberOn(m); ok && mb.Started() && mb.Voter() {
			endpoints = append(endpoints, ClientURL(m))
		}
	}
	return bootstrap.JoinMember(endpoints...)
}

// ManagerEtcdClientName is the common name of qcp-manager's etcd client
// certificate.
const ManagerEtcdClientName = "qcp-manager"

// ObserveEtcd reads the member list through the client URLs of owner's
// AskedMachines of machines, each member's status, the alarms, and whether
// every voter reports the same member list, with a client certificate
// issued from ca, valid for lifetime (0: certs.LeafValidity) and renewed
// after two thirds of it, trusting the PEM bundle trust (nil: ca alone; an
// etcd CA rotation trusts two). A client built from another ca or trust is
// replaced. The client is kept in pool under key. It returns the members,
// with the records of every machine of machines (a machine not asked, such
// as one confirmed lost, still holds since when its member has been
// unhealthy), and the alarms of members since removed. An error means the
// membership is unknown.
func ObserveEtcd(ctx context.Context, pool *etcd.Pool, key string, ca *certs.KeyPair, trust []byte, lifetime time.Duration, owner client.Object, machines []*clusterv1.Machine) (*etcd.Client, []quorum.Member, []quorum.Alarm, error) {
	asked := AskedMachines(owner, machines)
	var endpoints []string
	for _, m := range asked {
		if u := ClientURL(m); u != "" {
			endpoints = append(endpoints, u)
		}
	}
	switch {
	case len(asked) == 0:
		return nil, nil, nil, errors.New("no machine may run an etcd member to ask (there is none yet, or every one is confirmed lost)")
	case len(endpoints) == 0:
		return nil, nil, nil, errors.New("no machine has an address yet, so no etcd member can be asked")
	}
	if trust == nil {
		trust = ca.CertPEM
	}
	cli, err := pool.GetFunc(key, certs.KeyID(ca.Cert)+"/"+string(trust), func() (etcd.Config, error) {
		// The pooled client lives as long as the manager: its certificate
		// renews itself, so a manager that runs longer than the
		// certificate's life keeps reaching etcd.
		cert, err := certs.NewRenewing(func(at time.Time) (*certs.KeyPair, error) {
			return ca.Issue(certs.Request{CommonName: ManagerEtcdClientName, Usages: certs.ClientUsage, Validity: lifetime}, at)
		}, nil)
		if err != nil {
			return etcd.Config{}, err
		}
		return etcd.Config{Endpoints: endpoints, CAPEM: trust, ClientCertificate: cert.ClientCertificate}, nil
	})
	if err != nil {
		return nil, nil, nil, err
	}
	if !slices.Equal(cli.Endpoints(), endpoints) {
		cli.SetEndpoints(endpoints...)
	}
	members, departed, err := cli.Observe(ctx)
	if err != nil {
		return cli, nil, nil, fmt.Errorf("reading the etcd member list: %w", err)
	}
	agreement, err := cli.MemberListAgreement(ctx)
	if err != nil {
		return cli, nil, nil, fmt.Errorf("comparing the voters' member lists: %w", err)
	}
	// A voter that does not answer is down, which its health says; only
	// voters that answer with different lists make the membership unknown.
	if !agreement.Consistent() {
		return cli, nil, nil, fmt.Errorf("the voters report different member lists: %v", agreement.Views)
	}
	return cli, PlannerMembers(members, machines), departed, nil
}

// PlannerMembers adds the caller's records to the observed members: when
// each learner was added and since when each member has been unhealthy, as
// recorded on the machine hosting it (found by member ID, then by name).
func PlannerMembers(members []quorum.Member, machines []*clusterv1.Machine) []quorum.Member {
	out := make([]quorum.Member, len(members))
	for i, m := range members {
		out[i] = m
		for _, machine := range machines {
			r := ReadRecords(machine)
			if r.MemberID == m.ID || (r.MemberID == 0 && m.Name != "" && m.Name == machine.Name) {
				out[i].AddedAt = r.LearnerAdded
				if !m.Healthy {
					out[i].UnhealthySince = r.UnhealthySince
				}
				break
			}
		}
	}
	return out
}

// DefaultQuotaBackendBytes is etcd's own backend quota, 2 GiB, the quota
// of members whose spec sets no quotaBackendBytes.
const DefaultQuotaBackendBytes = controlplanev1.DefaultQuotaBackendBytes

// QuotaBackendBytes is the backend quota the members are to run with, for
// quorum.State.QuotaBackendBytes: the spec's quotaBackendBytes (field), or
// etcd's default when it is unset. The schema keeps a set quota at 16 MiB
// or more, so it is never 0, which etcd would read as its default.
//
// An object stored before the field existed may still set
// quota-backend-bytes in extraArgs, which the webhooks now refuse in any
// new spec. Its members run with that flag, which the agent lets win over
// any other setting, so the flag stays the quota until the user moves it
// to the field: planning with the default instead would restart every
// member for a quota it cannot take. etcd takes the last of repeated
// flags; 0 is its default, and a negative quota turns it off, so that
// every size is below it.
func QuotaBackendBytes(field *int64, extraArgs []controlplanev1.Arg) int64 {
	if field != nil {
		return *field
	}
	quota := DefaultQuotaBackendBytes
	for _, a := range extraArgs {
		if a.Name != "quota-backend-bytes" {
			continue
		}
		switch v, err := strconv.ParseInt(a.Value, 10, 64); {
		case err != nil || v == 0:
			quota = DefaultQuotaBackendBytes
		case v < 0:
			quota = math.MaxInt64
		default:
			quota = v
		}
	}
	return quota
}

// PeerURL is the etcd peer URL of machine: its first internal IP on the
// standard peer port. Empty while the infrastructure has published no
// address, which the planner reads as "still provisioning".
func PeerURL(machine *clusterv1.Machine) string {
	if ip := MachineIP(machine); ip != "" {
		return "https://" + net.JoinHostPort(ip, "2380")
	}
	return ""
}

// ClientURL is machine's etcd client URL, or "" without an address.
func ClientURL(machine *clusterv1.Machine) string {
	if u := PeerURL(machine); u != "" {
		return strings.TrimSuffix(u, ":2380") + ":2379"
	}
	return ""
}

// SortedByName sorts ms by name, in place, and returns it.
func SortedByName(ms []*clusterv1.Machine) []*clusterv1.Machine {
	slices.SortFunc(ms, func(a, b *clusterv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	return ms
}

// ControlPlaneFailureDomains are the Cluster's failure domains flagged for
// the control plane, as the infrastructure provider reports them; etcd
// machines are spread over the same ones.
func ControlPlaneFailureDomains(cluster *clusterv1.Cluster) []string {
	var fds []string
	for _, fd := range cluster.Status.FailureDomains {
		if ptr.Deref(fd.ControlPlane, false) {
			fds = append(fds, fd.Name)
		}
	}
	return fds
}

// MaintenanceTunables returns t with m's defragmentation policy and
// compaction retention, as the planner reads them.
func MaintenanceTunables(t quorum.Tunables, m controlplanev1.EtcdMaintenance) quorum.Tunables {
	t.DefragDisabled = m.Defragmentation == controlplanev1.DefragmentationDisabled
	t.DefragThresholdPercent = int(ptr.Deref(m.DefragThresholdPercent, controlplanev1.DefaultDefragThresholdPercent))
	t.DefragMinDBSize = int64(ptr.Deref(m.DefragMinSizeMiB, controlplanev1.DefaultDefragMinSizeMiB)) << 20
	t.DefragMinInterval = time.Duration(ptr.Deref(m.DefragMinIntervalSeconds, controlplanev1.DefaultDefragMinIntervalSeconds)) * time.Second
	t.CompactionRetention = ptr.Deref(m.CompactionRetentionRevisions, controlplanev1.DefaultCompactionRetention)
	return t
}
