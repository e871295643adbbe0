package engine

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

func TestWatchFilterAdmits(t *testing.T) {
	labelled := func(v string) *metav1.ObjectMeta {
		return &metav1.ObjectMeta{Labels: map[string]string{clusterv1.WatchLabel: v}}
	}
	for _, tc := range []struct {
		filter WatchFilter
		obj    *metav1.ObjectMeta
		want   bool
	}{
		{"", &metav1.ObjectMeta{}, true},
		{"", labelled("a"), true},
		{"a", labelled("a"), true},
		{"a", labelled("b"), false},
		{"a", &metav1.ObjectMeta{}, false},
		{"a", labelled(""), false},
	} {
		if got := tc.filter.Admits(tc.obj); got != tc.want {
			t.Errorf("filter %q admits labels %v: %v, want %v", tc.filter, tc.obj.Labels, got, tc.want)
		}
	}
}
