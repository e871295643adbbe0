package testkit

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// Monitor samples the member list, member health and the leader at a fixed
// interval and checks every sample against the membership invariants
// (quorum.CheckMembers: I2) and every pair of consecutive samples against
// quorum.CheckMembershipChange (I1, I3) and for a leader removed (I6), as
// long as the pair spans at most maxSampleGap. Between samples it probes
// each member's own view for a leader removed while it led (I6 again),
// which the member list cannot show: the election that follows such a
// removal holds every member list request, so the samples either side of
// it are too far apart to compare.
type Monitor struct {
	client   *etcd.Client
	interval time.Duration
	cancel   context.CancelFunc
	done     chan struct{}

	// sampling serialises whole samples, periodic or on demand, so that
	// consecutive samples are compared in the order they were taken.
	sampling sync.Mutex
	mu       sync.Mutex
	// desired is what the test asked for; bound is what CheckMembers is
	// given. After a scale down the bound stays at the old desired and
	// ratchets down as voters leave, so the voters may shrink one by one
	// but never grow back past it.
	desired, bound int
	report         MonitorReport
	prev           []quorum.Member
	// prevStart is when the sample prev came from started.
	prevStart time.Time
	// listed holds every member ID a readable sample listed; removed the
	// leaders found removed by comparing two samples.
	listed, removed map[uint64]bool
	// gapLeaders are the leaders gone across a sample gap, by ID.
	gapLeaders map[uint64]string
	// followedGone are leaders that a member still followed after it had
	// applied their removal, by ID: each was removed while it led, if the
	// samples confirm it was removed (see result).
	followedGone map[uint64]string
	// learners holds every member ID a sample or a member's own view
	// (probe) listed as a learner. etcd never reuses a member ID, so one
	// listed as a learner once joined as a learner.
	learners map[uint64]bool
	// promotions reads a member's promotion counter (WithPromotionCounts);
	// promotedBase holds the counters read at the last membership change.
	promotions   func(ctx context.Context, clientURL string) (uint64, error)
	promotedBase map[uint64]uint64

	// follow is the monitor's own context, which ends with Stop.
	follow context.Context
	// down holds the members that did not answer their last status
	// request, each with a loop (watchDown) that asks it again every
	// statusInterval until it answers; a sample does not wait for them. So a
	// killed member, listed until QCP removes it, makes one sample wait out
	// etcd.StatusTimeout, not every one. stopped refuses new loops once
	// Stop began.
	statusMu  sync.Mutex
	down      map[uint64]context.CancelFunc
	stopped   bool
	followers sync.WaitGroup
}

// MonitorReport lists what the monitor saw.
type MonitorReport struct {
	Samples int
	// Unobserved counts samples where no member list could be read (no
	// leader, for example); they are not violations by themselves.
	Unobserved int
	Violations []Violation
	// MaxVoters and MaxLearners are the largest counts seen.
	MaxVoters, MaxLearners int
	// LeadersRemoved lists the members that led, healthy, in one sample and
	// were gone in the next, and the members that another member still
	// followed after it had applied their removal: removed without moving
	// leadership first (I6). (After a transfer the removal is committed by
	// the new leader, so every member that applies it follows the new one.)
	// A measurement that skips the transfer on purpose expects some, so it
	// is not a violation here; a driver that promises I6 checks it is empty.
	LeadersRemoved []string
	// Gaps lists the pairs of consecutive readable samples that spanned
	// more than maxSampleGap, and so were not compared; Judged counts the
	// pairs that were.
	Gaps   []string
	Judged int
	// LeadersGoneInGaps lists the members that led, healthy, before such a
	// gap and were gone after it, and that no member was seen following
	// after their removal. Whether leadership moved away first cannot be
	// told, so they are not judged. (A removal without a transfer leaves
	// such a gap, since the election after it holds every member list
	// request for a second or two, but the members' own views, probed
	// meanwhile, usually show it.)
	LeadersGoneInGaps []string
	// PromotedUnseen counts the voters that appeared between two samples,
	// listed as learners by neither, that etcd's own promotion counters
	// showed promoted (WithPromotionCounts).
	PromotedUnseen int
}

// maxSampleGap is the longest span, from the start of one readable sample
// to the answer of the next one's member list, over which the two are
// compared. Over a longer one
// several changes may have come and gone unseen (leadership handed over
// and then its old holder removed, a learner added and promoted), and two
// samples cannot tell in which order: a slow or unreadable sample (a
// member list request sent to a member that was just stopped waits for its
// timeout) leaves the monitor unable to judge, not a violation.
const maxSampleGap = time.Second

