package etcd

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/qcp-dev/qcp/internal/quorum"
)

// activePeersMetric is etcd's gauge of its raft connections, one series
// per remote member (label Remote, the member ID in hex): 1 while the
// connection is up. etcd drops a connection on which nothing has arrived
// for 5 s (rafthttp's read timeout), and its leader sends every member a
// heartbeat each heartbeat interval, so a member that is down, frozen or
// cut off from the member reading the gauge shows 0 within seconds.
const activePeersMetric = "etcd_network_active_peers"

// ActivePeers reads, from the /metrics of the member at endpoint (its
// client URL, with the client's TLS), the members it holds an active raft
// connection with.
func (c *Client) ActivePeers(ctx context.Context, endpoint string) (map[uint64]bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.web().Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the metrics of %s: %w", endpoint, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading the metrics of %s: %s", endpoint, resp.Status)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the metrics of %s: %w", endpoint, err)
	}
	active := map[uint64]bool{}
	for _, m := range families[activePeersMetric].GetMetric() {
		if m.GetGauge().GetValue() < 1 {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() != "Remote" {
				continue
			}
			if id, err := strconv.ParseUint(l.GetValue(), 16, 64); err == nil {
				active[id] = true
			}
		}
	}
	return active, nil
}

// web is the client's HTTPS client for members' /metrics, made on first
// use and kept, so that repeated reads reuse their connection.
func (c *Client) web() *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.http == nil {
		c.http = &http.Client{Transport: &http.Transport{TLSClientConfig: c.tls.Clone(), MaxIdleConnsPerHost: 1}}
	}
	return c.http
}

// peersView marks the members of out (membersOf list) that did not answer
// their status but that etcd's own members still reach
// (quorum.Member.ReachedByPeers):
//   - the leader the answering members name: a follower that stops hearing
//     from its leader starts an election within an election timeout, so a
//     leader still named in the highest term is one its followers hear;
//   - the members the elected leader, when it answered, holds an active raft
//     connection with (ActivePeers).
//
// QCP may be cut off from a machine that its peers reach (a partition
// between the management cluster and that machine); its member then reads
// as unhealthy to QCP, and the planner must not replace it for that. The
// leader's metrics are read only when a started member did not answer; when
// they cannot be read, no member but the named leader is marked.
func (c *Client) peersView(ctx context.Context, list []Member, statuses map[uint64]MemberStatus, out []quorum.Member) {
	leader := ElectedLeader(statuses)
	var active map[uint64]bool
	asked := false
	for i := range out {
		m := &out[i]
		if _, answered := statuses[m.ID]; answered || !list[i].Started() {
			continue
		}
		if m.ID == leader {
			m.ReachedByPeers = true
			continue
		}
		ls, ok := statuses[leader]
		if !ok {
			continue
		}
		if !asked {
			asked = true
			actx, cancel := context.WithTimeout(ctx, StatusTimeout)
			active, _ = c.ActivePeers(actx, ls.Endpoint)
			cancel()
		}
		m.ReachedByPeers = active[m.ID]
	}
}
