package etcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Member is one entry of the member list.
type Member struct {
	ID         uint64
	Name       string
	PeerURLs   []string
	ClientURLs []string
	IsLearner  bool
}

// Started reports whether the member's process has joined: etcd publishes a
// member's name and client URLs only once it has started.
func (m Member) Started() bool { return m.Name != "" }

// String names a member the way logs and wait reasons refer to it.
func (m Member) String() string {
	name := m.Name
	if name == "" {
		name = "(unstarted " + strings.Join(m.PeerURLs, ",") + ")"
	}
	return fmt.Sprintf("%s[%x]", name, m.ID)
}

func fromPB(ms []*etcdserverpb.Member) []Member {
	out := make([]Member, 0, len(ms))
	for _, m := range ms {
		out = append(out, Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// MembershipTimeout bounds each membership request. A member that is
// frozen (a hung host) keeps its TCP connection open and answers nothing;
// without a bound, a request the client happened to send there would wait
// forever, and with it the control plane's reconcile (#8465).
const MembershipTimeout = 5 * time.Second

// bounded is ctx limited to MembershipTimeout.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, MembershipTimeout)
}

// leaderOnly is ctx for a linearizable read that a member without a
// leader must refuse at once (etcd's "no leader", which the client
// retries on another endpoint) instead of holding it until its deadline.
// A member cut off from its peers, which the manager still reaches, has
// no leader: without this, every read the client's balancer sent it
// waited out the whole bound, and QCP, seeing no member list, took no
// step and reported the membership unknown for as long as the cut lasted.
func leaderOnly(ctx context.Context) context.Context { return clientv3.WithRequireLeader(ctx) }

// noLeaderRetry is how long a read refused by every member for want of a
// leader waits before it asks again.
const noLeaderRetry = 100 * time.Millisecond

// readAttemptTimeout bounds one attempt of a linearizable read on one
// member (onLedVoter): well above what a member list takes on a loaded
// host, and short enough that a read can try three members within
// MembershipTimeout.
const readAttemptTimeout = 1500 * time.Millisecond

// unansweredError is a read attempt a member did not answer within
// readAttemptTimeout, which another member can answer.
type unansweredError struct{ err error }

func (e *unansweredError) Error() string {
	return fmt.Sprintf("no answer within %s: %v", readAttemptTimeout, e.err)
}
func (e *unansweredError) Unwrap() error { return e.err }

// isUnanswered reports whether err is an unansweredError.
func isUnanswered(err error) bool {
	var unanswered *unansweredError
	return errors.As(err, &unanswered)
}

// onLedVoter is onVoter for a linearizable read: fn gets ctx with
// leaderOnly, and is called again while every member refuses it for want
// of a leader, or none answers within an attempt's bound, until ctx ends.
// The client's own retries of such a refusal (100, 25 ms apart) end after
// about 2.5 s, and an election on a loaded host can take longer: a read
// that waited for the leader on the member before leaderOnly must go on
// waiting for as long as its context lets it.
//
// Each attempt may take readAttemptTimeout: a member the manager cannot
// reach while its peers can (a partition between the two, a frozen
// member) holds whatever the client's balancer sends it over a connection
// that looks open, and the read is then asked of each member in turn
// (onVoter), so that one such member does not fail the whole read.
func (c *Client) onLedVoter(ctx context.Context, fn func(context.Context, *clientv3.Client) error) error {
	led := leaderOnly(ctx)
	attempt := func(cli *clientv3.Client) error {
		actx, cancel := context.WithTimeout(led, readAttemptTimeout)
		defer cancel()
		err := fn(actx, cli)
		if err != nil && actx.Err() != nil && led.Err() == nil {
			return &unansweredError{err: err}
		}
		return err
	}
	for {
		err := c.onVoter(attempt)
		// No member answered in time: the client's own retries of a
		// refusal for want of a leader can outlast an attempt, as can a
		// loaded host's election; ask again, as for the refusal.
		if !IsNoLeader(err) && !isUnanswered(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(noLeaderRetry):
		}
	}
}

// Members returns the linearizable member list, sorted by ID. Only a
// member that follows a leader is asked (onLedVoter).
func (c *Client) Members(ctx context.Context) ([]Member, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	var resp *clientv3.MemberListResponse
	err := c.onLedVoter(ctx, func(ctx context.Context, cli *clientv3.Client) (err error) {
		resp, err = cli.MemberList(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listing etcd members: %w", err)
	}
	return fromPB(resp.Members), nil
}

// onVoter calls fn with the client, and if a learner refused it (etcd
// v3.5's learners serve no linearizable request, and the client's balancer
// may pick one), a member shutting down answered it (one just removed,
// which the client's endpoints still hold) or, for a read, no member
// answered in time (an unansweredError), with each endpoint's own client
// in turn until one answers otherwise. A learner refuses before doing
// anything, so asking again is safe for every request. A member shutting
// down may have applied a change before it stopped; asked again, etcd
// refuses a second add of the same peer URL, and every other change made
// through here counts its repetition as done (a voter promoted, a revision
// compacted, an alarm disarmed).
func (c *Client) onVoter(fn func(*clientv3.Client) error) error {
	// Another member can answer what a learner, or a member shutting down
	// (one just removed), refused.
	elsewhere := func(err error) bool { return IsLearnerRefusal(err) || IsMemberStopping(err) || isUnanswered(err) }
	err := fn(c.cli)
	if !elsewhere(err) {
		return err
	}
	for _, ep := range c.cli.Endpoints() {
		p, perr := c.pin(ep)
		if perr != nil {
			continue
		}
		if err = fn(p); !elsewhere(err) {
			return err
		}
	}
	return err
}

// AddLearner adds a non-voting member with the given peer URL and returns it
// with the member list as it stood after the add, which the new process
// needs for --initial-cluster.
func (c *Client) AddLearner(ctx context.Context, peerURL string) (Member, []Member, error) {
	ctx, cancel := bounded(ctx)
	defer cancel()
	var resp *clientv3.MemberAddResponse
	err := c.onVoter(func(cli *clientv3.Client) (err error) {
		resp, err = cli.MemberAddAsLearner(ctx, []string{peerURL})
		return err
	})
	if err != nil {
		return Member{}, nil, fmt.Errorf("adding learner %s: %w", peerURL, err)
	}
	added := fromPB([]*etcdserverpb.Member{resp.Member})[0]
	return added, fromPB(resp.Members), nil
}

// Promote makes learner id a voter. A member that already is a voter counts
// as promoted, so a retry after a lost reply succeeds.
func (c *Client) Promote(ctx context.Context, id uint64) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	err := c.onVoter(func(cli *clientv3.Client) error {
		_, err := cli.MemberPromote(ctx, id)
		return err
	})
	if err != nil && !IsMemberNotLearner(err) {
		return fmt.Errorf("promoting member %x: %w", id, err)
	}
	return nil
}

// Remove removes member id. A member that is already gone counts as removed.
// The request goes to the leader, which the planner never removes while it
// leads: sent to the member being removed, it can be answered "server
// stopped" although the removal took effect. After an error, the member
// list decides.
func (c *Client) Remove(ctx context.Context, id uint64) error {
	send := c.cli
	if leader, err := c.Leader(ctx); err == nil && leader.ID != id {
		if p, err := c.pin(leader.Endpoint); err == nil {
			send = p
		}
	}
	rctx, cancel := bounded(ctx)
	_, err := send.MemberRemove(rctx, id)
	cancel()
	if err == nil || IsMemberNotFound(err) {
		return nil
	}
	if ms, lerr := c.Members(ctx); lerr == nil && !slices.ContainsFunc(ms, func(m Member) bool { return m.ID == id }) {
		return nil // removed; only the reply was lost
	}
	return fmt.Errorf("removing member %x: %w", id, err)
}

// MoveLeader transfers leadership to voter id. etcd accepts the request only
// from the current leader, so it finds the leader by asking every member for
// its status and sends the request through a client pinned to the leader.
func (c *Client) MoveLeader(ctx context.Context, id uint64) error {
	leader, err := c.Leader(ctx)
	if err != nil {
		return fmt.Errorf("moving leadership to %x: %w", id, err)
	}
	if leader.ID == id {
		return nil
	}
	p, err := c.pin(leader.Endpoint)
	if err != nil {
		return fmt.Errorf("moving leadership to %x: %w", id, err)
	}
	mctx, cancel := bounded(ctx)
	defer cancel()
	if _, err := p.MoveLeader(mctx, id); err != nil {
		return fmt.Errorf("moving leadership from %x to %x: %w", leader.ID, id, err)
	}
	return nil
}

// DefragmentTimeout bounds one member's defragmentation. etcd rewrites the
// whole database file meanwhile, at disk speed: gigabytes take seconds to
// minutes.
const DefragmentTimeout = 5 * time.Minute

// Defragment defragments member id alone, through a client pinned to its
// own endpoint: etcd's Defragment acts only on the member that serves the
// request. The member blocks its reads and writes until it is done.
func (c *Client) Defragment(ctx context.Context, id uint64) error {
	endpoint, err := c.ClientURL(ctx, id)
	if err != nil {
		return fmt.Errorf("defragmenting: %w", err)
	}
	m, err := c.pinnedMaintenance(endpoint)
	if err != nil {
		return fmt.Errorf("defragmenting member %x: %w", id, err)
	}
	dctx, cancel := context.WithTimeout(ctx, DefragmentTimeout)
	defer cancel()
	if _, err := m.Defragment(dctx, endpoint); err != nil {
		return fmt.Errorf("defragmenting member %x at %s: %w", id, endpoint, err)
	}
	return nil
}

// Snapshot opens a stream of member id's database, served by that member
// alone, through a client pinned to its endpoint. etcd ends the stream with
// the SHA-256 of the database, which a restore checks. The stream lives as
// long as ctx: the caller bounds it, and closes the reader.
func (c *Client) Snapshot(ctx context.Context, id uint64) (io.ReadCloser, error) {
	endpoint, err := c.ClientURL(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	p, err := c.pin(endpoint)
	if err != nil {
		return nil, fmt.Errorf("snapshot of member %x: %w", id, err)
	}
	resp, err := p.SnapshotWithVersion(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshot of member %x at %s: %w", id, endpoint, err)
	}
	return resp.Snapshot, nil
}

// ClientURL is started member id's (first) client URL.
func (c *Client) ClientURL(ctx context.Context, id uint64) (string, error) {
	members, err := c.Members(ctx)
	if err != nil {
		return "", fmt.Errorf("member %x: %w", id, err)
	}
	i := slices.IndexFunc(members, func(m Member) bool { return m.ID == id })
	if i < 0 || len(members[i].ClientURLs) == 0 {
		return "", fmt.Errorf("member %x is not a started member", id)
	}
	return members[i].ClientURLs[0], nil
}

// WaitHealthy waits up to timeout for the member at endpoint to answer
// Health, as one does again once a restart is over.
func (c *Client) WaitHealthy(ctx context.Context, endpoint string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		err := c.Health(ctx, endpoint)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("member at %s still unhealthy after %s: %w", endpoint, timeout, err)
		case <-tick.C:
		}
	}
}

// Compact compacts the key-value history up to rev, and waits until the
// members have freed its space in their database files (physical), so that
// a defragmentation afterwards gives it back. A revision compacted already
// is success.
func (c *Client) Compact(ctx context.Context, rev int64) error {
	cctx, cancel := context.WithTimeout(ctx, DefragmentTimeout)
	defer cancel()
	err := c.onVoter(func(cli *clientv3.Client) error {
		_, err := cli.Compact(cctx, rev, clientv3.WithCompactPhysical())
		return err
	})
	if err != nil && !IsCompacted(err) {
		return fmt.Errorf("compacting etcd to revision %d: %w", rev, err)
	}
	return nil
}

// MemberStatus is what one member reports about itself.
type MemberStatus struct {
	ID       uint64
	Endpoint string
	// ClusterID is the cluster the member belongs to: a recovery from a
	// survivor makes a new one.
	ClusterID uint64
	// Revision is the key-value store revision; RaftIndex the last log
	// index the member has; AppliedIndex the last one it has applied.
	Revision     int64
	RaftIndex    uint64
	AppliedIndex uint64
	RaftTerm     uint64
	Leader       uint64
	IsLearner    bool
	DBSize       int64
	// DBSizeInUse is the part of DBSize that holds data; DBSizeQuota the
	// backend quota the member runs with (0 from etcd 3.5, which does not
	// report it).
	DBSizeInUse int64
	DBSizeQuota int64
	// Version is the etcd server version the member runs, e.g. 3.6.16.
	Version string
	// Errors are the member's own complaints, such as a raised alarm.
	Errors []string
}

// Status asks the member serving endpoint for its status.
func (c *Client) Status(ctx context.Context, endpoint string) (MemberStatus, error) {
	m, err := c.pinnedMaintenance(endpoint)
	if err != nil {
		return MemberStatus{}, err
	}
	r, err := m.Status(ctx, endpoint)
	if err != nil {
		return MemberStatus{}, fmt.Errorf("status of %s: %w", endpoint, err)
	}
	return MemberStatus{
		ID: r.Header.MemberId, Endpoint: endpoint, ClusterID: r.Header.ClusterId, Revision: r.Header.Revision, RaftIndex: r.RaftIndex,
		AppliedIndex: r.RaftAppliedIndex, RaftTerm: r.RaftTerm, Leader: r.Leader, IsLearner: r.IsLearner,
		DBSize: r.DbSize, DBSizeInUse: r.DbSizeInUse, DBSizeQuota: r.DbSizeQuota, Errors: r.Errors, Version: r.Version,
	}, nil
}

// StatusTimeout bounds each member's status probe in Statuses: the client
// retries an unreachable member until its context ends, and one dead member
// must not stall the view of the others.
const StatusTimeout = time.Second

// Statuses asks every started member for its status, in parallel. A member
// that does not answer is reported in the error map instead, so one dead
// member does not hide the others.
func (c *Client) Statuses(ctx context.Context, members []Member) (map[uint64]MemberStatus, map[uint64]error) {
	ok := map[uint64]MemberStatus{}
	failed := map[uint64]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range members {
		if len(m.ClientURLs) == 0 {
			failed[m.ID] = fmt.Errorf("member %s has not started", m)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, StatusTimeout)
			defer cancel()
			s, err := c.Status(sctx, m.ClientURLs[0])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed[m.ID] = err
				return
			}
			ok[m.ID] = s
		}()
	}
	wg.Wait()
	return ok, failed
}

