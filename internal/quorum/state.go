// Package quorum is QCP's quorum engine: a pure planner that looks at a
// snapshot of a control plane's machines and etcd members and returns exactly
// one next step, plus the safety invariants I1–I9 that every step must keep.
//
// The package does no I/O and imports only the standard library. Like etcd's
// raft package, it is a state machine whose caller (a reconciler, or the
// real-etcd test driver) observes the world, builds a State, calls Plan,
// carries out the Decision and observes again.
//
// # Lifecycle of a machine, as the planner models it
//
//  1. CreateMachine(fd): the caller creates a Machine. Until its
//     infrastructure is ready it has no PeerURL ("provisioning").
//  2. The very first machine of a cluster (no etcd members at all) bootstraps
//     a new cluster (--initial-cluster-state=new); its member appears as a
//     started voter on its own. Every later machine joins:
//  3. AddLearner(machine): the caller calls MemberAddAsLearner with the
//     machine's PeerURL. The member now exists, unstarted (empty name).
//  4. The machine then starts etcd with --initial-cluster-state=existing and
//     the full --initial-cluster; once started the member's name is the
//     machine's name.
//  5. AddHook(machine), once the learner is started, healthy and caught up:
//     the pre-drain hook must be on the machine before it hosts a voter (I5).
//  6. Promote(member): the learner becomes a voter.
//
// A healthy machine leaves the other way round: MoveLeader away from it if it
// hosts the leader (I6), DeleteMachine (the hook holds the drain), then
// RemoveMember once its replacement votes (maxSurge 1), then RemoveHook,
// after which the infrastructure provider finishes deleting the machine.
// Machines the user deletes enter the same path at the RemoveMember step.
//
// An unhealthy member goes first (etcd FAQ): RemoveMember, then the machine
// is "spent" (its recorded Machine.MemberID is gone) and is deleted and
// replaced; a learner that never starts is handled the same way. A deleting
// machine whose hook an operator removed by hand is let go: its member is
// then removed when that is quorum-safe, or the planner reports Degraded.
//
// # Policy where it is not obvious
//
//   - Unknown membership. An unreadable or empty member list is not "no
//     members". Once etcd has been bootstrapped (State.Bootstrapped) or any
//     machine has recorded a member (MemberID or JoinStarted), the planner
//     takes no step until it can see the list; bootstrap happens only when
//     neither holds.
//   - Hooks. Deleting a voter's machine without the hook is an I5 (and I1)
//     violation in Check: the drain would take the voter before its member
//     is removed.
//   - Preflight. A machine is created, or a voter's machine deleted, only
//     while every other voter machine's Node is Ready and its components
//     are healthy (ComponentsHealthy), besides every voter being healthy.
//     The machine the step replaces or removes, and machines a health
//     check marked, are exempt: a broken machine must stay replaceable.
//   - Fault tolerance. A healthy voter leaves only while every other voter
//     is healthy, or when the count drops from even to odd; otherwise the
//     planner waits for the unhealthy one to recover or be remediated. A
//     voter whose machine an operator let go (deleting, hook removed)
//     counts as unhealthy for this, since it is about to drop out.
//   - Stale observations. Every step carries an Expectation: the desired
//     count, failure domains, deleting and hooked machines, member IDs and
//     roles, healthy members, leader, and the target machine's
//     resourceVersion. The caller re-observes and calls Decision.Verify
//     right before acting, and makes its writes conditional on the
//     resourceVersion; on a mismatch it plans again.
//   - Alarms. An alarm is not ill health (observers must read alarms from
//     the alarm list, not from Status errors). While one is raised, only
//     removals QCP would make anyway go ahead, when quorum-safe: stray
//     learners, and leaving voters, the alarmed ones first and without
//     waiting for a replacement. Everything else is Degraded, naming the
//     alarm even if quorum is lost too.
//   - Health-check marks. A marked machine that hosts no voter yet is
//     deleted, not joined. A marked unhealthy voter is removed first. A
//     marked healthy voter is outdated: it is replaced like a rollout, its
//     replacement joining before its member leaves.
//   - Timeouts. The bootstrap timeout counts from InfraReadyAt, a learner's
//     from AddedAt; an unknown time counts as now (the caller persists it).
//     Provisioning itself has no timeout here: it is the MachineHealthCheck's
//     node-startup timeout, which marks the machine.
//   - Records. A machine whose join started (JoinStarted) and that hosts no
//     member is spent and replaced, never joined a second time with a stale
//     data directory. A down voter with an unknown UnhealthySince is waited
//     for by name, never reported as "nothing to do".
//   - Lowering desired. A machine that does not vote yet is cancelled when
//     more machines are kept than desired (plus one surge machine while an
//     outdated voter remains), instead of being joined only to shrink etcd
//     again.
//   - Maintenance. A member whose database is more fragmented than
//     Tunables.DefragThresholdPercent is defragmented (Defragment) only
//     when nothing else is to be done: no learner, every voter healthy,
//     at least three voters (so the cluster can lose the one that
//     defragments), no other member defragmenting, and its last
//     defragmentation DefragMinInterval ago. Followers go first; the
//     leader's leadership is moved away first. A defragmentation, like a
//     membership change, disrupts one member: while one is in flight no
//     membership changes and no voter is remediated for not answering.
//   - NOSPACE. With only NOSPACE alarms raised, QCP recovers by itself:
//     Compact to the leader's revision minus CompactionRetention (once
//     per recovery: only past CompactedRevision), Defragment every member
//     not defragmented since the compaction, one at a time as above but
//     also in a cluster of one or two voters (it refuses writes already),
//     then DisarmAlarm once every member's database is below its quota.
//     If one is still over it, the live data does not fit: Degraded,
//     naming the quota setting. While NOSPACE is raised, a health check's
//     mark or a member past UnhealthyTimeout removes no member: Nodes go
//     NotReady because the API servers cannot renew leases, not because
//     machines broke.
//   - Quota. A voter known to run with another backend quota than
//     State.QuotaBackendBytes is restarted in place with it
//     (RestartMember), a disruption of the same class as a
//     defragmentation: one at a time, followers first, the leader after a
//     leadership transfer, only while the cluster can lose a member (or
//     could never: a desired size of one or two), and under NOSPACE
//     before the recovery's defragmentations, since a raised quota is
//     what a database over the quota needs.
//   - Certificates. A machine whose earliest leaf certificate passed its
//     renewal point (Machine.CertificatesRenewAt) has its agent renew its
//     certificates in place (RenewCertificates): no machine is replaced.
//     It is maintenance: only when no membership, scaling, rollout or
//     remediation step is to be taken, before defragmentations and
//     restarts. A renewal does not disrupt etcd (it reloads certificate
//     files at each handshake), so it needs no fault tolerance and a
//     one-machine control plane renews too; but it only renews a machine
//     whose member is a healthy, started voter (or, in the APIServersOnly
//     topology, that serves), the earliest due first, one machine at a
//     time, and never beside a member's disruption: a defragmentation
//     or restart waits for a renewal in flight, and the other way round.
//   - Quorum loss. QCP never loses quorum by its own steps (I1, I7), but
//     the world can take it. With the policy RecoverFromSurvivor, or a
//     human's trigger, the planner then rebuilds etcd from the survivor
//     with the highest applied index (Recover): a new cluster of one
//     that keeps the survivor's data, its revision bumped, which grows
//     back with learners. It waits until the loss has lasted
//     Recovery.After (a trigger does not), and until every voter that
//     does not answer runs on a machine confirmed lost (I9): a member
//     alive behind a partition must never serve beside the recovered
//     cluster. The survivors are read from each member alone
//     (State.Survivors), since the member list cannot be read without
//     quorum.
//   - Failure domains. A new machine goes to the domain with the fewest
//     machines that will remain (every kept machine except the one a
//     rollout replaces), ties broken alphabetically; scale-down takes the
//     oldest machine of the fullest domain within its priority class.
package quorum

