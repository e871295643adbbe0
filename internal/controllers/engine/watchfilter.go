package engine

import (
	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cluster-api/util/labels"
	"sigs.k8s.io/cluster-api/util/predicates"
	"sigs.k8s.io/controller-runtime/pkg/builder"
)

// WatchFilter is qcp-manager's --watch-filter, as the clusterctl provider
// contract defines it: when set, the manager reconciles only objects whose
// cluster.x-k8s.io/watch-filter label has this value, so that several
// managers can share a management cluster. Empty means every object.
type WatchFilter string

// For is the predicate of a controller's own kind: events of objects the
// filter leaves out are dropped before they are queued.
func (f WatchFilter) For(scheme *runtime.Scheme, log logr.Logger) builder.Predicates {
	return builder.WithPredicates(predicates.ResourceHasFilterLabel(scheme, log, string(f)))
}

// Admits reports whether the manager reconciles o. A reconciler checks it
// too, since wake-ups mapped from other kinds (Machines, Secrets) reach it
// past For's predicate.
func (f WatchFilter) Admits(o metav1.Object) bool {
	return f == "" || labels.HasWatchLabel(o, string(f))
}