// ErrNoLeaderNamed is Leader's answer when no member that answered its
// status names a leader: an election under way, or statuses too slow on a
// loaded host. Asking again may find one (IsRetryable).
var ErrNoLeaderNamed = errors.New("no etcd member reports a leader")

// Leader returns the status of the member the reachable members follow
// (ElectedLeader), or an error if they name none that is still a member.
// An old leader cut off from the others, which still calls itself leader,
// is not taken for it. When the leader did not answer its own status in
// time, only ID and Endpoint are set: requests that must go to the leader
// still can.
func (c *Client) Leader(ctx context.Context) (MemberStatus, error) {
	members, err := c.Members(ctx)
	if err != nil {
		return MemberStatus{}, err
	}
	statuses, _ := c.Statuses(ctx, members)
	id := ElectedLeader(statuses)
	if id == 0 {
		return MemberStatus{}, ErrNoLeaderNamed
	}
	if s, ok := statuses[id]; ok {
		return s, nil
	}
	for _, m := range members {
		if m.ID == id && len(m.ClientURLs) > 0 {
			return MemberStatus{ID: id, Endpoint: m.ClientURLs[0]}, nil
		}
	}
	return MemberStatus{}, fmt.Errorf("the etcd members follow %x, which is no longer a started member", id)
}