import "time"

// Topology says where etcd runs. The planner treats Stacked and External
// alike (the odd-replica rule for stacked etcd is enforced by the webhook);
// APIServersOnly has rules of its own.
type Topology string

const (
	// Stacked etcd runs on the control plane machines next to the API server.
	Stacked Topology = "Stacked"
	// External etcd runs on etcd-only machines (an EtcdCluster).
	External Topology = "External"
	// APIServersOnly machines run a control plane whose etcd is external:
	// they host no member, and State.Members is ignored. The planner then
	// manages the machines alone (see rules_apiservers.go).
	APIServersOnly Topology = "APIServersOnly"
)

// Strategy is how outdated machines are replaced (the control plane's
// rollout strategy).
type Strategy string

const (
	// SurgeFirst is RollingUpdate with maxSurge 1, the default: the
	// replacement is created first, and the outdated machine goes once the
	// replacement's member votes.
	SurgeFirst Strategy = ""
	// RemoveFirst is RollingUpdate with maxSurge 0: the outdated machine's
	// member is removed and the machine deleted first, and its replacement
	// is created only once it is gone, so there are never more machines
	// than desired. It needs at least 3 replicas (the webhook's rule);
	// with fewer the planner surges as with SurgeFirst.
	RemoveFirst Strategy = "RemoveFirst"
	// OnDelete replaces only machines that are deleted (by a user) or that
	// a health check marked; an outdated machine stays until then. Deleted
	// machines are still replaced one at a time, each member removed only
	// once its replacement votes.
	OnDelete Strategy = "OnDelete"
)

