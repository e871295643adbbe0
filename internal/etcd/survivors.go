package etcd

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/qcp-dev/qcp/internal/quorum"
)

// Survivors asks each endpoint on its own, in parallel and without going
// through a leader, for its status and the member list it has applied: what
// a planner can know of a cluster whose member list cannot be read, such as
// one that lost quorum. An endpoint that does not answer both within
// StatusTimeout is left out. The survivors come sorted by member ID.
func (c *Client) Survivors(ctx context.Context, endpoints []string) []quorum.Survivor {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var out []quorum.Survivor
	for _, ep := range endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, ok := c.survivor(ctx, ep)
			if !ok {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			out = append(out, s)
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b quorum.Survivor) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// survivor is the member at endpoint as it reports itself, with its view.
func (c *Client) survivor(ctx context.Context, endpoint string) (quorum.Survivor, bool) {
	ctx, cancel := context.WithTimeout(ctx, StatusTimeout)
	defer cancel()
	list, err := c.serializableMembers(ctx, endpoint)
	if err != nil {
		return quorum.Survivor{}, false
	}
	st, err := c.Status(ctx, endpoint)
	if err != nil {
		return quorum.Survivor{}, false
	}
	s := quorum.Survivor{Member: quorum.Member{ID: st.ID, Learner: st.IsLearner, AppliedIndex: st.AppliedIndex, Revision: st.Revision,
		DBSize: st.DBSize, DBSizeInUse: st.DBSizeInUse, DBSizeQuota: st.DBSizeQuota}}
	for _, m := range list {
		qm := quorum.Member{ID: m.ID, Name: m.Name, Learner: m.IsLearner}
		if len(m.PeerURLs) > 0 {
			qm.PeerURL = m.PeerURLs[0]
		}
		if m.ID == st.ID {
			s.Name, s.PeerURL = qm.Name, qm.PeerURL
		}
		s.View = append(s.View, qm)
	}
	return s, true
}
