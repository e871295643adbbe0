package engine

import (
	"sync"
	"time"

	"github.com/qcp-dev/qcp/internal/quorum"
)

// CatchUp remembers, per learner, how close it has come to the leader and
// when, so the planner can tell a learner catching up steadily from one
// that answers but never gets closer (quorum.Member.CatchUpProgressAt).
// It lives in memory: after a restart every learner's progress counts from
// the first look, which only postpones giving a stalled one up.
type CatchUp struct {
	mu   sync.Mutex
	best map[uint64]lagMark // by member ID; etcd never reuses one
}

type lagMark struct {
	lag uint64
	at  time.Time
}

// NewCatchUp returns an empty CatchUp.
func NewCatchUp() *CatchUp { return &CatchUp{best: map[uint64]lagMark{}} }

// Observe sets CatchUpProgressAt on every learner in members: the last time
// its lag behind the leader (the leader's applied index minus its own)
// reached a new low. A member that is no longer a learner, or whose lag
// cannot be told (no leader, or the learner did not answer), is left alone;
// IDs are never reused, so a promoted or removed member's record is simply
// dropped the next time a learner list is seen without it.
func (c *CatchUp) Observe(members []quorum.Member, now time.Time) []quorum.Member {
	if c == nil {
		return members // no record: every learner's progress is unknown, counted as now
	}
	var leader *quorum.Member
	for i := range members {
		if members[i].Leader && members[i].Healthy {
			leader = &members[i]
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]quorum.Member, len(members))
	copy(out, members)
	for i := range out {
		m := &out[i]
		if !m.Learner {
			delete(c.best, m.ID)
			continue
		}
		mark, seen := c.best[m.ID]
		if leader != nil && m.Healthy && m.Started() {
			lag := uint64(0)
			if leader.AppliedIndex > m.AppliedIndex {
				lag = leader.AppliedIndex - m.AppliedIndex
			}
			if !seen || lag < mark.lag {
				mark, seen = lagMark{lag: lag, at: now}, true
				c.best[m.ID] = mark
			}
		}
		if seen {
			m.CatchUpProgressAt = mark.at
		}
	}
	return out
}