// HookAnnotation is the pre-drain hook QCP puts on machines that host voters.
const HookAnnotation = "pre-drain.delete.hook.machine.cluster.x-k8s.io/qcp-etcd-quorum"

// TerminateHookAnnotation is the pre-drain hook's pre-terminate twin. CAPI
// core skips pre-drain hooks on a Machine that has no Node yet, or that is
// the cluster's last control plane machine, and deletes its
// infrastructure, with the etcd member on it, at once: a machine deleted
// right after it joined, or the only machine of a one-machine control
// plane, took its member with it. CAPI never skips a pre-terminate hook,
// which holds the infrastructure until the member is removed (as KCP's
// kcp-cleanup hook does).
const TerminateHookAnnotation = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/qcp-etcd-quorum"

// HookAnnotations are the hook's two annotations. AddHook sets both,
// RemoveHook removes both, and a machine that carries either has the hook
// (Machine.HasHook): an operator who lets a machine go removes both.
var HookAnnotations = []string{HookAnnotation, TerminateHookAnnotation}

// HasHook reports whether annotations carry either of HookAnnotations.
func HasHook(annotations map[string]string) bool {
	for _, a := range HookAnnotations {
		if _, ok := annotations[a]; ok {
			return true
		}
	}
	return false
}

// DeleteAnnotation marks a machine the user prefers to lose on scale down.
const DeleteAnnotation = "cluster.x-k8s.io/delete-machine"

