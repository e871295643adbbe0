package quorum

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Defaults for zero Tunables.
const (
	DefaultLearnerStartTimeout = 5 * time.Minute
	DefaultUnhealthyTimeout    = 5 * time.Minute
	DefaultCatchUpMaxLag       = 1000
	DefaultLearnerStallTimeout = 5 * time.Minute
	// DefaultDefragThresholdPercent is OpenShift's etcd operator's.
	DefaultDefragThresholdPercent = 45
	DefaultDefragMinDBSize        = 100 << 20
	DefaultDefragMinInterval      = time.Hour
	DefaultDefragTimeout          = 10 * time.Minute
	DefaultCompactionRetention    = 1000
	DefaultRestartTimeout         = 2 * time.Minute
	DefaultRenewTimeout           = 5 * time.Minute
)

// view is a sorted, indexed copy of a State, so that rules can ask questions
// ("which member does this machine host?") without re-deriving the answer,
// and so that Plan is independent of the order the caller listed things in.
type view struct {
	State
	machines []Machine // oldest first, then by name
	members  []Member  // by ID
	tun      Tunables
}

func newView(s State) view {
	v := view{State: s}
	v.machines = sorted(s.Machines, func(a, b Machine) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	if !s.MembersUnknown && s.Topology != APIServersOnly {
		v.members = sorted(s.Members, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	}
	v.tun = s.Tunables.WithDefaults()
	if v.Strategy == RemoveFirst && v.Desired < minRemoveFirst {
		// Removing one of one or two voters first loses quorum: surge.
		v.Strategy = SurgeFirst
	}
	return v
}

// sorted returns xs in order: xs itself when it already is (callers
// usually list things in order, and a view only reads them), else a sorted
// copy. Not copying saves the planner's most frequent allocation.
func sorted[T any](xs []T, order func(a, b T) int) []T {
	if slices.IsSortedFunc(xs, order) {
		return slices.Clip(xs) // an append must not write into the caller's array
	}
	out := slices.Clone(xs)
	slices.SortFunc(out, order)
	return out
}

// minRemoveFirst is the fewest replicas RemoveFirst works with (the
// webhook's rule for maxSurge 0); below it the planner surges instead.
const minRemoveFirst = 3

// WithDefaults returns t with every zero threshold set to its default, as
// the planner reads it.
func (t Tunables) WithDefaults() Tunables {
	orDefault(&t.LearnerStartTimeout, DefaultLearnerStartTimeout)
	orDefault(&t.UnhealthyTimeout, DefaultUnhealthyTimeout)
	orDefault(&t.CatchUpMaxLag, DefaultCatchUpMaxLag)
	orDefault(&t.LearnerStallTimeout, DefaultLearnerStallTimeout)
	orDefault(&t.DefragThresholdPercent, DefaultDefragThresholdPercent)
	orDefault(&t.DefragMinDBSize, DefaultDefragMinDBSize)
	orDefault(&t.DefragMinInterval, DefaultDefragMinInterval)
	orDefault(&t.DefragTimeout, DefaultDefragTimeout)
	orDefault(&t.CompactionRetention, DefaultCompactionRetention)
	orDefault(&t.RestartTimeout, DefaultRestartTimeout)
	orDefault(&t.RenewTimeout, DefaultRenewTimeout)
	return t
}

// orDefault sets *v to def when it is zero or negative.
func orDefault[T int | int64 | uint64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// hosts reports whether member m runs on machine mc: by name once started,
// by peer URL before (an unstarted member has no name yet). A recorded
// Machine.MemberID overrides both.
func hosts(mc Machine, m Member) bool {
	if mc.MemberID != 0 {
		return m.ID == mc.MemberID
	}
	if m.Name != "" {
		return m.Name == mc.Name
	}
	return m.PeerURL != "" && m.PeerURL == mc.PeerURL
}

func (v view) member(id uint64) (Member, bool) {
	for _, m := range v.members {
		if m.ID == id {
			return m, true
		}
	}
	return Member{}, false
}

func (v view) machine(name string) (Machine, bool) {
	for _, mc := range v.machines {
		if mc.Name == name {
			return mc, true
		}
	}
	return Machine{}, false
}

// memberOn returns the member hosted by the named machine.
func (v view) memberOn(machine string) (Member, bool) {
	mc, ok := v.machine(machine)
	if !ok {
		return Member{}, false
	}
	return v.memberOf(mc)
}

// memberOf returns the member hosted by mc, one of the view's machines.
func (v view) memberOf(mc Machine) (Member, bool) {
	for _, m := range v.members {
		if hosts(mc, m) && !v.ambiguous(mc, m) {
			return m, true
		}
	}
	return Member{}, false
}

// machineOf returns the machine hosting m.
func (v view) machineOf(m Member) (Machine, bool) {
	for _, mc := range v.machines {
		if hosts(mc, m) && !v.ambiguous(mc, m) {
			return mc, true
		}
	}
	return Machine{}, false
}

// ambiguous reports whether mc hosts m only by peer URL while another
// machine without a recorded member has the same URL: an address reused
// while an old machine still holds it. Neither is taken to host m, as the
// controllers' MemberOn refuses the match: the wrong one would record the
// member and join it with another machine's data directory.
func (v view) ambiguous(mc Machine, m Member) bool {
	if mc.MemberID != 0 || m.Name != "" {
		return false
	}
	for _, o := range v.machines {
		if o.Name != mc.Name && o.MemberID == 0 && o.PeerURL == mc.PeerURL {
			return true
		}
	}
	return false
}

// voters returns the voting members. Callers must not modify the list: it
// is the view's own when every member votes, which spares an allocation in
// most calls.
func (v view) voters() []Member {
	if len(v.members) > 0 && !slices.ContainsFunc(v.members, func(m Member) bool { return !m.Voter() }) {
		return slices.Clip(v.members)
	}
	return filter(v.members, Member.Voter)
}

func (v view) learners() []Member {
	return filter(v.members, func(m Member) bool { return m.Learner })
}

func (v view) voterCount() int { return countOf(v.members, Member.Voter) }

func (v view) learnerCount() int { return len(v.members) - v.voterCount() }

func (v view) leader() (Member, bool) {
	for _, m := range v.members {
		if m.Leader && m.Voter() && m.Healthy {
			return m, true
		}
	}
	return Member{}, false
}

// memberName names a member for humans: its name, or its hosting machine,
// or its ID.
func (v view) memberName(m Member) string {
	if m.Name != "" {
		return m.Name
	}
	if mc, ok := v.machineOf(m); ok {
		return mc.Name
	}
	return idString(m.ID)
}

// componentsOK is the component half of the preflight checks.
func (v view) componentsOK(mc Machine) bool {
	return mc.ComponentsHealthy && (v.Topology == External || mc.NodeReady)
}

func filter[T any](xs []T, keep func(T) bool) []T {
	var out []T
	for i, x := range xs {
		if keep(x) {
			if out == nil {
				// One allocation, not a growth per element: the
				// exhaustive exploration calls this millions of times.
				out = make([]T, 0, len(xs)-i)
			}
			out = append(out, x)
		}
	}
	return out
}

// countOf returns how many of xs match, without the list filter would
// build only to be measured.
func countOf[T any](xs []T, match func(T) bool) int {
	n := 0
	for _, x := range xs {
		if match(x) {
			n++
		}
	}
	return n
}

func names[T any](xs []T, name func(T) string) string {
	var out []string
	for _, x := range xs {
		out = append(out, name(x))
	}
	return strings.Join(out, ", ")
}

// phase is where a machine is in its lifecycle (see the package comment).
type phase int

const (
	phaseDeleting phase = iota // has a deletion timestamp
	phaseFailed                // infrastructure failed before it hosted a voter
	phaseSpent                 // its recorded member was removed, or its join started and left no member
	phasePending               // infrastructure not ready: no peer URL yet
	phaseUnjoined              // ready, no member yet
	phaseJoining               // member added as a learner, not started
	phaseLearner               // started learner
	phaseVoter                 // hosts a voter (APIServersOnly: serves)
)

func (v view) phase(mc Machine) phase {
	if v.Topology == APIServersOnly {
		return v.apiServerPhase(mc)
	}
	m, hasMember := v.memberOf(mc)
	switch {
	case mc.Deleting:
		return phaseDeleting
	case hasMember && m.Voter():
		return phaseVoter
	case mc.CreationFailed:
		return phaseFailed
	case !hasMember && (mc.MemberID != 0 || mc.JoinStarted):
		return phaseSpent
	case mc.PeerURL == "":
		return phasePending
	case !hasMember:
		return phaseUnjoined
	case !m.Started():
		return phaseJoining
	}
	return phaseLearner
}

// keep returns the machines meant to stay: not deleting, failed or spent.
func (v view) keep() []Machine { return filter(v.machines, v.kept) }

// kept reports whether mc is one of keep's machines.
func (v view) kept(mc Machine) bool { return v.phase(mc) >= phasePending }

// provisioning returns the kept machines still being created, in the sense
// of I4: they host no started member yet.
func (v view) provisioning() []Machine {
	return filter(v.machines, func(mc Machine) bool {
		p := v.phase(mc)
		return p >= phasePending && p <= phaseJoining
	})
}

// departing reports whether voter m is on its way out: its machine is gone
// or being deleted.
func (v view) departing(m Member) bool {
	mc, ok := v.machineOf(m)
	return !ok || mc.Deleting
}

// since returns how long ago t was; an unknown (zero) time counts as now,
// so a lost record restarts a timeout instead of firing it.
func (v view) since(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return v.Now.Sub(t)
}

// unhealthyFor returns how long m has been unhealthy, 0 if healthy or unknown.
func (v view) unhealthyFor(m Member) time.Duration {
	if m.Healthy {
		return 0
	}
	return v.since(m.UnhealthySince)
}

// dueForRemediation reports whether unhealthy voter m should be removed
// first and its machine replaced: a health check marked its machine, or it
// has been unhealthy past UnhealthyTimeout and its machine does not say
// that it answers there (Machine.EtcdAnswersOnMachine).
func (v view) dueForRemediation(m Member) bool {
	if m.Healthy {
		return false
	}
	mc, ok := v.machineOf(m)
	if ok && mc.HoldRemediation || v.disrupting(m) != "" {
		return false
	}
	if ok && mc.Remediate {
		return true
	}
	if v.cutOffFromQCP(m) {
		return false // QCP's view alone: its machine says it answers
	}
	return v.unhealthyFor(m) >= v.tun.UnhealthyTimeout
}

// cutOffFromQCP reports whether m does not answer QCP while its machine
// says that it answers there (Machine.EtcdAnswersOnMachine).
func (v view) cutOffFromQCP(m Member) bool {
	mc, ok := v.machineOf(m)
	return !m.Healthy && ok && mc.EtcdAnswersOnMachine
}

// learnerAge returns how long ago learner m was added (0 if unknown).
func (v view) learnerAge(m Member) time.Duration { return v.since(m.AddedAt) }

// atRiskVoters returns the voters, counting as unhealthy those whose
// machine is deleting without the hook: an operator let that machine go,
// so its member is about to drop out, and quorum decisions must not lean
// on it.
func (v view) atRiskVoters() []Member {
	voters := slices.Clone(v.voters()) // it may be the view's own list
	for i, m := range voters {
		if mc, ok := v.machineOf(m); ok && mc.Deleting && !mc.HasHook {
			voters[i].Healthy = false
		}
	}
	return voters
}

// hasQuorum reports whether no more voters are unhealthy than etcd
// tolerates (I7).
func (v view) hasQuorum() bool {
	voters := v.voterCount()
	unhealthy := countOf(v.members, func(m Member) bool { return m.Voter() && !m.Healthy })
	return voters > 0 && unhealthy <= tolerance(voters)
}

// keepsFloor is I8: removing voter m leaves at least desired − 1 voters,
// unless m is down or about to drop out (atRiskVoters). A maxSurge 0
// rollout trades exactly one voter at a time; a healthy voter leaving for
// any other reason (a user deleting its machine, its infrastructure
// vanishing) waits while the cluster is already a voter short, or 3 of 3
// could end on one disk holding every acknowledged write. A user lowering
// desired lowers the floor with it.
// A CORRUPT member is no trustworthy copy of the data, so removing it
// first, the standard fix, lowers nothing either.
func (p planner) keepsFloor(m Member) bool {
	return p.opts.noVoterFloor || floorAfterRemoval(p.atRiskVoters(), p.Desired, m.ID)
}

// floorAfterRemoval reports whether removing voter gone keeps I8's floor.
func floorAfterRemoval(voters []Member, desired int, gone uint64) bool {
	for _, m := range voters {
		if m.ID == gone && (!m.Healthy || slices.Contains(m.Alarms, "CORRUPT")) {
			return true
		}
	}
	return len(voters)-1 >= desired-1
}

// tolerance is how many unhealthy voters n voters survive.
func tolerance(n int) int { return (n - 1) / 2 }

// quorumAfterRemoval reports whether removing voter gone leaves the healthy
// voters a majority of the remaining voters (I1).
func quorumAfterRemoval(voters []Member, gone uint64) bool {
	remaining, healthy := 0, 0
	for _, m := range voters {
		if m.ID == gone {
			continue
		}
		remaining++
		if m.Healthy {
			healthy++
		}
	}
	return remaining > 0 && 2*healthy > remaining
}

// keepsTolerance reports whether removing voter id leaves etcd surviving as
// many further failures as before, judged the way an operator would: a
// healthy voter may go only while every other voter is healthy, or when the
// count drops from even to odd (4 → 3 tolerates one failure either way).
// Removing a healthy one of 5 voters while another is down takes the cluster
// from surviving one more failure to surviving none.
func keepsTolerance(voters []Member, id uint64) bool {
	if len(voters)%2 == 0 {
		return true
	}
	for _, m := range voters {
		if m.ID == id && !m.Healthy {
			return true
		}
	}
	for _, o := range voters {
		if o.ID != id && !o.Healthy {
			return false
		}
	}
	return true
}

// outdated reports whether mc is to be replaced: its spec is out of date,
// its failure domain is gone, or a health check marked it. A marked machine
// whose voter is healthy (its Node or components failed, not etcd) is thus
// replaced like a rollout: the replacement joins before the member leaves.
// With OnDelete only a health check's mark counts: the user replaces the
// rest by deleting them.
func (v view) outdated(mc Machine) bool {
	if mc.Remediate {
		return true
	}
	if v.Strategy == OnDelete {
		return false
	}
	return !mc.UpToDate || v.misplaced(mc) != ""
}

// specOutdated is outdated without the overfull-domain case: the machine
// itself must go, wherever it is.
func (v view) specOutdated(mc Machine) bool {
	if mc.Remediate {
		return true
	}
	if v.Strategy == OnDelete {
		return false
	}
	return !mc.UpToDate || (len(v.FailureDomains) > 0 && !slices.Contains(v.FailureDomains, mc.FailureDomain))
}

// misplaced says why mc's failure domain calls for moving it, or "": its
// domain is gone, or holds more kept machines than an even spread allows
// (ceil(desired / domains)). Moving is an ordinary one-at-a-time
// replacement, the new machine going to the emptiest domain.
func (v view) misplaced(mc Machine) string {
	if len(v.FailureDomains) == 0 {
		return ""
	}
	if !slices.Contains(v.FailureDomains, mc.FailureDomain) {
		return fmt.Sprintf("failure domain %s is no longer offered", quoteFD(mc.FailureDomain))
	}
	limit := (v.Desired + len(v.FailureDomains) - 1) / len(v.FailureDomains)
	// The kept machines in mc's domain, counted without building keep's
	// list: outdated asks this of every kept machine, many times per plan.
	n := countOf(v.machines, func(o Machine) bool { return o.FailureDomain == mc.FailureDomain && v.kept(o) })
	if n > limit {
		return fmt.Sprintf("failure domain %s holds %d machines, more than an even spread's %d", quoteFD(mc.FailureDomain), n, limit)
	}
	return ""
}

// Rebalancing says why the planner moves machines between failure
// domains, or "" when they are spread as they should be. OnDelete never
// moves a machine.
func Rebalancing(s State) string {
	v := newView(s)
	if v.Strategy == OnDelete {
		return ""
	}
	for _, mc := range v.keep() {
		if why := v.misplaced(mc); why != "" {
			return "machine " + mc.Name + ": " + why
		}
	}
	return ""
}

// NoSpaceRaised reports whether a NOSPACE alarm is raised in s, by a
// listed member or a departed one.
func NoSpaceRaised(s State) bool { return newView(s).noSpaceRaised() }

func (v view) noSpaceRaised() bool {
	for _, m := range v.members {
		if slices.Contains(m.Alarms, "NOSPACE") {
			return true
		}
	}
	return slices.ContainsFunc(v.DepartedAlarms, func(a Alarm) bool { return a.Type == "NOSPACE" })
}
