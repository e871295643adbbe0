package agent

import (
	"strings"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
)

func TestJoinClusterRefusesAnOldMemberAtItsAddress(t *testing.T) {
	const myPeer = "https://10.0.0.2:2380"
	voter := &etcdserverpb.Member{ID: 0x11, Name: "m0", PeerURLs: []string{"https://10.0.0.1:2380"}}
	for _, tc := range []struct {
		name        string
		members     []*etcdserverpb.Member
		wantInitial string
		wantWaiting string
	}{
		{name: "not added yet", members: []*etcdserverpb.Member{voter}, wantWaiting: "to be added"},
		{name: "added as an unstarted learner",
			members:     []*etcdserverpb.Member{voter, {ID: 0x22, PeerURLs: []string{myPeer}, IsLearner: true}},
			wantInitial: "m0=https://10.0.0.1:2380,new=" + myPeer},
		{name: "started under its own name (the agent restarted)",
			members:     []*etcdserverpb.Member{voter, {ID: 0x22, Name: "new", PeerURLs: []string{myPeer}}},
			wantInitial: "m0=https://10.0.0.1:2380,new=" + myPeer},
		{name: "an old machine's started member holds the address",
			members:     []*etcdserverpb.Member{voter, {ID: 0x33, Name: "gone", PeerURLs: []string{myPeer}}},
			wantWaiting: "etcd member gone (33), which holds this machine's peer URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			waiting, initial := joinCluster(tc.members, "new", myPeer)
			if initial != tc.wantInitial {
				t.Errorf("initial cluster = %q, want %q", initial, tc.wantInitial)
			}
			if tc.wantWaiting != "" && !strings.Contains(waiting, tc.wantWaiting) {
				t.Errorf("waiting for %q, want it to say %q", waiting, tc.wantWaiting)
			}
		})
	}
}