// State is one observation of a control plane, built by the caller.
// Order of Machines and Members does not matter: Plan sorts its own copies.
type State struct {
	// Desired is the number of voters (and machines) wanted, ≥ 1.
	Desired int
	// Topology is stacked or external etcd.
	Topology Topology
	// Strategy is how outdated machines are replaced.
	Strategy Strategy
	// FailureDomains are the domains machines may be placed in (from the
	// Cluster's status). Empty means one unnamed domain ("").
	FailureDomains []string
	// Machines are the control plane (or etcd) machines, including deleting
	// ones, that exist right now.
	Machines []Machine
	// Members is the etcd member list as reported by a healthy member, with
	// per-member status filled in.
	Members []Member
	// MembersUnknown is true when the caller could not observe the member
	// list: no member answered, or the members disagree about it. Members is
	// then ignored. An unknown list is never taken for an empty one: once a
	// machine has recorded a member, the planner takes no step until the
	// list can be read again.
	MembersUnknown bool
	// Bootstrapped is true once etcd has ever had a member. The caller
	// persists it on the control plane object, which outlives every machine:
	// with all machines gone, no machine is left to remember that etcd held
	// data, and a new cluster must never be bootstrapped over it.
	Bootstrapped bool
	// ExternalEtcdProblem, in the APIServersOnly topology, says why the
	// external etcd cannot be used now ("" when it can). The planner then
	// changes no machine: with etcd gone every API server fails its health
	// checks, and remediating them would only replace the whole control
	// plane.
	ExternalEtcdProblem string
	// DepartedAlarms are active alarms raised by members that are no longer
	// listed. etcd keeps an alarm after the member that raised it is
	// removed, and only an explicit disarm clears it: a NOSPACE left behind
	// still refuses every write, and a CORRUPT still means some data may be
	// wrong. The caller reads them from the cluster-wide alarm list.
	DepartedAlarms []Alarm
	// QuotaBackendBytes is etcd's backend quota (--quota-backend-bytes) as
	// the caller configured it; 0 when unknown. A departed member's NOSPACE
	// is disarmed only once every member's DBSize is known to be below it.
	// A voter known to run with another quota is restarted in place with
	// this one (RestartMember), one at a time.
	QuotaBackendBytes int64
	// CompactedRevision is the revision QCP last compacted etcd to
	// (Compact), and CompactedAt when; the caller records both, and 0 and
	// zero mean never. A NOSPACE recovery compacts only past it, and
	// defragments each member once after it: it never loops.
	CompactedRevision int64
	CompactedAt       time.Time
	// Now is the caller's clock; the planner never reads the system clock.
	Now time.Time
	// Restore is the snapshot a new cluster's first machine restores;
	// zero when etcd starts empty.
	Restore RestoreState
	// Recovery is what to do once etcd has lost quorum for good; the zero
	// value is Manual: report it and wait for a human.
	Recovery RecoveryState
	// Survivors are the members that answered on their own while the
	// member list could not be read (MembersUnknown), each with the member
	// list it has applied; the caller fills them in only then. A recovery
	// from a survivor (RecoverFromSurvivor) chooses among them.
	Survivors []Survivor
	// Backup is what the caller knows of the backups; zero when none are
	// configured.
	Backup BackupState
	// Tunables are the configurable thresholds; zero values get defaults.
	Tunables Tunables
}

