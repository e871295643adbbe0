package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
)

// memberPoll is how often a joining machine asks for the member list while
// it waits for the control plane to add it as a learner, then to promote
// it. etcd has no membership watch; a step the controller takes within
// 100 ms should not cost the machine's start-up a 2-s poll.
const memberPoll = 250 * time.Millisecond

// publishGrace is how long a joining member may take to start serving its
// clients before the agent restarts it, once. A member serves within a
// second of its start unless its request to publish itself was lost, after
// which etcd itself retries only when its 7-s request timeout runs out.
const publishGrace = 2 * time.Second

// etcdTLS presents the agent's own etcd client identity, issued from the
// etcd CA. It asks for the identity at every handshake, so a connection
// made after a renewal presents the renewed certificate.
func (a *machineCtx) etcdTLS() (*tls.Config, error) {
	pool, err := certs.CertPool(a.pki.EtcdTrust())
	if err != nil {
		return nil, fmt.Errorf("etcd CA: %w", err)
	}
	return &tls.Config{RootCAs: pool, GetClientCertificate: a.pki.etcdClientCertificate, MinVersion: tls.VersionTLS12}, nil
}

func (a *machineCtx) etcdClient(endpoints []string) (*clientv3.Client, error) {
	tlsCfg, err := a.etcdTLS()
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		TLS:         tlsCfg,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// joinEtcd waits until this machine's peer URL is in the member list (the
// control plane controller adds it as a learner; the agent never adds
// itself) and returns etcd's --initial-cluster built from that list.
func (a *machineCtx) joinEtcd(ctx context.Context) (string, error) {
	local := a.doc.Etcd.Local
	myPeer := a.url("https", EtcdPeerPort)
	if len(local.ExistingEndpoints) == 0 {
		// Only an initial cluster was given: trust it as etcd would.
		return local.InitialCluster, nil
	}
	cli, err := a.etcdClient(local.ExistingEndpoints)
	if err != nil {
		return "", fmt.Errorf("connecting to existing etcd members %v: %w", local.ExistingEndpoints, err)
	}
	defer cli.Close()
	lastMsg := ""
	for {
		msg, initial := a.checkMembership(ctx, cli, myPeer)
		if initial != "" {
			a.log.Info("own peer URL is in the etcd member list; starting etcd", "peerURL", myPeer, "initialCluster", initial)
			return initial, nil
		}
		if msg != lastMsg {
			a.log.Info("waiting before starting etcd", "waitingFor", msg)
			lastMsg = msg
		}
		a.sup.setWaiting("etcd", msg)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(memberPoll):
		}
	}
}

func (a *machineCtx) checkMembership(ctx context.Context, cli *clientv3.Client, myPeer string) (waitingFor, initialCluster string) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.MemberList(cctx)
	if err != nil {
		return fmt.Sprintf("the etcd member list from %v (error: %v)", a.doc.Etcd.Local.ExistingEndpoints, err), ""
	}
	return joinCluster(resp.Members, a.machine.Name, myPeer)
}

// joinCluster is etcd's --initial-cluster for machine myName joining at
// myPeer, once members lists it, or what the machine waits for. etcd takes
// the member whose peer URL it advertises for its own, so a member at
// myPeer that has started under another name is an old member whose
// address this machine reuses: joining as it with an empty data directory
// would bring back a voter that has forgotten its log. The machine waits
// for it to be removed instead.
func joinCluster(members []*etcdserverpb.Member, myName, myPeer string) (waitingFor, initialCluster string) {
	var parts, seen []string
	found := false
	for _, m := range members {
		name := m.Name
		isMe := slices.Contains(m.PeerURLs, myPeer)
		if isMe && !isOwn(m, myName) {
			return fmt.Sprintf("etcd member %s (%x), which holds this machine's peer URL %s, to be removed: it is an earlier machine's member at a reused address", m.Name, m.ID, myPeer), ""
		}
		if isMe {
			found, name = true, myName
		}
		if name == "" {
			// Another added but unstarted member: etcd matches members by
			// peer URL, so any unique name will do.
			name = fmt.Sprintf("unstarted-%x", m.ID)
		}
		seen = append(seen, name+"="+strings.Join(m.PeerURLs, "|"))
		for _, u := range m.PeerURLs {
			parts = append(parts, name+"="+u)
		}
	}
	if !found {
		sort.Strings(seen)
		return fmt.Sprintf("peer URL %s to be added to the etcd member list (as a learner, by the control plane controller); members now: %s", myPeer, strings.Join(seen, ", ")), ""
	}
	sort.Strings(parts)
	return "", strings.Join(parts, ",")
}

