package etcd

import (
	"context"
	"fmt"

	"github.com/qcp-dev/qcp/internal/quorum"
)

// ObserveTimeout bounds the member list and alarm reads of ObserveMembers.
// Both are linearizable, so they wait for a leader: with two of five
// members killed at once on a loaded 2-core host, an election and the
// read behind it took more than 2 s, and the planner, told the membership
// was unknown, called for a human. The client retries within this bound,
// so a longer one costs nothing while etcd answers.
const ObserveTimeout = MembershipTimeout

// ObserveMembers reads the member list, each member's status and the alarm
// list, and returns the members as the planner sees them. An error means
// the list could not be read; the caller must then tell the planner the
// membership is unknown (quorum.State.MembersUnknown), never that it is
// empty.
//
// Health and alarms are kept apart. A voter is healthy when it answers a
// status request and knows a leader (a member cut off from the leader
// starts elections and reports none); a learner when it answers. Alarms
// come from the alarm list, which names the member that raised each. The
// Errors of a member's status are not used: etcd repeats every
// cluster-wide alarm there on every member, so one NOSPACE would mark every
// member unhealthy and look like lost quorum.
func (c *Client) ObserveMembers(ctx context.Context) ([]quorum.Member, error) {
	lctx, cancel := context.WithTimeout(ctx, ObserveTimeout)
	defer cancel()
	list, err := c.Members(lctx)
	if err != nil {
		return nil, err
	}
	alarms, err := c.Alarms(lctx)
	if err != nil {
		return nil, fmt.Errorf("observing etcd members: %w", err)
	}
	raised := map[uint64][]string{}
	for _, a := range alarms {
		raised[a.MemberID] = append(raised[a.MemberID], a.Type)
	}
	statuses, _ := c.Statuses(ctx, list)
	out := make([]quorum.Member, 0, len(list))
	for _, mb := range list {
		qm := quorum.Member{ID: mb.ID, Name: mb.Name, Learner: mb.IsLearner, Alarms: raised[mb.ID]}
		if len(mb.PeerURLs) > 0 {
			qm.PeerURL = mb.PeerURLs[0]
		}
		if s, ok := statuses[mb.ID]; ok {
			qm.Healthy = mb.IsLearner || s.Leader != 0
			qm.AppliedIndex, qm.Revision = s.AppliedIndex, s.Revision
			qm.Leader = s.Leader == s.ID
		}
		out = append(out, qm)
	}
	return out, nil
}