// Tunables are the knobs of the planner.
type Tunables struct {
	// LearnerStartTimeout is how long an added learner may stay unstarted
	// (or unreachable) before its machine is deleted and the learner removed.
	// Default 5 minutes.
	LearnerStartTimeout time.Duration
	// UnhealthyTimeout is how long a voter may stay unhealthy before it is
	// remediated (removed first, then replaced). Default 5 minutes. Zero
	// after defaulting is not possible; use a tiny duration for "at once".
	UnhealthyTimeout time.Duration
	// CatchUpMaxLag is how far, in applied raft index, a learner may trail
	// the leader and still be promoted. Default 1000.
	CatchUpMaxLag uint64
	// LearnerStallTimeout is how long a started learner that answers but
	// trails the leader by more than CatchUpMaxLag may go without getting
	// closer (Member.CatchUpProgressAt) before it is removed and its machine
	// replaced: it holds etcd's only learner slot, and every rollout,
	// scale-up and replacement waits behind it. Default 5 minutes.
	LearnerStallTimeout time.Duration
	// DefragDisabled turns automatic defragmentation off.
	DefragDisabled bool
	// DefragThresholdPercent is the share of a member's database, in
	// percent, that must be free pages (1 − DBSizeInUse/DBSize) before the
	// member is defragmented. Default 45, as OpenShift's etcd operator.
	DefragThresholdPercent int
	// DefragMinDBSize is the database size, in bytes, below which a member
	// is never defragmented, however fragmented: the space is not worth a
	// disruption. Default 100 MiB.
	DefragMinDBSize int64
	// DefragMinInterval is the least time between two defragmentations of
	// the same member. Default 1 hour.
	DefragMinInterval time.Duration
	// CompactionRetention is how many revisions of history a NOSPACE
	// recovery keeps when it compacts etcd. Default 1000.
	CompactionRetention int64
	// DefragTimeout is how long after a defragmentation started a member
	// that does not answer counts as busy defragmenting, a disruption in
	// flight, rather than unhealthy. Default 10 minutes.
	DefragTimeout time.Duration
	// RestartTimeout is the same for a restart in place (RestartMember):
	// etcd is back within seconds, so a member still down after it is
	// unhealthy. Default 2 minutes.
	RestartTimeout time.Duration
	// RenewTimeout is how long after a certificate renewal started
	// (Machine.RenewStartedAt) an open record counts as a renewal in
	// flight: no other renewal, defragmentation or restart in place
	// starts meanwhile. Past it the record counts as finished or failed,
	// and a machine still due is renewed again. Default 5 minutes: the
	// agent restarts the controller manager and the scheduler one after
	// the other, each waiting for health.
	RenewTimeout time.Duration
}

// Alarm is one active etcd alarm and the member that raised it.
type Alarm struct {
	// MemberID is the member that raised the alarm.
	MemberID uint64
	// Type is the alarm, as etcd names it: NOSPACE or CORRUPT.
	Type string
}

