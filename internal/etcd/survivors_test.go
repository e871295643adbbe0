package etcd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// TestSurvivorsOfAQuorumLoss kills two of three real members: the member
// list can no longer be read, and Survivors reads the one left on its own,
// with the membership it applied, which the planner judges as a loss.
func TestSurvivorsOfAQuorumLoss(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, ps, cli := testkit.StartEtcdCluster(ctx, t, "survivors", 3)
	endpoints := []string{ps[0].ClientURL(), ps[1].ClientURL(), ps[2].ClientURL()}
	if got := cli.Survivors(ctx, endpoints); len(got) != 3 {
		t.Fatalf("with every member up, %d answer on their own: %+v", len(got), got)
	}
	for _, p := range ps[1:] {
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	var got []quorum.Survivor
	if err := testkit.Eventually(ctx, 200*time.Millisecond, "the member list unreadable and one survivor", func(ctx context.Context) error {
		got = cli.Survivors(ctx, endpoints)
		if len(got) != 1 {
			return fmt.Errorf("%d survivors", len(got))
		}
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if _, err := cli.Members(lctx); err == nil {
			return fmt.Errorf("the member list can still be read")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s := got[0]
	if s.Name != ps[0].Name || s.PeerURL != ps[0].PeerURL() || s.AppliedIndex == 0 || s.Revision == 0 || len(s.View) != 3 {
		t.Errorf("survivor %+v: want %s at %s, with its applied index, revision and a view of 3 members", s, ps[0].Name, ps[0].PeerURL())
	}
	st := quorum.State{Desired: 3, MembersUnknown: true, Survivors: got, Bootstrapped: true}
	if !quorum.ShowsQuorumLoss(st) {
		t.Errorf("the planner does not take one survivor of three for a quorum loss")
	}
}
