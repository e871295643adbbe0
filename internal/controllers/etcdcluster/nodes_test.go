package etcdcluster

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// TestNodeRegistrationDue: a machine's agent is sent its registration
// when it has none recorded, when the endpoint or the trust changed (the
// digest), and when its certificate is due; not otherwise.
func TestNodeRegistrationDue(t *testing.T) {
	nm := &nodeMaterial{digest: "d1"}
	renewAt := t0.Add(time.Hour).Format(time.RFC3339)
	for _, tc := range []struct {
		name, recorded string
		now            time.Time
		want           bool
	}{
		{"none recorded", "", t0, true},
		{"sent, not due", "d1/" + renewAt, t0, false},
		{"the certificate due", "d1/" + renewAt, t0.Add(time.Hour), true},
		{"another endpoint or trust", "d0/" + renewAt, t0, true},
		{"a record that does not parse", "d1/yesterday", t0, true},
	} {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
		if tc.recorded != "" {
			m.Annotations[NodeRegistrationAnnotation] = tc.recorded
		}
		if got := nm.registrationDue(m, tc.now); got != tc.want {
			t.Errorf("%s: due %v, want %v", tc.name, got, tc.want)
		}
	}
}
