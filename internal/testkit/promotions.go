package testkit

import (
	"context"
	"crypto/tls"
	"net/http"
	"slices"
	"sync"

	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// promotionCounter is etcd's own count of the learners a member promoted
// while it led (a promotion sent to a follower is forwarded to the leader,
// which counts it).
const promotionCounter = "etcd_server_learner_promote_successes"

// MonitorOption configures StartMonitor.
type MonitorOption func(*Monitor)

// WithPromotionCounts lets the monitor read etcd's own promotion counter
// from each member's /metrics, over TLS with tlsCfg (the client's), as
// evidence for I3 when a voter appears between two samples that neither a
// sample nor a member's view listed as a learner: QCP may add a learner
// and promote it within one sampling interval (chaos seed 702686: 340 ms,
// stop 69). Without it such a voter is judged to have joined directly.
func WithPromotionCounts(tlsCfg *tls.Config) MonitorOption {
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}, Timeout: etcd.StatusTimeout}
	return func(m *Monitor) {
		m.promotions = func(ctx context.Context, clientURL string) (uint64, error) {
			return readPromotions(ctx, hc, clientURL)
		}
	}
}

// readPromotions reads promotionCounter from the member at clientURL.
func readPromotions(ctx context.Context, hc *http.Client, clientURL string) (uint64, error) {
	v, err := metricAt(ctx, hc, clientURL, promotionCounter+" ")
	return uint64(v), err
}

// promotionCounts reads every member of list's promotion counter, all at
// once (a sample waits for the slowest, not for their sum), the members
// known to be down and those that do not answer left out.
func (m *Monitor) promotionCounts(ctx context.Context, list []etcd.Member) map[uint64]uint64 {
	out := map[uint64]uint64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, mb := range list {
		m.statusMu.Lock()
		_, down := m.down[mb.ID]
		m.statusMu.Unlock()
		if down || len(mb.ClientURLs) == 0 {
			continue
		}
		wg.Go(func() {
			if n, err := m.promotions(ctx, mb.ClientURLs[0]); err == nil {
				mu.Lock()
				out[mb.ID] = n
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// coverUnseenPromotions runs before a sample is recorded. If the sample
// (members, from list) has voters that were not voters in the previous
// sample (prev) and that nothing listed as learners, it reads the members'
// promotion counters: if the counters of the members read at the last
// membership change grew since by at least the number of voters new since
// the previous sample, every new voter was promoted, so each joined as a
// learner, and the unseen ones are noted as learners (I3). Otherwise they
// stay to be judged as voters that joined directly.
func (m *Monitor) coverUnseenPromotions(ctx context.Context, list []etcd.Member, prev, members []quorum.Member) {
	m.mu.Lock()
	base := m.promotedBase
	var unseen []uint64
	newVoters := 0
	for _, mb := range members {
		if mb.Learner || slices.ContainsFunc(prev, func(p quorum.Member) bool { return p.ID == mb.ID && !p.Learner }) {
			continue
		}
		newVoters++
		if !m.learners[mb.ID] {
			unseen = append(unseen, mb.ID)
		}
	}
	m.mu.Unlock()
	if m.promotions == nil || prev == nil || base == nil || len(unseen) == 0 {
		return
	}
	grew := uint64(0)
	for id, n := range m.promotionCounts(ctx, list) {
		if b, ok := base[id]; ok && n > b {
			grew += n - b
		}
	}
	if grew < uint64(newVoters) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range unseen {
		m.learners[id] = true
		m.report.PromotedUnseen++
	}
}

// rebasePromotions runs after a sample is recorded: if its membership
// (who is a member, and who a learner) differs from the one before, or
// no counts were read yet, it reads the promotion counters anew, the base
// that coverUnseenPromotions compares with.
func (m *Monitor) rebasePromotions(ctx context.Context, list []etcd.Member, before, members []quorum.Member) {
	if m.promotions == nil {
		return
	}
	m.mu.Lock()
	read := m.promotedBase != nil
	m.mu.Unlock()
	if read && sameMembership(before, members) {
		return
	}
	counts := m.promotionCounts(ctx, list)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.promotedBase = counts
}

// sameMembership reports whether a and b list the same members, each a
// learner in both or in neither.
func sameMembership(a, b []quorum.Member) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(x quorum.Member) bool {
		return !slices.ContainsFunc(b, func(y quorum.Member) bool { return y.ID == x.ID && y.Learner == x.Learner })
	})
}
