package etcd

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/qcp-dev/qcp/internal/quorum"
)

// ObserveTimeout bounds the member list and alarm reads of ObserveMembers.
// Both are linearizable, so they wait for a leader: with two of five
// members killed at once on a loaded 2-core host, an election and the
// read behind it took more than 2 s, and the planner, told the membership
// was unknown, called for a human. The client retries within this bound,
// so a longer one costs nothing while etcd answers.
const ObserveTimeout = MembershipTimeout

// ObserveMembers is Observe without the departed members' alarms.
func (c *Client) ObserveMembers(ctx context.Context) ([]quorum.Member, error) {
	members, _, err := c.Observe(ctx)
	return members, err
}

// Observe reads the alarm list, the member list and each member's status,
// and returns the members as the planner sees them, with the alarms raised
// by members no longer listed (departed). An error means the list could
// not be read; the caller must then tell the planner the membership is
// unknown (quorum.State.MembersUnknown), never that it is empty.
//
// Health and alarms are kept apart. A voter is healthy when it answers a
// status request and knows a leader (a member cut off from the leader
// starts elections and reports none); a learner when it answers. Alarms
// come from the alarm list, which names the member that raised each. The
// Errors of a member's status are not used: etcd repeats every
// cluster-wide alarm there on every member, so one NOSPACE would mark every
// member unhealthy and look like lost quorum. The leader is the one the
// members' statuses name (ElectedLeader), whether or not it answered its
// own.
//
// etcd keeps an alarm after the member that raised it is removed, until
// someone disarms it, and it goes on refusing writes (NOSPACE) meanwhile.
// The alarm list is read before the member list: member IDs are never
// reused, so an alarm whose member the later list lacks was raised by a
// member since removed, never by one added in between.
func (c *Client) Observe(ctx context.Context) (members []quorum.Member, departed []quorum.Alarm, err error) {
	lctx, cancel := context.WithTimeout(ctx, ObserveTimeout)
	defer cancel()
	alarms, err := c.Alarms(lctx)
	if err != nil {
		return nil, nil, fmt.Errorf("observing etcd members: %w", err)
	}
	list, err := c.Members(lctx)
	if err != nil {
		return nil, nil, err
	}
	members, departed = c.observed(ctx, list, alarms)
	return members, departed, nil
}

// observed reads the status of each member of list and returns membersOf
// them.
func (c *Client) observed(ctx context.Context, list []Member, alarms []Alarm) (out []quorum.Member, departed []quorum.Alarm) {
	statuses, _ := c.Statuses(ctx, list)
	return membersOf(list, statuses, alarms)
}

// MembersWith is the members of list as Observe sees them, from statuses
// read apart from the list, without alarms. The tests' monitor samples
// this way: it reads the member list (Members), which etcd serves without
// a raft proposal, unlike the alarm list Observe reads first, and asks
// for the statuses of the members it does not know to be down.
func MembersWith(list []Member, statuses map[uint64]MemberStatus) []quorum.Member {
	members, _ := membersOf(list, statuses, nil)
	return members
}

// membersOf is the members of list with their statuses and the alarms they
// raised, and the alarms of members list lacks (departed).
func membersOf(list []Member, statuses map[uint64]MemberStatus, alarms []Alarm) (out []quorum.Member, departed []quorum.Alarm) {
	raised := map[uint64][]string{}
	for _, a := range alarms {
		raised[a.MemberID] = append(raised[a.MemberID], a.Type)
	}
	leader := ElectedLeader(statuses)
	out = make([]quorum.Member, 0, len(list))
	for _, mb := range list {
		qm := quorum.Member{ID: mb.ID, Name: mb.Name, Learner: mb.IsLearner, Alarms: raised[mb.ID]}
		delete(raised, mb.ID)
		if len(mb.PeerURLs) > 0 {
			qm.PeerURL = mb.PeerURLs[0]
		}
		if s, ok := statuses[mb.ID]; ok {
			qm.Healthy = mb.IsLearner || s.Leader != 0
			qm.AppliedIndex, qm.Revision = s.AppliedIndex, s.Revision
			qm.DBSize, qm.DBSizeInUse, qm.DBSizeQuota = s.DBSize, s.DBSizeInUse, s.DBSizeQuota
		}
		// Even when its own status did not answer: a leader too loaded to
		// answer within StatusTimeout then reads as an unhealthy leader,
		// which the planner waits on, not as a down voter it may remove
		// without moving leadership first.
		qm.Leader = leader != 0 && mb.ID == leader && !mb.IsLearner
		out = append(out, qm)
	}
	for _, a := range alarms {
		if _, gone := raised[a.MemberID]; gone {
			departed = append(departed, quorum.Alarm{MemberID: a.MemberID, Type: a.Type})
		}
	}
	return out, departed
}

// ElectedLeader is the member the answering members follow, taken from the
// view with the highest raft term that names a leader; 0 if none names
// one. Every member's view counts, not only the leader's own: a leader
// whose status request timed out is still named by its followers. The
// term decides between views that disagree: an old leader cut off from
// the others still names itself, in a term the others have left behind
// when they elected another. A higher term whose members name nobody yet
// (an election under way) does not unseat the last leader named: keeping
// it marked can only make the planner wait or move leadership, while
// unmarking it could let the planner remove a member that still leads.
// Raft elects at most one leader per term; should two views of one term
// disagree all the same, the lowest member ID's view wins, so that the
// answer does not depend on map order.
func ElectedLeader(statuses map[uint64]MemberStatus) uint64 {
	var leader, term uint64
	for _, id := range slices.Sorted(maps.Keys(statuses)) {
		s := statuses[id]
		if s.Leader != 0 && (leader == 0 || s.RaftTerm > term) {
			leader, term = s.Leader, s.RaftTerm
		}
	}
	return leader
}
