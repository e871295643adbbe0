package etcd

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrorClassification(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("adding learner https://127.0.0.1:2380: %w", err) }
	cases := []struct {
		name                   string
		err                    error
		retryable, notLearner  bool
		notFound, peerURLExist bool
		refused                bool // certainly not applied
		learnerRefusal         bool
		stopping               bool // another member can answer
	}{
		{name: "nil", err: nil},
		{name: "unhealthy cluster (client form)", err: rpctypes.ErrUnhealthy, retryable: true, refused: true},
		{name: "unhealthy cluster (gRPC form, wrapped)", err: wrap(rpctypes.ErrGRPCUnhealthy), retryable: true, refused: true},
		{name: "learner not in sync", err: wrap(rpctypes.ErrMemberLearnerNotReady), retryable: true},
		{name: "too many learners", err: rpctypes.ErrTooManyLearners, retryable: true, refused: true},
		{name: "not leader", err: wrap(rpctypes.ErrNotLeader), retryable: true},
		{name: "leader changed", err: rpctypes.ErrLeaderChanged, retryable: true},
		{name: "no leader", err: rpctypes.ErrGRPCNoLeader, retryable: true},
		{name: "no leader named in the statuses", err: fmt.Errorf("moving leadership: %w", ErrNoLeaderNamed), retryable: true},
		{name: "request timed out", err: rpctypes.ErrTimeout, retryable: true},
		{name: "not enough started members", err: rpctypes.ErrMemberNotEnoughStarted, retryable: true, refused: true},
		{name: "raft proposal dropped", err: wrap(status.Error(codes.Unknown, "raft proposal dropped")), retryable: true},
		{name: "member shutting down: raft stopped", err: wrap(status.Error(codes.Unknown, "raft: stopped")), retryable: true, stopping: true},
		{name: "member shutting down: server stopped", err: wrap(rpctypes.ErrGRPCStopped), retryable: true, stopping: true},
		{name: "transport unavailable", err: status.Error(codes.Unavailable, "connection error: connect: connection refused"), retryable: true},
		{name: "gRPC deadline", err: status.Error(codes.DeadlineExceeded, "context deadline exceeded"), retryable: true},
		{name: "caller deadline", err: wrap(context.DeadlineExceeded), retryable: true},
		{name: "caller cancelled", err: wrap(context.Canceled)},
		// Same prefix as "not in sync", opposite meaning: the member already votes.
		{name: "member not learner", err: wrap(rpctypes.ErrMemberNotLearner), notLearner: true},
		{name: "member not found", err: rpctypes.ErrMemberNotFound, notFound: true},
		{name: "peer URL exists", err: wrap(rpctypes.ErrGRPCPeerURLExist), peerURLExist: true},
		{name: "member ID exists", err: rpctypes.ErrMemberExist},
		{name: "bad transferee", err: rpctypes.ErrBadLeaderTransferee},
		{name: "permission denied", err: rpctypes.ErrPermissionDenied},
		{name: "plain error", err: errors.New("boom")},
		{name: "rpc not supported for learner (etcd v3.5)", err: wrap(rpctypes.ErrGRPCNotSupportedForLearner), learnerRefusal: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := IsRetryable(c.err); got != c.retryable {
				t.Errorf("IsRetryable(%v) = %v, want %v", c.err, got, c.retryable)
			}
			if got := IsMemberNotLearner(c.err); got != c.notLearner {
				t.Errorf("IsMemberNotLearner(%v) = %v, want %v", c.err, got, c.notLearner)
			}
			if got := IsMemberNotFound(c.err); got != c.notFound {
				t.Errorf("IsMemberNotFound(%v) = %v, want %v", c.err, got, c.notFound)
			}
			if got := IsLearnerRefusal(c.err); got != c.learnerRefusal {
				t.Errorf("IsLearnerRefusal(%v) = %v, want %v", c.err, got, c.learnerRefusal)
			}
			if got := IsPeerURLExists(c.err); got != c.peerURLExist {
				t.Errorf("IsPeerURLExists(%v) = %v, want %v", c.err, got, c.peerURLExist)
			}
			if got := IsRefused(c.err); got != c.refused {
				t.Errorf("IsRefused(%v) = %v, want %v", c.err, got, c.refused)
			}
			if got := IsMemberStopping(c.err); got != c.stopping {
				t.Errorf("IsMemberStopping(%v) = %v, want %v", c.err, got, c.stopping)
			}
		})
	}
}
