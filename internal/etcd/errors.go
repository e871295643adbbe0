package etcd

import (
	"context"
	"errors"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error descriptions the server sends. They are matched exactly, not by
// prefix: "can only promote a learner member" (already a voter) is a prefix of
// "... which is in sync with leader" (not caught up), and the two mean
// opposite things to a caller.
const (
	descUnhealthy        = "etcdserver: unhealthy cluster"
	descLearnerNotReady  = "etcdserver: can only promote a learner member which is in sync with leader"
	descMemberNotLearner = "etcdserver: can only promote a learner member"
	descTooManyLearners  = "etcdserver: too many learner members in cluster"
	descNotLeader        = "etcdserver: not leader"
	descLeaderChanged    = "etcdserver: leader changed"
	descNoLeader         = "etcdserver: no leader"
	descNotEnoughStarted = "etcdserver: re-configuration failed due to not enough started members"
	// descProposalDropped comes from the raft package, not rpctypes; the
	// server returns it as gRPC Unknown while a leader transfer is running.
	descProposalDropped = "raft proposal dropped"
	// descRaftStopped and descServerStopped come from a member that is
	// shutting down, typically one just removed from the cluster that the
	// client still had in its endpoint list: another member can answer.
	descRaftStopped   = "raft: stopped"
	descServerStopped = "etcdserver: server stopped"
)

// retryableDescs are refusals that go away by themselves: etcd is waiting for
// a quorum to be connected long enough, for a learner to catch up, for an
// election, or for the one learner slot to free up.
var retryableDescs = map[string]bool{
	descUnhealthy:        true,
	descLearnerNotReady:  true,
	descTooManyLearners:  true,
	descNotLeader:        true,
	descLeaderChanged:    true,
	descNoLeader:         true,
	descNotEnoughStarted: true,
	descProposalDropped:  true,
	descRaftStopped:      true,
	descServerStopped:    true,
}

// IsRetryable reports whether err is a transient refusal after which the same
// request may succeed unchanged: a refusal listed above, or a transport-level
// Unavailable or DeadlineExceeded. Everything else (duplicate peer URL,
// unknown member, bad transferee, permission errors, cancellation by the
// caller) is final: repeating the request cannot help.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrNoLeaderNamed) {
		return true
	}
	desc := errorDesc(err)
	if retryableDescs[desc] {
		return true
	}
	switch errorCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	// The raft error may arrive wrapped in other text.
	return strings.Contains(desc, descProposalDropped)
}

// refusedDescs are refusals the server makes before it proposes anything:
// after one of them, the request has certainly not taken effect.
var refusedDescs = map[string]bool{
	descUnhealthy:        true,
	descTooManyLearners:  true,
	descNotEnoughStarted: true,
}

// IsRefused reports whether err is a refusal after which the request has
// certainly not taken effect, unlike a timeout, whose outcome is unknown.
// A caller that recorded its intent before the request may then drop the
// record.
func IsRefused(err error) bool {
	return err != nil && refusedDescs[errorDesc(err)]
}

// IsMemberNotLearner reports whether a promotion was refused because the
// member already is a voter, which a caller retrying a promotion whose first
// reply it lost should treat as success.
func IsMemberNotLearner(err error) bool {
	return err != nil && errorDesc(err) == descMemberNotLearner
}

// IsLearnerRefusal reports whether a learner refused the request: etcd
// v3.5's learners serve only serializable reads and status.
func IsLearnerRefusal(err error) bool {
	return err != nil && errorDesc(err) == errorDesc(rpctypes.ErrGRPCNotSupportedForLearner)
}

// IsNoLeader reports whether the member that answered follows no leader
// and refused a request that asked for one (WithRequireLeader).
func IsNoLeader(err error) bool {
	return err != nil && errorDesc(err) == errorDesc(rpctypes.ErrGRPCNoLeader)
}

// IsMemberStopping reports whether the member that answered is shutting
// down, typically one just removed from the cluster that the client still
// had in its endpoint list: another member can answer the same request.
func IsMemberStopping(err error) bool {
	if err == nil {
		return false
	}
	desc := errorDesc(err)
	return desc == descRaftStopped || desc == descServerStopped
}

// IsMemberNotFound reports whether the member named in a request no longer
// exists. For a removal this means the work is done.
func IsMemberNotFound(err error) bool {
	return err != nil && errorDesc(err) == errorDesc(rpctypes.ErrGRPCMemberNotFound)
}

// IsCompacted reports whether a compaction was refused because the
// revision is compacted already: the work is done.
func IsCompacted(err error) bool {
	return err != nil && errorDesc(err) == errorDesc(rpctypes.ErrGRPCCompacted)
}

// IsPeerURLExists reports whether an add was refused because a member with
// that peer URL is already in the cluster.
func IsPeerURLExists(err error) bool {
	return err != nil && errorDesc(err) == errorDesc(rpctypes.ErrGRPCPeerURLExist)
}

// errorDesc finds the server's description anywhere in err's chain, so that
// errors wrapped with %w by callers still classify. It looks at each link
// itself rather than through status.FromError, which would answer with the
// whole wrapped text.
func errorDesc(err error) string {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if ee, ok := e.(rpctypes.EtcdError); ok {
			return ee.Error()
		}
		if gs, ok := e.(interface{ GRPCStatus() *status.Status }); ok {
			return gs.GRPCStatus().Message()
		}
	}
	return err.Error()
}

func errorCode(err error) codes.Code {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if ee, ok := e.(rpctypes.EtcdError); ok {
			return ee.Code()
		}
		if gs, ok := e.(interface{ GRPCStatus() *status.Status }); ok {
			return gs.GRPCStatus().Code()
		}
	}
	return codes.Unknown
}