// Machine is one machine that hosts (or will host) an etcd member.
type Machine struct {
	// Name is the Machine's name; a started member carries the same name.
	Name string
	// FailureDomain is the domain the machine was placed in ("" if none).
	FailureDomain string
	// PeerURL is the etcd peer URL the machine will use (https://ip:2380).
	// Empty while the infrastructure is still provisioning.
	PeerURL string
	// UpToDate is false when the machine's spec (version, template, config,
	// rolloutAfter, certificate expiry) calls for a rollout.
	UpToDate bool
	// CreatedAt orders machines by age (oldest is removed first).
	CreatedAt time.Time
	// InfraReadyAt is when the machine's infrastructure became ready (it got
	// its PeerURL). The bootstrap timeout counts from here, so slow
	// provisioning never counts against etcd. Zero means unknown and counts
	// as Now: the caller must persist the time it first saw.
	InfraReadyAt time.Time
	// ResourceVersion is the Machine object's version as observed. Decisions
	// that change the machine carry it, so that the caller's write fails if
	// the machine changed since (see Expectation).
	ResourceVersion string
	// Deleting is true once the Machine has a deletion timestamp.
	Deleting bool
	// DeleteAnnotated is true when the machine carries DeleteAnnotation.
	DeleteAnnotated bool
	// HasHook is true when the machine carries either of HookAnnotations.
	HasHook bool
	// NodeReady is the Node's Ready condition (stacked topology only; ignored
	// for external etcd machines, which have no Node).
	NodeReady bool
	// ComponentsHealthy is true when the control plane components (or, for
	// external etcd, the etcd process) on the machine report healthy.
	ComponentsHealthy bool
	// EtcdAnswersOnMachine is the machine's own word, read through the
	// workload cluster and fresh, that its etcd member answers its health
	// check there (stacked topology only). etcd's /health passes only on a
	// member that has a leader and serves a linearizable read, so a
	// majority of its peers reach it. A voter that does not answer QCP
	// while its machine says so is cut off from QCP, not down (a partition
	// between the management cluster and the machine, KCP's #8465): it
	// stays unhealthy to every quorum decision, since QCP can neither read
	// it nor reach it for a step, but it is not replaced for being
	// unhealthy. A health check's mark on its machine still replaces it.
	EtcdAnswersOnMachine bool
	// CreationFailed is true when the infrastructure reported a terminal
	// failure; such a machine is deleted and created again.
	CreationFailed bool
	// MemberID is the ID of the etcd member QCP added for this machine (or
	// that bootstrapped on it), recorded by the caller (for example in an
	// annotation) as soon as it is known; 0 until then. It maps members to
	// machines without relying on names or addresses, and a machine whose
	// recorded member is gone is "spent": it is deleted, never re-joined,
	// because etcd never reuses IDs and its data directory is stale.
	MemberID uint64
	// JoinStarted is true once the caller has begun adding this machine to
	// etcd. The caller records it before it calls MemberAddAsLearner, so a
	// crash between that call and recording MemberID is visible: a machine
	// that has started joining and hosts no member is spent, never joined a
	// second time with a stale data directory. (After such a crash the
	// learner itself is found by its peer URL.)
	JoinStarted bool
	// Remediate is true when a MachineHealthCheck marked the machine for
	// remediation. A machine that hosts no voter yet is deleted; an
	// unhealthy voter is removed first, without waiting for
	// UnhealthyTimeout; a healthy voter's machine is deleted under its hook
	// and replaced first, like a rollout.
	Remediate bool
	// HoldRemediation is true when the caller's remediation policy refuses
	// or postpones remediating this machine (retries used up, a retry
	// period running, another remediation unfinished). The planner then
	// neither replaces it for its mark nor removes its member for being
	// unhealthy: a human decides.
	HoldRemediation bool
	// RemediationQueued, with HoldRemediation, says the hold is only a
	// turn: another machine's remediation is unfinished until its
	// replacement is created. Its unhealthy voter then does not stop that
	// replacement from being created and joining, or one remediation at a
	// time would wait forever behind a second dead member (two of five
	// down, cluster-api#10125).
	RemediationQueued bool
	// DefragStartedAt is when QCP started defragmenting the machine's
	// member and has not yet recorded the end (the caller records it right
	// before the call and clears it right after); zero when none is open.
	// An open record on a member that does not answer means the member is
	// busy defragmenting, a disruption in flight (see Tunables.DefragTimeout).
	DefragStartedAt time.Time
	// DefragmentedAt is when QCP last finished defragmenting the machine's
	// member; zero if never. Tunables.DefragMinInterval counts from it.
	DefragmentedAt time.Time
	// RestartStartedAt is when QCP asked the machine's agent to restart
	// its etcd with new settings (RestartMember) and has not yet recorded
	// the end; zero when none is open. Like DefragStartedAt, an open record
	// on a member that does not answer is a disruption in flight (see
	// Tunables.RestartTimeout).
	RestartStartedAt time.Time
	// QuotaBackendBytes is the backend quota the machine's etcd was last
	// given: by its bootstrap data, or by the last RestartMember; 0 when
	// unknown. The member's own report (Member.DBSizeQuota) wins where
	// there is one; etcd 3.5 has none.
	QuotaBackendBytes int64
	// CertificatesRenewAt is when the machine's certificates are due for
	// renewal, computed by the caller from what the machine's agent
	// reports: the first point at which a leaf it issued has lived two
	// thirds of its life, or earlier when the machine must be given new
	// material (an etcd client pair renewed by its owner). Zero when
	// unknown, and a machine is never renewed on an unknown time. From
	// then on QCP renews its certificates in place (RenewCertificates),
	// one machine at a time.
	CertificatesRenewAt time.Time
	// RenewStartedAt is when QCP asked the machine's agent to renew its
	// certificates (RenewCertificates) and has not yet recorded the end;
	// zero when none is open. Like DefragStartedAt, an open record
	// younger than Tunables.RenewTimeout is a renewal in flight; an older
	// one finished or failed.
	RenewStartedAt time.Time
	// ConfirmedLost is true when the machine is known not to run: its
	// infrastructure reports it stopped or gone (a process machine whose
	// agent exited), or a user annotated the Machine as lost for good. A
	// recovery from a survivor fences on it: it never starts while a lost
	// member's machine may still run behind a partition.
	ConfirmedLost bool
	// AuthorityUpdate is what the machine lacks of the current stage of
	// a CA rotation (of the etcd CA or the cluster CA), by the caller's comparison of what its agent
	// reports with what the stage wants; AuthorityCurrent (the zero value)
	// when nothing, no rotation runs, or it is unknown. See
	// SetAuthority.
	AuthorityUpdate AuthorityUpdate
}

