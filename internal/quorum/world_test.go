package quorum

import (
	"fmt"
	"slices"
	"strconv"
	"time"
)

// world is a pure model of what carrying out decisions does to machines and
// etcd, used to explore the planner. Time is coarse: it only moves when the
// planner waits, by one epoch, which is longer than every timeout. That
// keeps the state space finite while still letting timeouts fire.
type world struct {
	desired     int
	strategy    Strategy
	domains     []string
	machines    []wMachine
	members     []wMember
	epoch       int
	nextMachine int
	nextMember  uint64
	// bootstrapped is set once etcd has had a member (State.Bootstrapped).
	bootstrapped bool
	// departed are the alarms of removed members, which etcd keeps until
	// they are disarmed (State.DepartedAlarms).
	departed []Alarm
	// compacted is set once QCP compacted etcd, in epoch compactAt
	// (State.CompactedRevision and CompactedAt).
	compacted bool
	compactAt int
	// quotaRaised: the configured quota is worldRaisedQuota, and members
	// with oldQuota still run with worldQuota until QCP restarts them.
	quotaRaised bool
	// backupDue: the backup schedule says a snapshot is due
	// (State.Backup.Due), until QCP takes one. backupConfigured: risky
	// steps wait for a recent verified snapshot, which backupFresh says
	// exists (taken within the world's time, which never outlives it).
	backupDue, backupConfigured, backupFresh bool
	// restore: the first machine restores a snapshot (State.Restore),
	// until etcd has a member; restoreBad: the snapshot cannot be used
	// yet, until the user fixes it while QCP waits.
	restore, restoreBad bool
	// recovery is the quorum-loss policy, and triggered a human's
	// one-shot recovery (State.Recovery). With either, a world without
	// quorum is observed as a driver does: the member list cannot be
	// read, and the members that answer are survivors.
	recovery  RecoveryPolicy
	triggered bool
	// restoring: a recovery from a backup is open (State.Recovery.
	// Restoring) for the machines lostIDs of the old cluster, until the
	// restored cluster's first member is listed.
	restoring bool
	lostIDs   []int
}

// worldRecoveryAfter is how long a loss lasts before the policy recovers:
// less than an epoch.
const worldRecoveryAfter = 5 * time.Minute

// The backend quota of the world's etcd, and the database sizes its
// members report: below it, or above it for a member that raised NOSPACE.
const (
	worldQuota  = 2 << 30
	worldDBSize = 1 << 30
	// worldRaisedQuota is the quota a user raised worldQuota to: every
	// database fits under it.
	worldRaisedQuota = 4 << 30
	// worldDefragInterval is shorter than an epoch, so that a member
	// defragmented in an earlier epoch may be again.
	worldDefragInterval = 5 * time.Minute
	// worldRevision is every member's revision: worldRevision − the
	// default retention is what QCP compacts to.
	worldRevision = 4000
)

type wMachine struct {
	id          int
	fd          string
	born        int // epoch of creation
	readyAt     int // epoch its infrastructure became ready
	addr        bool
	upToDate    bool
	deleting    bool
	annotated   bool
	hook        bool
	failed      bool
	broken      bool // etcd on it never starts
	noInfra     bool // its infrastructure never becomes ready
	slow        bool // its next step of progress (address, start, catch-up) is late by an epoch
	stalled     bool // its learner starts and answers but never catches up
	remediate   bool // a MachineHealthCheck marked it
	joinStarted bool
	memberID    uint64
	defragOpen  bool // a defragmentation record is open (started, end not recorded)
	defragged   bool // its member was defragmented, at epoch defragAt
	defragAt    int
	restartOpen bool // a restart record is open (started at epoch restartAt, end not recorded)
	restartAt   int
	certsDue    bool // its certificates passed their renewal point; otherwise, once it has an address, they are months from it
	renewOpen   bool // a certificate renewal record is open (started at epoch renewAt, end not recorded)
	renewAt     int
	authority   AuthorityUpdate // what it lacks of an etcd CA rotation's stage
	lost        bool            // confirmed lost: it does not run, and never will again
}