// Alarms lists the raised alarms (NOSPACE, CORRUPT) with the member raising each.
func (c *Client) Alarms(ctx context.Context) ([]Alarm, error) {
	var resp *clientv3.AlarmResponse
	err := c.onLedVoter(ctx, func(ctx context.Context, cli *clientv3.Client) (err error) {
		resp, err = cli.AlarmList(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listing etcd alarms: %w", err)
	}
	return fromAlarmPB(resp), nil
}

func fromAlarmPB(resp *clientv3.AlarmResponse) []Alarm {
	out := make([]Alarm, 0, len(resp.Alarms))
	for _, a := range resp.Alarms {
		out = append(out, Alarm{MemberID: a.MemberID, Type: a.Alarm.String()})
	}
	return out
}

// Alarm is one raised alarm.
type Alarm struct {
	MemberID uint64
	Type     string
}

// DisarmAlarm disarms alarm typ (NOSPACE, CORRUPT) raised by member id,
// which need not be listed any more: etcd keeps a removed member's alarms.
// An alarm that is not raised counts as disarmed, so a retry after a lost
// reply succeeds.
func (c *Client) DisarmAlarm(ctx context.Context, id uint64, typ string) error {
	t, ok := etcdserverpb.AlarmType_value[typ]
	if !ok || etcdserverpb.AlarmType(t) == etcdserverpb.AlarmType_NONE {
		// NONE with member 0 would make the client disarm every alarm.
		return fmt.Errorf("disarming alarm %q of member %x: not an etcd alarm type (NOSPACE, CORRUPT)", typ, id)
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	err := c.onVoter(func(cli *clientv3.Client) error {
		_, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: id, Alarm: etcdserverpb.AlarmType(t)})
		return err
	})
	if err != nil {
		return fmt.Errorf("disarming alarm %s of member %x: %w", typ, id, err)
	}
	return nil
}

// Health checks one member the way etcd's /health does: a linearizable read
// through that member, within MembershipTimeout. It fails for a learner,
// which serves no reads, for a member cut off from the leader, and for one
// that does not answer.
func (c *Client) Health(ctx context.Context, endpoint string) error {
	p, err := c.pin(endpoint)
	if err != nil {
		return err
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	if _, err := p.Get(ctx, "health"); err != nil {
		return fmt.Errorf("health of %s: %w", endpoint, err)
	}
	return nil
}

// Agreement is the member list as each member sees it.
type Agreement struct {
	// Views maps a member ID to the sorted IDs (learners suffixed "L") it lists.
	Views map[uint64][]string
	// Errors maps a member ID to why its view could not be read.
	Errors map[uint64]error
}

// Agree reports whether every member that answered lists the same members
// with the same roles, and every member answered.
func (a Agreement) Agree() bool { return len(a.Errors) == 0 && a.Consistent() }

// Consistent reports whether the members that answered list the same
// members with the same roles. A member that does not answer is not a
// disagreement: it is down, which the member's health shows; reading the
// membership as unknown for it would stop every repair of a down member.
func (a Agreement) Consistent() bool {
	var first []string
	for _, v := range a.Views {
		if first == nil {
			first = v
			continue
		}
		if !slices.Equal(first, v) {
			return false
		}
	}
	return true
}

// MemberListAgreement reads the member list from every started voter
// without going through the leader (serializable), so that a member with a
// stale view shows up as disagreeing. Learners are not asked: etcd serves
// them no member list ("rpc not supported for learner"), and it is the
// voters' views that must agree. The voters are asked in parallel, each
// within StatusTimeout, so one dead member does not hold up the others.
func (c *Client) MemberListAgreement(ctx context.Context) (Agreement, error) {
	members, err := c.Members(ctx)
	if err != nil {
		return Agreement{}, err
	}
	a := Agreement{Views: map[uint64][]string{}, Errors: map[uint64]error{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range members {
		if m.IsLearner {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			view, err := c.memberListFrom(ctx, m)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				a.Errors[m.ID] = err
				return
			}
			a.Views[m.ID] = view
		}()
	}
	wg.Wait()
	return a, nil
}

// memberListFrom is m's own view of the member list: sorted IDs, learners
// suffixed "L".
func (c *Client) memberListFrom(ctx context.Context, m Member) ([]string, error) {
	if len(m.ClientURLs) == 0 {
		return nil, fmt.Errorf("member %s has not started", m)
	}
	ctx, cancel := context.WithTimeout(ctx, StatusTimeout)
	defer cancel()
	members, err := c.serializableMembers(ctx, m.ClientURLs[0])
	if err != nil {
		return nil, fmt.Errorf("member list from %s: %w", m, err)
	}
	var view []string
	for _, v := range members {
		id := fmt.Sprintf("%x", v.ID)
		if v.IsLearner {
			id += "L"
		}
		view = append(view, id)
	}
	return view, nil
}

// serializableMembers is the member list as the member at endpoint has
// applied it, read from it alone.
func (c *Client) serializableMembers(ctx context.Context, endpoint string) ([]Member, error) {
	p, err := c.pin(endpoint)
	if err != nil {
		return nil, err
	}
	resp, err := p.MemberList(ctx, clientv3.WithSerializable())
	if err != nil {
		return nil, err
	}
	return fromPB(resp.Members), nil
}

// LocalView is one member's own view: the members it has applied, the
// leader it follows (0 for none) and its cluster.
type LocalView struct {
	ID, Leader uint64
	// ClusterID is the cluster the member belongs to.
	ClusterID uint64
	Members   []uint64
	// Learners are those of Members that are learners.
	Learners []uint64
}

// LocalView reads the member at endpoint's own view, from it alone and
// without a linearizable request, so that it answers during an election.
// The member list is read before the status: a view whose list lacks the
// leader its status names was still following that leader after applying
// the list.
func (c *Client) LocalView(ctx context.Context, endpoint string) (LocalView, error) {
	ctx, cancel := context.WithTimeout(ctx, StatusTimeout)
	defer cancel()
	members, err := c.serializableMembers(ctx, endpoint)
	if err != nil {
		return LocalView{}, fmt.Errorf("member list from %s: %w", endpoint, err)
	}
	s, err := c.Status(ctx, endpoint)
	if err != nil {
		return LocalView{}, err
	}
	v := LocalView{ID: s.ID, Leader: s.Leader, ClusterID: s.ClusterID}
	for _, m := range members {
		v.Members = append(v.Members, m.ID)
		if m.IsLearner {
			v.Learners = append(v.Learners, m.ID)
		}
	}
	return v, nil
}

// ForgetEndpoint drops cached connections to an endpoint whose member was
// removed or whose machine was deleted.
func (c *Client) ForgetEndpoint(endpoint string) { c.forgetPinned(endpoint) }