// AuthorityUpdate is what a machine must change to reach the current stage
// of an etcd CA rotation.
type AuthorityUpdate string

const (
	// AuthorityCurrent: nothing.
	AuthorityCurrent AuthorityUpdate = ""
	// AuthorityTrust: the etcd authorities it trusts. etcd reads them
	// once, at its start, so the change restarts the member: a
	// disruption.
	AuthorityTrust AuthorityUpdate = "Trust"
	// AuthorityLeaves: a change that restarts no member: the authority its
	// etcd leaves are issued from (they are issued again and reloaded), or
	// any change of a cluster CA rotation (etcd is not touched; the
	// controller manager and the scheduler restart).
	AuthorityLeaves AuthorityUpdate = "Leaves"
)

// Member is one etcd member, from MemberList plus per-member Status.
type Member struct {
	// ID is the etcd member ID; IDs are never reused.
	ID uint64
	// Name is empty until the member has started; then it equals the name
	// of the machine that hosts it.
	Name string
	// PeerURL is the member's (first) peer URL; it matches Machine.PeerURL.
	PeerURL string
	// Learner is true for a non-voting member.
	Learner bool
	// Healthy is the member's health. For voters: /health succeeded. For
	// learners (which fail /health by design): its Status call succeeded.
	Healthy bool
	// UnhealthySince is when the caller first saw the member unhealthy. Zero
	// on an unhealthy member means unknown and counts as Now: the caller
	// must persist the time it first saw, or the member is never remediated.
	UnhealthySince time.Time
	// AddedAt is when QCP added the member as a learner (recorded by the
	// caller). Zero means unknown and counts as Now, never as the machine's
	// creation: provisioning time must not count against the learner.
	AddedAt time.Time
	// AppliedIndex is the member's raft applied index (from Status).
	AppliedIndex uint64
	// Revision is the member's store revision; 0 when unknown. A NOSPACE
	// recovery compacts to the leader's, less the retention.
	Revision int64
	// Alarms are the active alarms this member raised (NOSPACE, CORRUPT),
	// from etcd's alarm list, which names the raising member. Not the Errors
	// of a member's Status: those repeat every cluster-wide alarm on every
	// member. An alarm does not make a member unhealthy.
	Alarms []string
	// Leader is true for the member that is currently the raft leader.
	Leader bool
	// CatchUpProgressAt is, for a learner, when the caller last saw it get
	// closer to the leader: its lag (the leader's applied index minus its
	// own) reached a new low. A learner catching up steadily keeps moving
	// it; one whose disk cannot keep up, or whose snapshots keep failing,
	// does not. Zero means unknown and counts as Now.
	CatchUpProgressAt time.Time
	// DBSize is the member's backend database size in bytes, from Status;
	// 0 when unknown.
	DBSize int64
	// DBSizeInUse is the part of DBSize that holds data, from Status; the
	// rest is free pages that only defragmentation gives back.
	DBSizeInUse int64
	// DBSizeQuota is the backend quota the member reports it runs with
	// (etcd 3.6 and later); 0 when it does not say, as etcd 3.5 does not.
	DBSizeQuota int64
}

// Started reports whether the member's process has joined (etcd fills in the
// name only once the member has started).
func (m Member) Started() bool { return m.Name != "" }

// Voter reports whether the member votes.
func (m Member) Voter() bool { return !m.Learner }

