package engine

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/qcp-dev/qcp/internal/quorum"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// addressed is a machine named name at ip, with the member ID record id
// (none if 0).
func addressed(name, ip string, id uint64) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if ip != "" {
		m.Status.Addresses = clusterv1.MachineAddresses{{Type: clusterv1.MachineInternalIP, Address: ip}}
	}
	if id != 0 {
		SetRecord(m, MemberIDAnnotation, FormatMemberID(id))
	}
	return m
}

func peer(ip string) string { return "https://" + net.JoinHostPort(ip, "2380") }

func TestMemberOn(t *testing.T) {
	const (
		oldIP = "10.0.0.1"
		newIP = "10.0.0.2"
	)
	started := quorum.Member{ID: 0x11, Name: "old", PeerURL: peer(oldIP), Healthy: true}
	learner := quorum.Member{ID: 0x22, Learner: true, PeerURL: peer(newIP)}
	for _, tc := range []struct {
		name     string
		members  []quorum.Member
		machines []*clusterv1.Machine
		on       string // the machine asked about
		want     uint64 // 0: no member
		refused  string // part of the reason, if refused
	}{
		{name: "by recorded ID", members: []quorum.Member{started},
			machines: []*clusterv1.Machine{addressed("elsewhere", newIP, 0x11)}, on: "elsewhere", want: 0x11},
		{name: "by name", members: []quorum.Member{started},
			machines: []*clusterv1.Machine{addressed("old", oldIP, 0)}, on: "old", want: 0x11},
		{name: "an unstarted learner by peer URL", members: []quorum.Member{started, learner},
			machines: []*clusterv1.Machine{addressed("new", newIP, 0)}, on: "new", want: 0x22},
		{name: "a started member whose peer URL equals a new machine's address is not mapped to it",
			members:  []quorum.Member{started},
			machines: []*clusterv1.Machine{addressed("new", oldIP, 0)}, on: "new"},
		{name: "a machine with a record is not mapped by address to another's learner",
			members:  []quorum.Member{started, learner},
			machines: []*clusterv1.Machine{addressed("gone", newIP, 0x33), addressed("new", newIP, 0)}, on: "gone"},
		{name: "a machine with a record does not make the learner's address ambiguous",
			members:  []quorum.Member{started, learner},
			machines: []*clusterv1.Machine{addressed("gone", newIP, 0x33), addressed("new", newIP, 0)}, on: "new", want: 0x22},
		{name: "an ambiguous peer-URL match is refused: two machines at the learner's address",
			members:  []quorum.Member{started, learner},
			machines: []*clusterv1.Machine{addressed("a", newIP, 0), addressed("b", newIP, 0)}, on: "a", refused: "is also that of machine b"},
		{name: "an ambiguous peer-URL match is refused: two unstarted members at one address",
			members:  []quorum.Member{learner, {ID: 0x44, Learner: true, PeerURL: peer(newIP)}},
			machines: []*clusterv1.Machine{addressed("new", newIP, 0)}, on: "new", refused: "members 22, 44 all match it by peer URL"},
		{name: "an ambiguous name match is refused",
			members:  []quorum.Member{started, {ID: 0x55, Name: "old", PeerURL: peer(newIP)}},
			machines: []*clusterv1.Machine{addressed("old", oldIP, 0)}, on: "old", refused: "members 11, 55 all match it by name"},
		{name: "the recorded ID wins over a name shared by two members",
			members:  []quorum.Member{started, {ID: 0x55, Name: "old", PeerURL: peer(newIP)}},
			machines: []*clusterv1.Machine{addressed("old", oldIP, 0x55)}, on: "old", want: 0x55},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &Observation{Members: tc.members, Machines: tc.machines}
			m := o.Machine(tc.on)
			mb, ok, refused := o.FindMember(m)
			switch {
			case tc.want == 0 && ok:
				t.Errorf("machine %s mapped to member %x, want none", tc.on, mb.ID)
			case tc.want != 0 && (!ok || mb.ID != tc.want):
				t.Errorf("machine %s mapped to member %x (found %t, refused %q), want %x", tc.on, mb.ID, ok, refused, tc.want)
			}
			if tc.refused == "" && refused != "" || !strings.Contains(refused, tc.refused) {
				t.Errorf("refused = %q, want it to say %q", refused, tc.refused)
			}
			if on, onOK := o.MemberOn(m); on.ID != mb.ID || onOK != ok {
				t.Errorf("MemberOn = %x, %t; FindMember = %x, %t", on.ID, onOK, mb.ID, ok)
			}
			if tc.refused != "" && !strings.Contains(strings.Join(o.RefusedMatches(), "\n"), "Machine "+tc.on+": "+refused) {
				t.Errorf("RefusedMatches %q do not name machine %s", o.RefusedMatches(), tc.on)
			}
		})
	}
}

// TestMemberOnRealMemberList maps machines to the member list of a real
// etcd: a started member and a learner added at an address nobody serves
// yet. A new machine at the started member's address gets nothing, and
// KeepRecords records nothing on it; the learner's address, held by one
// machine, maps to the learner, and held by two, to neither.
func TestMemberOnRealMemberList(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, ps, cli := testkit.StartEtcdCluster(ctx, t, "memberon", 1)
	learnerIP := testkit.ReserveAddress(t)
	added, _, err := cli.AddLearner(ctx, peer(learnerIP))
	if err != nil {
		t.Fatal(err)
	}
	members, err := cli.ObserveMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	startedIP := ps[0].IP.String()

	o := &Observation{Members: members, Machines: []*clusterv1.Machine{addressed("reused", startedIP, 0), addressed("joining", learnerIP, 0)}}
	if mb, ok := o.MemberOn(o.Machine("reused")); ok {
		t.Errorf("new machine at started member %s's address mapped to member %x", ps[0].Name, mb.ID)
	}
	reused := o.Machine("reused")
	KeepRecords(reused, o, time.Now())
	if id, ok := reused.Annotations[MemberIDAnnotation]; ok {
		t.Errorf("KeepRecords recorded member %s on the new machine at a reused address", id)
	}
	if mb, ok := o.MemberOn(o.Machine("joining")); !ok || mb.ID != added.ID {
		t.Errorf("the machine at the learner's address mapped to %x (%t), want learner %x", mb.ID, ok, added.ID)
	}

	o.Machines = append(o.Machines, addressed("twin", learnerIP, 0))
	for _, name := range []string{"joining", "twin"} {
		if mb, ok := o.MemberOn(o.Machine(name)); ok {
			t.Errorf("machine %s mapped to learner %x although machines joining and twin share its address", name, mb.ID)
		}
	}
	if got := o.RefusedMatches(); len(got) != 2 {
		t.Errorf("RefusedMatches = %q, want one for each of joining and twin", got)
	}
}