// minElection is the shortest time in which etcd's members can elect a new
// leader after theirs stopped leading: a follower waits at least its
// election timeout, 1 s by default, which no QCP machine or test cluster
// shortens. A leader removed without a transfer leads until it applies its
// own removal, so a sample pair in which it led and then another member
// leads, all within minElection, saw leadership handed over before the
// removal: both fell between the samples, as they can when QCP moves the
// leader and removes it within one sampling interval. (In etcd v3.6 the
// removed leader even keeps running for a second after it applies its
// removal, which only makes the bound safer.)
const minElection = time.Second

// Violation is one sample that broke an invariant.
type Violation struct {
	At      time.Time
	Members string
	Err     error
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %v (members: %s)", v.At.Format("15:04:05.000"), v.Err, v.Members)
}

// Err is nil when no sample broke an invariant.
func (r MonitorReport) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	lines := make([]string, 0, len(r.Violations))
	for _, v := range r.Violations {
		lines = append(lines, v.String())
	}
	return fmt.Errorf("%d of %d samples broke membership invariants:\n%s", len(r.Violations), r.Samples, strings.Join(lines, "\n"))
}

// StartMonitor starts sampling through client every interval (400 ms if 0).
// Consecutive samples then span well under maxSampleGap, and the monitor's
// requests cost a 3-member cluster less than half of what sampling (with
// the alarm list) and probing every 200 ms did (docs/measurements.md): on
// a 2-core host each scenario's observers competed with the machines they
// observe.
func StartMonitor(client *etcd.Client, desired int, interval time.Duration, opts ...MonitorOption) *Monitor {
	if interval == 0 {
		interval = defaultSampleInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := newMonitor(desired)
	for _, o := range opts {
		o(m)
	}
	m.client, m.interval, m.cancel, m.done, m.follow = client, interval, cancel, make(chan struct{}), ctx
	probed := make(chan struct{})
	go m.probe(ctx, probed)
	go func() {
		m.run(ctx)
		<-probed
		m.statusMu.Lock()
		m.stopped = true
		m.statusMu.Unlock()
		m.followers.Wait()
		close(m.done)
	}()
	return m
}

// newMonitor is a monitor that checks the samples and views it is given;
// StartMonitor feeds it from etcd.
func newMonitor(desired int) *Monitor {
	return &Monitor{desired: desired, bound: desired, listed: map[uint64]bool{}, removed: map[uint64]bool{},
		gapLeaders: map[uint64]string{}, followedGone: map[uint64]string{}, learners: map[uint64]bool{},
		down: map[uint64]context.CancelFunc{}}
}

// SetDesired changes the desired voter count, as a scaling request does.
func (m *Monitor) SetDesired(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.desired = n
	if n > m.bound {
		m.bound = n
	}
}

// Stop ends sampling and returns the report.
func (m *Monitor) Stop() MonitorReport {
	m.cancel()
	<-m.done
	return m.result()
}

// result is the report so far. A leader a member followed after applying
// its removal counts as removed while it led once a sample listed it and
// the last readable one no longer does: a member that lags can follow a
// new leader before it has applied that leader's addition, and such a
// leader is still listed.
func (m *Monitor) result() MonitorReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.report
	r.LeadersRemoved = slices.Clone(r.LeadersRemoved)
	gone := func(id uint64) bool {
		return m.listed[id] && !slices.ContainsFunc(m.prev, func(mb quorum.Member) bool { return mb.ID == id })
	}
	for _, id := range slices.Sorted(maps.Keys(m.followedGone)) {
		if gone(id) && !m.removed[id] {
			r.LeadersRemoved = append(r.LeadersRemoved, m.followedGone[id])
		}
	}
	for id, change := range m.gapLeaders {
		if _, followed := m.followedGone[id]; !followed || !gone(id) {
			r.LeadersGoneInGaps = append(r.LeadersGoneInGaps, change)
		}
	}
	slices.Sort(r.LeadersGoneInGaps) // by time: each begins with it
	return r
}

// defaultSampleInterval is how often the monitor samples when its caller
// does not say.
const defaultSampleInterval = 400 * time.Millisecond

// probeInterval is how often the monitor reads the members' own views: at
// least twice within etcd's shortest election timeout (1 s by default,
// randomised up to 2 s), for which the members left after a leader's
// removal still follow it.
const probeInterval = 400 * time.Millisecond