// isOwn reports whether m can be this machine's member: not started yet,
// or started under this machine's name (the agent restarted).
func isOwn(m *etcdserverpb.Member, myName string) bool { return m.Name == "" || m.Name == myName }

// waitVoter blocks until this machine's member is a voter. A learner
// refuses the API server's requests, so starting kube-apiserver earlier
// would only crash-loop it.
func (a *machineCtx) waitVoter(ctx context.Context) error {
	cli, err := a.etcdClient(append([]string{a.url("https", EtcdClientPort)}, a.doc.Etcd.Local.ExistingEndpoints...))
	if err != nil {
		return err
	}
	defer cli.Close()
	myPeer := a.url("https", EtcdPeerPort)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cli.MemberList(cctx)
		cancel()
		if err == nil {
			for _, m := range resp.Members {
				if slices.Contains(m.PeerURLs, myPeer) && isOwn(m, a.machine.Name) && !m.IsLearner {
					return nil
				}
			}
		}
		a.sup.setWaiting("kube-apiserver", "etcd member "+a.machine.Name+" to be promoted from learner to voter")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(memberPoll):
		}
	}
}

// watchPublish restarts a joining etcd, once, if it does not serve its
// clients publishGrace after it started. etcd v3.5 serves only once its
// request to publish itself (its name and client URLs, through raft) has
// completed. A new member that the leader sends a snapshot as it starts (a
// member whose log the cluster has compacted away always gets one) drops
// and re-adds its peer connections to apply it, and often never learns that
// its request went through: the cluster lists its name at once, yet it
// waits out etcd's 7-s request timeout before it asks again and serves
// (etcd-io/etcd#16436, #18534). Until then the control plane will not
// promote it; half the joins here took 7 s longer than the others. Started
// again, the member already holds the snapshot, and serves within a second.
func (a *machineCtx) watchPublish(ctx context.Context) {
	cli, err := a.etcdClient([]string{a.url("https", EtcdClientPort)})
	if err != nil {
		a.log.Warn("cannot watch etcd start serving", "err", err)
		return
	}
	defer cli.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(memberPoll):
		}
		cctx, cancel := context.WithTimeout(ctx, memberPoll)
		_, err := cli.Status(cctx, a.url("https", EtcdClientPort))
		cancel()
		if err == nil {
			return
		}
		if st := a.sup.Snapshot()[bootstrap.Etcd]; st.Running && time.Since(st.StartedAt) > publishGrace {
			a.sup.Restart(bootstrap.Etcd, fmt.Sprintf("etcd does not serve its clients %v after it started; unless restarted, it would retry publishing itself only after its 7-s request timeout", publishGrace))
			return
		}
	}
}

// voterClientURLs asks the members at endpoints for the member list and
// returns the client URLs of its started voters, within a second or two.
func (a *machineCtx) voterClientURLs(endpoints []string) ([]string, error) {
	cli, err := a.etcdClient(endpoints)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		return nil, err
	}
	var urls []string
	for _, m := range resp.Members {
		if !m.IsLearner && m.Name != "" {
			urls = append(urls, m.ClientURLs...)
		}
	}
	return urls, nil
}