// version stands in for the Machine's resourceVersion: it changes whenever
// anything the API server stores about the machine changes.
func (m wMachine) version() string {
	b := make([]byte, 0, 64)
	b = append(b, m.fd...)
	b = append(b, '/')
	b = appendBits(b, m.addr, m.upToDate, m.deleting, m.annotated, m.hook, m.failed, m.remediate, m.joinStarted, m.defragOpen, m.defragged, m.restartOpen,
		m.certsDue, m.renewOpen, m.lost)
	b = append(b, m.authority...)
	b = append(b, '/')
	b = strconv.AppendUint(b, m.memberID, 10)
	for _, n := range []int{m.defragAt, m.restartAt, m.renewAt} {
		b = append(b, '/')
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return string(b)
}

type wMember struct {
	id       uint64
	host     int // machine id; the machine may be gone
	learner  bool
	started  bool
	healthy  bool
	caughtUp bool
	leader   bool
	since    int    // epoch it was added (learners) or went down (unhealthy)
	alarm    string // "", "NOSPACE" or "CORRUPT", raised by this member
	// fragmented: most of its database is free pages; defragmenting: it
	// is busy defragmenting, and answers nothing until it is done.
	fragmented, defragmenting bool
	// overQuota: its database is over the quota, until a defragmentation
	// after a compaction; liveOverQuota: its data itself is, and nothing
	// but a bigger quota helps.
	overQuota, liveOverQuota bool
	// oldQuota: it runs with worldQuota in a world whose quota was raised;
	// restarting: it is restarting with the new one, and answers nothing
	// until it is back.
	oldQuota, restarting bool
	// lagging: its applied index trails the others' (a survivor a
	// recovery must not keep while a current one survives too).
	lagging bool
	// cut: QCP cannot reach it, since epoch since, though its peers do (a
	// partition between the management cluster and its machine). It
	// works, and counts for quorum; QCP sees it down, and its machine
	// says it answers there (Machine.EtcdAnswersOnMachine). The cut heals
	// once it has lasted past every timeout (progress).
	cut bool
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const epochLen = 10 * time.Minute

// Names and URLs are precomputed: the exploration renders millions of states.
var machineNameTable, peerURLTable = func() (names, urls []string) {
	for id := range 100 {
		names = append(names, fmt.Sprintf("m-%02d", id))
		urls = append(urls, fmt.Sprintf("https://10.0.0.%d:2380", id))
	}
	return names, urls
}()

func machineName(id int) string { return machineNameTable[id] }
func peerURL(id int) string     { return peerURLTable[id] }

func bits(flags ...bool) string { return string(appendBits(nil, flags...)) }

// appendBits appends flags to b as the decimal number whose bit i is
// flags[i].
func appendBits(b []byte, flags ...bool) []byte {
	n := 0
	for i, f := range flags {
		if f {
			n |= 1 << i
		}
	}
	return strconv.AppendInt(b, int64(n), 10)
}

func (w world) clone() world {
	w.machines = slices.Clone(w.machines)
	w.members = slices.Clone(w.members)
	w.departed = slices.Clone(w.departed)
	w.lostIDs = slices.Clone(w.lostIDs)
	return w
}

// state renders the world as the observation a driver would build.
func (w world) state() State {
	now := t0.Add(time.Duration(w.epoch)*epochLen + 2*time.Minute)
	at := func(epoch int) time.Time { return t0.Add(time.Duration(epoch) * epochLen) }
	s := State{Desired: w.desired, Topology: Stacked, Strategy: w.strategy, FailureDomains: w.domains, Now: now, Bootstrapped: w.bootstrapped,
		DepartedAlarms: slices.Clone(w.departed), QuotaBackendBytes: worldQuota, Tunables: Tunables{DefragMinInterval: worldDefragInterval}}
	if w.quotaRaised {
		s.QuotaBackendBytes = worldRaisedQuota
	}
	s.Backup.Due = w.backupDue
	if w.restore {
		s.Restore = RestoreState{Requested: true, Snapshot: "ns/quorumcontrolplane/old/20261130T000000.000Z.db.age"}
		if w.restoring {
			s.Restore.Snapshot = worldSnapshot
		}
		if w.restoreBad {
			s.Restore.Problem = "snapshot read back is not what its manifest says"
		}
	}
	s.Backup.Configured, s.Backup.MaxAgeBeforeRisky = w.backupConfigured, time.Hour
	s.Recovery = RecoveryState{Policy: w.recovery, After: worldRecoveryAfter, Triggered: w.triggered, Restoring: w.restoring}
	for _, id := range w.lostIDs {
		s.Recovery.LostMachines = append(s.Recovery.LostMachines, machineName(id))
	}
	if w.backupFresh {
		s.Backup.LastVerified = now.Add(-time.Minute)
	}
	if w.compacted {
		s.CompactedRevision, s.CompactedAt = worldRevision-DefaultCompactionRetention, at(w.compactAt)
	}
	// Sized up front: the exploration renders millions of states.
	s.Machines, s.Members = make([]Machine, 0, len(w.machines)), make([]Member, 0, len(w.members))
	for _, m := range w.machines {
		mc := Machine{
			Name: machineName(m.id), FailureDomain: m.fd, UpToDate: m.upToDate,
			CreatedAt: at(m.born).Add(time.Duration(m.id) * time.Second),
			Deleting:  m.deleting, DeleteAnnotated: m.annotated, HasHook: m.hook,
			NodeReady: !m.remediate, ComponentsHealthy: !m.remediate, CreationFailed: m.failed, MemberID: m.memberID,
			JoinStarted: m.joinStarted, Remediate: m.remediate, ResourceVersion: m.version(), ConfirmedLost: m.lost,
		}
		if m.addr {
			mc.PeerURL = peerURL(m.id)
			mc.InfraReadyAt = at(m.readyAt).Add(time.Duration(m.id) * time.Second)
		}
		// A minute into the epoch: after a compaction in the same epoch.
		switch {
		case m.defragOpen:
			mc.DefragStartedAt = at(m.defragAt).Add(time.Minute)
		case m.defragged:
			mc.DefragmentedAt = at(m.defragAt).Add(time.Minute)
		}
		if m.restartOpen {
			mc.RestartStartedAt = at(m.restartAt).Add(time.Minute)
		}
		// Due ones the newest first, so that the earliest-first order is
		// not the age order; an unprovisioned machine's is unknown.
		switch {
		case m.certsDue:
			mc.CertificatesRenewAt = at(w.epoch).Add(-time.Duration(m.id) * time.Minute)
		case m.addr:
			mc.CertificatesRenewAt = now.Add(240 * 24 * time.Hour)
		}
		if m.renewOpen {
			mc.RenewStartedAt = at(m.renewAt).Add(time.Minute)
		}
		mc.AuthorityUpdate = m.authority
		s.Machines = append(s.Machines, mc)
	}
	for _, m := range w.members {
		mm := Member{ID: m.id, PeerURL: peerURL(m.host), Learner: m.learner, Healthy: m.healthy && !m.cut,
			Leader: m.leader, AppliedIndex: 5000, Revision: worldRevision, DBSize: worldDBSize, DBSizeInUse: worldDBSize * 9 / 10, CatchUpProgressAt: now,
			DBSizeQuota: s.QuotaBackendBytes}
		if m.oldQuota {
			mm.DBSizeQuota = worldQuota
		}
		// A working voter's machine says it answers there, whether QCP
		// reaches it or not; a learner fails /health by design. s.Machines
		// are listed as w.machines.
		host := slices.IndexFunc(w.machines, func(mc wMachine) bool { return mc.id == m.host })
		if host >= 0 && m.healthy && m.started && !m.learner {
			s.Machines[host].EtcdAnswersOnMachine = true
		}
		if m.fragmented {
			mm.DBSizeInUse = worldDBSize / 4
		}
		if m.started {
			mm.Name = machineName(m.host)
		}
		if !m.caughtUp {
			mm.AppliedIndex = 100
			if host >= 0 && w.machines[host].stalled {
				mm.CatchUpProgressAt = at(m.since) // no closer since it was added
			}
		}
		if m.overQuota || m.liveOverQuota {
			mm.DBSize = worldQuota + 1
		}
		if m.learner {
			mm.AddedAt = at(m.since)
		}
		if !mm.Healthy {
			mm.UnhealthySince = at(m.since)
		}
		if m.alarm != "" {
			mm.Alarms = []string{m.alarm}
		}
		if m.lagging {
			mm.AppliedIndex = 4000
		}
		s.Members = append(s.Members, mm)
	}
	if (w.recovery != RecoverManually || w.triggered) && len(w.members) > 0 && w.margin() < 0 {
		w.observeLoss(&s, at)
		if w.recovery == RecoverFromBackup && len(s.Survivors) == 0 && w.backupConfigured {
			// The caller finds the newest verified snapshot only where a
			// restore may come of it.
			s.Restore = RestoreState{Requested: true, Snapshot: worldSnapshot}
			if w.restoreBad {
				s.Restore.Problem = "snapshot read back is not what its manifest says"
			}
		}
	}
	return s
}

// worldSnapshot is the newest verified snapshot of the world's own
// backups, which a recovery from a backup restores.
const worldSnapshot = "ns/quorumcontrolplane/cp/20261201T000000.000Z.db"

// observeLoss renders a world without quorum as a driver observes it: the
// member list cannot be read; the members that are up answer on their own
// (survivors), each with the whole list as its view; the loss began when
// the voter that broke the majority went down.
func (w world) observeLoss(s *State, at func(int) time.Time) {
	view := make([]Member, 0, len(s.Members))
	for _, m := range s.Members {
		view = append(view, Member{ID: m.ID, Name: m.Name, PeerURL: m.PeerURL, Learner: m.Learner})
	}
	var down []int
	for _, m := range w.members {
		if !m.learner && !m.healthy {
			down = append(down, m.since)
		}
	}
	slices.Sort(down)
	voters := len(s.Members) - len(filter(s.Members, func(m Member) bool { return m.Learner }))
	s.Recovery.LostSince = at(down[min(tolerance(voters), len(down)-1)])
	for i, m := range w.members {
		if m.started && m.healthy {
			sv := s.Members[i]
			sv.Healthy, sv.Leader, sv.Alarms = false, false, nil
			s.Survivors = append(s.Survivors, Survivor{Member: sv, View: view})
		}
	}
	s.MembersUnknown, s.Members = true, nil
}

func (w *world) machine(name string) *wMachine {
	for i := range w.machines {
		if machineName(w.machines[i].id) == name {
			return &w.machines[i]
		}
	}
	return nil
}

func (w *world) member(id uint64) *wMember {
	for i := range w.members {
		if w.members[i].id == id {
			return &w.members[i]
		}
	}
	return nil
}

// admits reports whether a caller that enforces d's preconditions (see
// Expectation) would carry d out in w, which may have changed since d was
// planned; s is w.state(). The expectation names the target machine's
// version and every member, so a step whose target is gone never applies.
func (w world) admits(d Decision, s State) bool { return d.Verify(s) == nil }

// apply carries out d. Steps that take time (provisioning, starting,
// catching up, finishing a deletion) happen in progress, when QCP waits.
func (w world) apply(d Decision) world {
	w = w.clone()
	switch d.Kind {
	case CreateMachine:
		w.nextMachine++
		w.machines = append(w.machines, wMachine{id: w.nextMachine, fd: d.FailureDomain, born: w.epoch, upToDate: true})
	case AddLearner:
		mc := w.machine(d.Machine)
		w.nextMember++
		mc.joinStarted, mc.memberID = true, w.nextMember
		w.members = append(w.members, wMember{id: w.nextMember, host: mc.id, learner: true, since: w.epoch})
	case Promote:
		w.member(d.MemberID).learner = false
	case MoveLeader:
		for i := range w.members {
			w.members[i].leader = w.members[i].id == d.MemberID
		}
	case Defragment:
		// It answers nothing until it is done, in progress.
		m, mc := w.member(d.MemberID), w.machine(d.Machine)
		m.defragmenting, m.healthy, m.leader, m.since = true, false, false, w.epoch
		mc.defragOpen, mc.defragged, mc.defragAt = true, true, w.epoch
		w.elect()
	case RenewCertificates:
		// The agent renews, in progress; etcd stays up.
		mc := w.machine(d.Machine)
		mc.renewOpen, mc.renewAt = true, w.epoch
	case RestartMember:
		// Down for the seconds its restart takes, in progress.
		m, mc := w.member(d.MemberID), w.machine(d.Machine)
		m.restarting, m.healthy, m.leader, m.since = true, false, false, w.epoch
		mc.restartOpen, mc.restartAt = true, w.epoch
		w.elect()
	case SetAuthority:
		// The agent saves the stage's authority at once; a trust change
		// then restarts the member, and a leaf move takes a while, both in
		// progress.
		mc := w.machine(d.Machine)
		mc.authority = AuthorityCurrent
		if !d.RestartsMember {
			mc.renewOpen, mc.renewAt = true, w.epoch
			break
		}
		m := w.member(d.MemberID)
		m.restarting, m.healthy, m.leader, m.since = true, false, false, w.epoch
		mc.restartOpen, mc.restartAt = true, w.epoch
		w.elect()
	case RemoveMember:
		if m := w.member(d.MemberID); m != nil && m.alarm != "" {
			w.departed = append(w.departed, Alarm{MemberID: m.id, Type: m.alarm}) // etcd keeps it
		}
		w.members = slices.DeleteFunc(w.members, func(m wMember) bool { return m.id == d.MemberID })
		w.elect()
	case DisarmAlarm:
		w.departed = slices.DeleteFunc(w.departed, func(a Alarm) bool { return a.MemberID == d.MemberID && a.Type == d.Alarm })
		if m := w.member(d.MemberID); m != nil && m.alarm == d.Alarm {
			m.alarm = ""
		}
	case Compact:
		w.compacted, w.compactAt = true, w.epoch
	case Snapshot:
		// Streamed, stored and verified within the step; the member
		// serves on.
		w.backupDue, w.backupFresh = false, true
	case Recover:
		// The survivor's agent restores its own data as the only member
		// of a new cluster; the caller records its new ID. The old
		// members, and the alarms they raised, belong to the old cluster.
		mc := w.machine(d.Machine)
		w.nextMember++
		mc.memberID = w.nextMember
		w.members = []wMember{{id: w.nextMember, host: mc.id, started: true, healthy: true, caughtUp: true, leader: true}}
		w.departed, w.triggered = nil, false
	case RestoreFromBackup:
		// The caller records the recovery: the old cluster, whose
		// members all stopped on machines confirmed lost, is abandoned;
		// its machines go, and a new first machine restores the snapshot.
		w.lostIDs = nil
		for _, mc := range w.machines {
			if mc.memberID != 0 || mc.joinStarted {
				w.lostIDs = append(w.lostIDs, mc.id)
			}
		}
		w.members, w.departed, w.triggered = nil, nil, false
		w.restoring, w.restore = true, true
	case AddHook:
		w.machine(d.Machine).hook = true
	case RemoveHook:
		w.machine(d.Machine).hook = false
	case DeleteMachine:
		w.machine(d.Machine).deleting = true
	case Wait, Degraded:
		w.progress()
	}
	return w
}

// progress is what the rest of the world does while QCP waits.
func (w *world) progress() {
	w.epoch++
	w.restoreBad = false
	for i := range w.members {
		m := &w.members[i]
		if m.cut && w.epoch-m.since >= 2 {
			m.cut = false // QCP saw it cut past its timeouts; the partition heals
		}
		mc := w.machine(machineName(m.host))
		switch {
		case mc == nil:
		case mc.slow:
		case m.defragmenting || m.restarting:
			m.finishDisruption()
			mc.defragOpen, mc.restartOpen = false, false // the caller records the end
		case !m.started && !mc.broken && !mc.deleting:
			m.started, m.healthy = true, true
		case m.started && m.healthy && !m.caughtUp && !mc.stalled:
			m.caughtUp = true
		}
	}
	var gone []int
	w.machines = slices.DeleteFunc(w.machines, func(mc wMachine) bool {
		if mc.deleting && !mc.hook {
			gone = append(gone, mc.id)
			return true
		}
		return false
	})
	for i := range w.members {
		if slices.Contains(gone, w.members[i].host) && w.members[i].healthy {
			w.members[i].healthy, w.members[i].leader, w.members[i].since = false, false, w.epoch
		}
	}
	for i := range w.machines {
		mc := &w.machines[i]
		if mc.renewOpen && !mc.slow {
			// The caller records the new renewal time, months ahead.
			mc.renewOpen, mc.certsDue = false, false
		}
		switch {
		case mc.slow:
			mc.slow = false
		case !mc.addr && !mc.failed && !mc.deleting && !mc.noInfra:
			mc.addr, mc.readyAt = true, w.epoch
		case !mc.addr && !mc.deleting && !mc.failed && !mc.remediate && w.epoch-mc.born >= 2:
			// QCP's MachineHealthCheck: the node-startup timeout.
			mc.remediate = true
		}
	}
	if len(w.members) == 0 {
		w.bootstrap()
	}
	w.elect()
}

// bootstrap starts a new etcd cluster on the only machine, if it can.
func (w *world) bootstrap() {
	if len(w.machines) != 1 {
		return
	}
	mc := &w.machines[0]
	if mc.addr && !mc.broken && !mc.deleting && !mc.failed && !mc.slow && mc.memberID == 0 {
		w.nextMember++
		mc.memberID, w.bootstrapped = w.nextMember, true
		w.restore, w.restoreBad = false, false // the caller resolves a restore only before etcd has a member
		w.restoring, w.lostIDs = false, nil    // and closes a recovery from a backup once the member is listed
		w.members = append(w.members, wMember{id: w.nextMember, host: mc.id, started: true, healthy: true, caughtUp: true, leader: true})
	}
}

// elect gives the cluster a leader when a healthy majority of voters exists:
// the healthy voter with the lowest ID, as a stand-in for raft.
func (w *world) elect() {
	voters, healthy := 0, -1
	for i, m := range w.members {
		if m.learner {
			continue
		}
		voters++
		if m.leader && m.healthy {
			return
		}
		if m.healthy && m.started && healthy < 0 {
			healthy = i
		}
	}
	up := 0
	for _, m := range w.members {
		if !m.learner && m.healthy {
			up++
		}
	}
	for i := range w.members {
		w.members[i].leader = false
	}
	if healthy >= 0 && 2*up > voters {
		w.members[healthy].leader = true
	}
}

// margin is how many more voters may fail before quorum is lost; negative
// once it is lost.
func (w world) margin() int {
	voters, healthy := 0, 0
	for _, m := range w.members {
		if !m.learner {
			voters++
			if m.healthy {
				healthy++
			}
		}
	}
	return healthy - (voters/2 + 1)
}

// converged is the desired state: desired machines, all up to date, each
// hosting a healthy voter under the hook, and nothing else. With OnDelete
// an outdated machine, or one in a removed domain, stays until a user
// deletes it.
func (w world) converged() bool {
	if len(w.machines) != w.desired || len(w.members) != w.desired || len(w.departed) > 0 {
		return false
	}
	for _, mc := range w.machines {
		m := w.memberOn(mc.id)
		if mc.deleting || mc.failed || mc.remediate || !mc.hook || m == nil || m.learner || !m.healthy || !m.caughtUp || m.alarm != "" {
			return false
		}
		if m.defragmenting || (m.fragmented && w.desired >= 3) {
			return false // a member of three or more is defragmented
		}
		if m.restarting || m.oldQuota {
			return false // every member runs with the configured quota
		}
		if mc.certsDue || mc.renewOpen {
			return false // every machine's certificates are renewed
		}
		if mc.authority != AuthorityCurrent {
			return false // every machine reached the rotation's stage
		}
		replaced := !mc.upToDate || (len(w.domains) > 0 && !slices.Contains(w.domains, mc.fd))
		if replaced && w.strategy != OnDelete {
			return false
		}
	}
	return w.strategy == OnDelete || w.balanced()
}

// balanced: no failure domain holds more machines than an even spread of
// desired allows.
func (w world) balanced() bool {
	if len(w.domains) == 0 {
		return true
	}
	limit := (w.desired + len(w.domains) - 1) / len(w.domains)
	count := map[string]int{}
	for _, mc := range w.machines {
		if count[mc.fd]++; count[mc.fd] > limit {
			return false
		}
	}
	return true
}

func (w world) memberOn(machine int) *wMember {
	for i := range w.members {
		if w.members[i].host == machine {
			return &w.members[i]
		}
	}
	return nil
}

// key identifies a world up to what the planner can observe: machines and
// members renumbered by age, epochs reduced to what timeouts can tell.
func (w world) key() string {
	b := make([]byte, 0, 256)
	// A machine's rank is its index in w.machines, a member's in w.members;
	// -1 for one that is gone.
	rank := func(id int) int { return slices.IndexFunc(w.machines, func(mc wMachine) bool { return mc.id == id }) }
	b = strconv.AppendInt(b, int64(w.desired), 10)
	b = append(b, w.strategy...)
	b = strconv.AppendBool(b, w.bootstrapped)
	b = strconv.AppendBool(b, w.compacted)
	b = strconv.AppendBool(b, w.quotaRaised)
	b = appendBits(b, w.backupDue, w.backupConfigured, w.backupFresh, w.restore, w.restoreBad, w.triggered, w.restoring)
	b = append(b, w.recovery...)
	for _, id := range w.lostIDs {
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(rank(id)), 10)
	}
	for i, fd := range w.domains {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, fd...)
	}
	b = append(b, '|')
	for _, mc := range w.machines {
		mid := -2
		if mc.memberID != 0 {
			mid = slices.IndexFunc(w.members, func(m wMember) bool { return m.id == mc.memberID })
		}
		b = append(b, mc.fd...)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(min(w.epoch-mc.born, 3)), 10)
		b = append(b, ',')
		b = appendBits(b, w.epoch > mc.readyAt, mc.addr, mc.upToDate, mc.deleting, mc.annotated, mc.hook, mc.failed, mc.broken,
			mc.noInfra, mc.slow, mc.remediate, mc.joinStarted, mc.memberID != 0, mc.stalled, mc.defragOpen, mc.defragged && mc.defragAt == w.epoch,
			mc.defragged && w.compacted && mc.defragAt >= w.compactAt, mc.restartOpen && mc.restartAt == w.epoch,
			mc.certsDue, mc.renewOpen, mc.renewOpen && mc.renewAt == w.epoch, mc.lost)
		b = append(b, mc.authority...)
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(mid), 10)
		b = append(b, ';')
	}
	b = append(b, '|')
	for _, m := range w.members {
		b = strconv.AppendInt(b, int64(rank(m.host)), 10)
		b = append(b, ',')
		b = appendBits(b, m.learner, m.started, m.healthy, m.caughtUp, m.leader, w.epoch > m.since, m.fragmented, m.defragmenting, m.overQuota, m.liveOverQuota,
			m.oldQuota, m.restarting, m.lagging, m.cut)
		b = append(b, m.alarm...)
		b = append(b, ';')
	}
	b = append(b, '|')
	for _, a := range w.departed {
		b = append(b, a.Type...)
		b = append(b, ';')
	}
	return string(b)
}

// finishDisruption ends m's defragmentation (it answers again, its
// database compact) or restart (it answers again, with the configured
// quota).
func (m *wMember) finishDisruption() {
	if m.defragmenting {
		m.defragmenting, m.fragmented, m.overQuota, m.healthy, m.caughtUp = false, false, false, true, true
	}
	if m.restarting {
		m.restarting, m.oldQuota, m.healthy, m.caughtUp = false, false, true, true
	}
}