// probe reads every member's own view (etcd.Client.LocalView) every
// probeInterval; a member answers it during an election too.
func (m *Monitor) probe(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var round []etcd.LocalView
		for _, ep := range m.client.Endpoints() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if v, err := m.client.LocalView(ctx, ep); err == nil {
					m.recordView(time.Now(), v)
					mu.Lock()
					round = append(round, v)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		m.recordRound(time.Now(), round)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// recordView notes the learners v lists, and a leader that the member v
// is from still follows although it no longer lists it.
func (m *Monitor) recordView(at time.Time, v etcd.LocalView) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range v.Learners {
		m.learners[id] = true
	}
	if v.Leader == 0 || v.Leader == v.ID || slices.Contains(v.Members, v.Leader) {
		return
	}
	if _, ok := m.followedGone[v.Leader]; !ok {
		m.followedGone[v.Leader] = fmt.Sprintf("%s: member %x still followed %x after applying its removal (members %x)",
			at.Format("15:04:05.000"), v.ID, v.Leader, v.Members)
	}
}

// recordRound checks one probe round's views for I9 (one cluster): the
// members that follow a leader all belong to one cluster. A recovery from a
// survivor makes a new cluster; a member of the old one that still ran
// and followed a leader beside it would be a second cluster serving the
// same data.
func (m *Monitor) recordRound(at time.Time, views []etcd.LocalView) {
	clusters := map[uint64][]uint64{}
	for _, v := range views {
		if v.Leader != 0 {
			clusters[v.ClusterID] = append(clusters[v.ClusterID], v.ID)
		}
	}
	if len(clusters) < 2 {
		return
	}
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(clusters)) {
		parts = append(parts, fmt.Sprintf("cluster %x: members %x", id, clusters[id]))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.report.Violations = append(m.report.Violations, Violation{At: at, Members: strings.Join(parts, "; "),
		Err: fmt.Errorf("I9 one cluster: %d etcd clusters follow a leader at once", len(clusters))})
}

func (m *Monitor) run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SampleNow takes a sample at once. A driver calls it after each step it
// takes: a learner that is added and promoted within one sampling interval
// would otherwise first appear as a voter, which the monitor cannot tell
// apart from a voter added directly (I3).
func (m *Monitor) SampleNow(ctx context.Context) { m.sample(ctx) }

func (m *Monitor) sample(ctx context.Context) {
	m.sampling.Lock()
	defer m.sampling.Unlock()
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, etcd.ObserveTimeout)
	list, err := m.client.Members(lctx)
	cancel()
	listed := time.Now()
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	prev := m.prev
	m.mu.Unlock()
	var members []quorum.Member
	if err != nil {
		err = fmt.Errorf("observing etcd members: %w", err)
	} else {
		members = etcd.MembersWith(list, m.statusesOf(ctx, list))
		m.coverUnseenPromotions(ctx, list, prev, members)
	}
	m.record(start, listed, time.Now(), members, err)
	if err == nil {
		m.rebasePromotions(ctx, list, prev, members)
	}
}

// statusInterval is how often a member that stopped answering is asked
// again, as often as the monitor samples by default.
const statusInterval = defaultSampleInterval

// statusesOf asks each member of list for its status, as Observe does,
// but for the members known to be down: those are reported down (no
// status) until their loop (watchDown) finds them answering again. A
// member that stops answering is found so by the first sample after,
// which waits out etcd.StatusTimeout for it; a member that answers again
// is asked by samples again at most statusInterval later.
func (m *Monitor) statusesOf(ctx context.Context, list []etcd.Member) map[uint64]etcd.MemberStatus {
	listed := map[uint64]bool{}
	var ask []etcd.Member
	m.statusMu.Lock()
	for _, mb := range list {
		listed[mb.ID] = true
		if _, down := m.down[mb.ID]; !down {
			ask = append(ask, mb)
		}
	}
	for id, stop := range m.down {
		if !listed[id] {
			stop()
			delete(m.down, id)
		}
	}
	m.statusMu.Unlock()
	answered, failed := m.client.Statuses(ctx, ask)
	if ctx.Err() != nil {
		return answered
	}
	m.statusMu.Lock()
	defer m.statusMu.Unlock()
	for _, mb := range ask {
		if _, ok := failed[mb.ID]; ok && len(mb.ClientURLs) > 0 && !m.stopped {
			wctx, stop := context.WithCancel(m.follow)
			m.down[mb.ID] = stop
			m.followers.Add(1)
			go m.watchDown(wctx, mb)
		}
	}
	return answered
}

