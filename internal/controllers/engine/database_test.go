package engine

import (
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/quorum"
)

const mib = 1 << 20

// TestMemberDatabasesInStatus checks each member's database in status:
// sizes in whole mebibytes rounded up, the quota a member reports winning
// over the configured one, the configured one for a member that reports
// none (etcd 3.5), no quota when it is off, and nothing for a member that
// did not answer.
func TestMemberDatabasesInStatus(t *testing.T) {
	members := []quorum.Member{
		{ID: 0xa, DBSize: 20*mib + 1, DBSizeInUse: 5 * mib},                      // etcd 3.5: no quota reported
		{ID: 0xb, DBSize: 8 * mib, DBSizeInUse: 3*mib + 5, DBSizeQuota: 1 << 30}, // etcd 3.6
		{ID: 0xc}, // did not answer
	}
	for _, tc := range []struct {
		name       string
		configured int64
		want       map[string]string // ID: size/inUse/quota
	}{
		{"a quota configured", 64 * mib, map[string]string{"a": "21Mi/5Mi/64Mi", "b": "8Mi/4Mi/1Gi", "c": ""}},
		{"the quota off", math.MaxInt64, map[string]string{"a": "21Mi/5Mi/", "b": "8Mi/4Mi/1Gi", "c": ""}},
		{"the quota unknown", 0, map[string]string{"a": "21Mi/5Mi/", "b": "8Mi/4Mi/1Gi", "c": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := &Observation{Members: members, State: quorum.State{QuotaBackendBytes: tc.configured}}
			got := map[string]string{}
			for _, s := range MemberStatuses(obs) {
				got[s.ID] = describeDatabase(s.Database)
			}
			for id, want := range tc.want {
				if got[id] != want {
					t.Errorf("member %s: database %q, want %q", id, got[id], want)
				}
			}
		})
	}
}

func describeDatabase(db *controlplanev1.EtcdDatabaseStatus) string {
	if db == nil {
		return ""
	}
	quota := ""
	if db.Quota != nil {
		quota = db.Quota.String()
	}
	return db.Size.String() + "/" + db.InUse.String() + "/" + quota
}

// TestMemberDatabaseMetrics checks the per-member gauges: exact bytes and
// the revision, the configured quota for a member that reports none, no
// series for a member that did not answer, and a removed member's series
// gone at the next observation.
func TestMemberDatabaseMetrics(t *testing.T) {
	m := NewMetrics("qcp_test", "Test")
	owner := &controlplanev1.QuorumControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "metrics-owner"}}
	obs := &Observation{
		State: quorum.State{QuotaBackendBytes: 64 * mib},
		Members: []quorum.Member{
			{ID: 0xa, DBSize: 20*mib + 1, DBSizeInUse: 5 * mib, Revision: 1234},
			{ID: 0xb, DBSize: 8 * mib, DBSizeInUse: 3 * mib, DBSizeQuota: 1 << 30, Revision: 1233},
			{ID: 0xc},
		},
	}
	m.ObserveState(owner, obs)
	for _, c := range []struct {
		what   string
		member string
		got    float64
		want   float64
	}{
		{"size", "a", value(m.dbSize.WithLabelValues("ns", "metrics-owner", "a")), 20*mib + 1},
		{"in use", "a", value(m.dbSizeInUse.WithLabelValues("ns", "metrics-owner", "a")), 5 * mib},
		{"quota", "a", value(m.dbSizeQuota.WithLabelValues("ns", "metrics-owner", "a")), 64 * mib},
		{"quota", "b", value(m.dbSizeQuota.WithLabelValues("ns", "metrics-owner", "b")), 1 << 30},
		{"revision", "b", value(m.revision.WithLabelValues("ns", "metrics-owner", "b")), 1233},
	} {
		if c.got != c.want {
			t.Errorf("member %s's %s: %v, want %v", c.member, c.what, c.got, c.want)
		}
	}
	if n := count(m.dbSize); n != 2 {
		t.Errorf("%d size series, want 2: one per member that answered", n)
	}
	obs.Members = obs.Members[1:] // a removed
	m.ObserveState(owner, obs)
	if n := count(m.revision); n != 1 {
		t.Errorf("%d revision series after a member left, want 1", n)
	}
}

// value is g's current value.
func value(g prometheus.Gauge) float64 {
	var d dto.Metric
	if err := g.Write(&d); err != nil {
		return math.NaN()
	}
	return d.GetGauge().GetValue()
}

// count is how many series c has.
func count(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	return len(ch)
}