// RestoreState is the caller's verdict on the snapshot a new cluster
// restores (spec.restore), or a recovery from a backup would restore
// (the newest verified one, while RecoverFromBackup is asked and no member
// answers, or while Recovery.Restoring).
type RestoreState struct {
	// Requested: etcd is to start from a snapshot, not empty.
	Requested bool
	// Snapshot names the snapshot found and checked.
	Snapshot string
	// Problem is why the snapshot cannot be restored now (a missing
	// Secret, no verified snapshot, a checksum or a key that does not
	// match); empty when it can.
	Problem string
}

// BackupState is the caller's verdict on the backups.
type BackupState struct {
	// Configured: spec.backup is set, so risky steps wait for a recent
	// verified snapshot.
	Configured bool
	// Problem is why no snapshot can be taken now (a missing Secret, a
	// schedule that does not parse); empty when one can.
	Problem string
	// Due: the schedule says a snapshot is due (and none can be without
	// Configured and an empty Problem).
	Due bool
	// LastVerified is when the newest verified snapshot was verified (when
	// it was started, for a record older than that field); zero when there
	// is none.
	LastVerified time.Time
	// MaxAgeBeforeRisky is how old that snapshot may be for a risky step
	// (the first machine of a rollout, a scale-down) to go ahead.
	MaxAgeBeforeRisky time.Duration
	// RetryAt is when a snapshot may be tried again after a failure; zero
	// when the last attempt succeeded.
	RetryAt time.Time
}

// RecoveryPolicy says what QCP does once etcd has lost quorum for good.
type RecoveryPolicy string

const (
	// RecoverManually (the default) reports the loss and waits for a
	// human, who may trigger a recovery (RecoveryState.Triggered).
	RecoverManually RecoveryPolicy = ""
	// RecoverFromSurvivor rebuilds etcd from the surviving member with
	// the highest applied index, once the loss has lasted
	// RecoveryState.After and every lost voter's machine is confirmed
	// lost (Machine.ConfirmedLost).
	RecoverFromSurvivor RecoveryPolicy = "FromSurvivor"
	// RecoverFromBackup recovers as RecoverFromSurvivor does while a
	// member survives (it holds newer data than any snapshot); once none
	// answers at all, and every machine that hosted a member is confirmed
	// lost, it restores the newest verified snapshot (State.Restore) onto
	// a new machine (the decision RestoreFromBackup).
	RecoverFromBackup RecoveryPolicy = "FromBackup"
)

// RecoveryState is the caller's recovery policy and what it knows of the
// loss.
type RecoveryState struct {
	// Policy is spec.quorumLossRecovery.policy.
	Policy RecoveryPolicy
	// After is how long the loss must last before Policy recovers.
	After time.Duration
	// Triggered: a human asked for one recovery from a survivor now
	// (the one-shot trigger), whatever Policy and After say. Fencing
	// still applies.
	Triggered bool
	// LostSince is when the caller first saw etcd without quorum, in
	// this loss; zero counts as Now (the caller persists what it first
	// saw).
	LostSince time.Time
	// TriggerBackup: the one-shot trigger asks for a restore from the
	// newest verified snapshot (it sets Triggered too). It restores only
	// once no member answers; while one does, it recovers from a survivor.
	TriggerBackup bool
	// Restoring: a recovery from a backup is recorded and not finished:
	// the old cluster's machines (LostMachines, as the record names them)
	// go, then a new first machine restores State.Restore's snapshot. The
	// caller clears it once that machine's member is listed.
	Restoring    bool
	LostMachines []string
}

// Survivor is a member that answered on its own while etcd had no quorum:
// its status, and the member list it has applied.
type Survivor struct {
	// Member is the member as its own status reports it: ID, Name,
	// PeerURL, AppliedIndex and Revision; Learner as its view lists it.
	Member
	// View is the member list the survivor has applied (ID, Name,
	// PeerURL, Learner), read from it alone.
	View []Member
}