// watchDown asks member mb for its status every statusInterval until it
// answers, then lets samples ask it again, or until ctx ends (mb no
// longer listed, or the monitor stopped).
func (m *Monitor) watchDown(ctx context.Context, mb etcd.Member) {
	defer m.followers.Done()
	t := time.NewTicker(statusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, etcd.StatusTimeout)
		_, err := m.client.Status(sctx, mb.ClientURLs[0])
		cancel()
		if err == nil {
			m.statusMu.Lock()
			if stop, ok := m.down[mb.ID]; ok {
				stop()
				delete(m.down, mb.ID)
			}
			m.statusMu.Unlock()
			return
		}
	}
}

// record checks one sample, whose member list was asked for at start and
// answered at, and whose members' statuses were all answered by done,
// against the invariants and against the previous readable sample; err
// means the member list could not be read. Two samples are
// compared when the span from the one's start to the other's answer,
// which holds both member lists, is at most maxSampleGap. A member known
// to be down is not asked again by samples (statusesOf), so it no longer
// stretches the span: when each sample waited for every status, a killed
// member still listed made every sample wait out its 1-s status timeout,
// and every pair until QCP had replaced it went unjudged.
func (m *Monitor) record(start, at, done time.Time, members []quorum.Member, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.report.Samples++
	if err != nil {
		m.report.Unobserved++
		return
	}
	voters, learners := 0, 0
	for _, mb := range members {
		m.listed[mb.ID] = true
		if mb.Learner {
			learners++
			m.learners[mb.ID] = true
		} else {
			voters++
		}
	}
	m.report.MaxVoters = max(m.report.MaxVoters, voters)
	m.report.MaxLearners = max(m.report.MaxLearners, learners)
	if m.bound > m.desired {
		m.bound = max(m.desired, min(m.bound, voters-1))
	}
	if err := quorum.CheckMembers(m.bound, members); err != nil {
		m.report.Violations = append(m.report.Violations, Violation{At: at, Members: describe(members), Err: err})
	}
	if m.prev != nil {
		gap := at.Sub(m.prevStart)
		judged := gap <= maxSampleGap
		if !judged {
			m.report.Gaps = append(m.report.Gaps, fmt.Sprintf("%s: %s since the previous readable sample started", at.Format("15:04:05.000"), gap.Round(time.Millisecond)))
		} else {
			m.report.Judged++
			if err := quorum.CheckMembershipChange(m.withLearnersSeen(m.prev, members), members); err != nil {
				m.report.Violations = append(m.report.Violations, Violation{At: at, Members: describe(m.prev) + " -> " + describe(members), Err: err})
			}
		}
		handedOver := done.Sub(m.prevStart) < minElection && slices.ContainsFunc(members, func(mb quorum.Member) bool { return mb.Leader && mb.Healthy })
		for _, p := range m.prev {
			if p.Leader && p.Healthy && !slices.ContainsFunc(members, func(mb quorum.Member) bool { return mb.ID == p.ID }) {
				change := fmt.Sprintf("%s: %s", at.Format("15:04:05.000"), describe(m.prev)+" -> "+describe(members))
				if handedOver {
					continue
				}
				if judged {
					m.report.LeadersRemoved = append(m.report.LeadersRemoved, change)
					m.removed[p.ID] = true
				} else {
					m.gapLeaders[p.ID] = change
				}
			}
		}
	}
	m.prev, m.prevStart = members, start
}

// withLearnersSeen is prev with, as learners, the members of next that are
// voters not in prev but that a sample or a member's own view listed as
// learners: QCP can add a learner and promote it within one sampling
// interval (a CI run's scale-up did, in 300 ms), and the members' views,
// read between the samples, may have seen the learner the samples missed.
// One seen nowhere as a learner is still judged a voter that joined
// directly (I3).
func (m *Monitor) withLearnersSeen(prev, next []quorum.Member) []quorum.Member {
	out := prev
	for _, mb := range next {
		if !mb.Learner && m.learners[mb.ID] && !slices.ContainsFunc(prev, func(p quorum.Member) bool { return p.ID == mb.ID }) {
			if len(out) == len(prev) {
				out = slices.Clone(prev)
			}
			out = append(out, quorum.Member{ID: mb.ID, Learner: true})
		}
	}
	return out
}

func describe(ms []quorum.Member) string {
	parts := make([]string, 0, len(ms))
	for _, m := range ms {
		role := "voter"
		if m.Learner {
			role = "learner"
		}
		name := m.Name
		if name == "" {
			name = "(unstarted " + m.PeerURL + ")"
		}
		flags := ""
		if !m.Healthy {
			flags += ",unhealthy"
		}
		if m.Leader {
			flags += ",leader"
		}
		parts = append(parts, fmt.Sprintf("%s[%x %s%s]", name, m.ID, role, flags))
	}
	return strings.Join(parts, " ")
}
