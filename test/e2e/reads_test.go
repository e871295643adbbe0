package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
)

// Waits read the objects they poll from a cache. A condition checked every
// half second against the management API server made most of its reads: in
// TestCreateAndScale and TestFrozenMachines side by side, the scenarios'
// GETs of control planes and Machines and LISTs of Machines were 62 % of
// its requests (9.3 a second), and serving the GETs 16 % of its CPU, each a
// read of etcd and a decoding of what it returned (docs/measurements.md,
// stop 65). A cache costs it one watch per kind for the whole package.
//
// Only a wait's conditions read from it (eventually and holds give them a
// context that says so, forWait). A condition that reads a state a moment
// old fails and is checked again half a second later, so the cache's lag
// delays a wait and changes nothing else, but in two cases, each handled:
//   - after a scenario's own write, a wait must not see the state before it
//     (a spec changed, then "observedGeneration caught up" read off the old
//     object). The scenario's client records the resourceVersion each write
//     of a cached kind returned (writeFence); a read of that kind waits
//     until the cache has delivered it, or reads live;
//   - a condition that compares two kinds read one after the other, whose
//     informers may stand at different points, reads live (liveReads).

// cachedKinds are the kinds waits read from the cache.
var cachedKinds = []client.Object{
	&controlplanev1.QuorumControlPlane{}, &clusterv1.Machine{}, &clusterv1.Cluster{}, &etcdv1.EtcdCluster{},
}

// cachedKind is obj's kind (a list's: its items'), and whether it is one
// of cachedKinds, typed or not.
func cachedKind(obj runtime.Object, scheme *runtime.Scheme) (schema.GroupVersionKind, bool) {
	gvk, err := apiutil.GVKForObject(obj, scheme)
	if err != nil {
		return gvk, false
	}
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	for _, k := range cachedKinds {
		if kk, err := apiutil.GVKForObject(k, scheme); err == nil && kk == gvk {
			return gvk, true
		}
	}
	return gvk, false
}

// resourceVersion is obj's resourceVersion as a number: for etcd storage,
// the revision of the object's last change.
func resourceVersion(obj client.Object) (uint64, bool) {
	rv, err := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	return rv, err == nil
}

// waitReadsKey marks a context whose reads of the cached kinds may come
// from the management cluster's cache.
type waitReadsKey struct{}

// forWait is ctx with cached reads allowed, for a wait's condition.
func forWait(ctx context.Context) context.Context {
	return context.WithValue(ctx, waitReadsKey{}, true)
}

// liveReads is ctx with cached reads not allowed, for a condition whose
// reads must all be of now, such as one that compares two kinds.
func liveReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, waitReadsKey{}, false)
}

// reader is what s reads with in ctx: the management cluster's cache for
// the cached kinds in a wait's condition, the live client otherwise.
func (s *scenario) reader(ctx context.Context) client.Reader {
	if on, _ := ctx.Value(waitReadsKey{}).(bool); !on {
		return s.c
	}
	r, err := s.mgmt.waitReader(ctx)
	if err != nil {
		// A cache that cannot start leaves the wait on live reads, which
		// are right, only dearer.
		s.t.Logf("reading live: %v", err)
		return s.c
	}
	r.live = s.c
	return r
}

// readCache is a management cluster's cache for waits, started at its
// first use and stopped with the cluster, the fence its scenarios' writes
// set, and what the cache has delivered of each kind.
type readCache struct {
	mu     sync.Mutex
	cache  cache.Cache
	cancel context.CancelFunc
	done   chan struct{}
	fence  *writeFence
	// seen is, per kind, the highest resourceVersion the cache delivered.
	seen map[schema.GroupVersionKind]uint64
	// changed is closed, and replaced, whenever seen moves.
	changed chan struct{}
}

// writes is m's write fence.
func (m *management) writes() *writeFence {
	m.reads.mu.Lock()
	defer m.reads.mu.Unlock()
	if m.reads.fence == nil {
		m.reads.fence = &writeFence{written: map[schema.GroupVersionKind]uint64{}, pending: map[pendingWrite]time.Time{}}
	}
	return m.reads.fence
}

// fenced is c, with its writes of the cached kinds recorded in m's fence.
func (m *management) fenced(c client.Client) client.Client {
	return fencedClient{Client: c, fence: m.writes()}
}

// waitReader is a reader of m's cache, started at the first call.
func (m *management) waitReader(ctx context.Context) (fencedReader, error) {
	fence := m.writes()
	rc := &m.reads
	rc.mu.Lock()
	if rc.cache == nil {
		if err := rc.start(m); err != nil {
			rc.mu.Unlock()
			return fencedReader{}, err
		}
	}
	c := rc.cache
	rc.mu.Unlock()
	if !c.WaitForCacheSync(ctx) {
		return fencedReader{}, fmt.Errorf("the management cluster's cache did not sync: %w", ctx.Err())
	}
	return fencedReader{rc: rc, fence: fence, scheme: m.env.Scheme}, nil
}

// start starts the cache, with an informer per cached kind that records
// what it delivers; rc.mu is held.
func (rc *readCache) start(m *management) error {
	c, err := cache.New(m.env.Config, cache.Options{
		Scheme:            m.env.Scheme,
		DefaultNamespaces: map[string]cache.Config{ns: {}},
	})
	if err != nil {
		return fmt.Errorf("the management cluster's cache: %w", err)
	}
	rc.seen, rc.changed = map[schema.GroupVersionKind]uint64{}, make(chan struct{})
	for _, obj := range cachedKinds {
		gvk, err := apiutil.GVKForObject(obj, m.env.Scheme)
		if err != nil {
			return err
		}
		inf, err := c.GetInformer(context.Background(), obj, cache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("the management cluster's cache of %s: %w", gvk.Kind, err)
		}
		saw := func(o any, gone bool) {
			if final, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = final.Obj
			}
			if co, ok := o.(client.Object); ok {
				rc.saw(gvk, co, gone)
			}
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { saw(o, false) },
			UpdateFunc: func(_, o any) { saw(o, false) },
			DeleteFunc: func(o any) { saw(o, true) },
		}); err != nil {
			return err
		}
	}
	cctx, cancel := context.WithCancel(context.Background())
	rc.cache, rc.cancel, rc.done = c, cancel, make(chan struct{})
	go func() {
		defer close(rc.done)
		_ = c.Start(cctx) // returns when cctx ends
	}()
	return nil
}

// saw records that the cache delivered obj of kind gvk (gone: its
// deletion).
func (rc *readCache) saw(gvk schema.GroupVersionKind, obj client.Object, gone bool) {
	if gone || !obj.GetDeletionTimestamp().IsZero() {
		rc.fence.shown(pendingWrite{gvk, client.ObjectKeyFromObject(obj)})
	}
	rv, ok := resourceVersion(obj)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if !ok || rv <= rc.seen[gvk] {
		return
	}
	rc.seen[gvk] = rv
	close(rc.changed)
	rc.changed = make(chan struct{})
}

// caughtUp waits, up to fenceWait, until the cache has delivered kind gvk
// up to resourceVersion rv.
func (rc *readCache) caughtUp(ctx context.Context, gvk schema.GroupVersionKind, rv uint64) bool {
	deadline := time.NewTimer(fenceWait)
	defer deadline.Stop()
	for {
		rc.mu.Lock()
		seen, changed := rc.seen[gvk], rc.changed
		rc.mu.Unlock()
		if seen >= rv {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// fenceWait bounds how long a cached read waits for the cache to deliver
// a scenario's write before it reads live instead: a watch event arrives
// in milliseconds, but not always on a starved host.
const fenceWait = 2 * time.Second

// stopReads stops m's cache, if it started, before its API server goes.
func (m *management) stopReads() {
	rc := &m.reads
	rc.mu.Lock()
	cancel, done := rc.cancel, rc.done
	rc.cancel = nil
	rc.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		fmt.Println("the management cluster's cache did not stop within 30 s")
	}
}

// pendingWrite is an object a scenario wrote whose result the cache has not
// shown yet: deleted, or written without a resourceVersion.
type pendingWrite struct {
	gvk schema.GroupVersionKind
	key client.ObjectKey
}

// writeFence is what a management cluster's scenarios wrote to the cached
// kinds: per kind, the highest resourceVersion a write returned, and the
// writes the cache has not shown yet.
type writeFence struct {
	mu      sync.Mutex
	written map[schema.GroupVersionKind]uint64
	pending map[pendingWrite]time.Time
}

// wrote records a write that returned obj.
func (f *writeFence) wrote(gvk schema.GroupVersionKind, obj client.Object) {
	rv, ok := resourceVersion(obj)
	if !ok {
		// No cached read can be shown to follow it.
		f.unshown(pendingWrite{gvk, client.ObjectKeyFromObject(obj)})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.written[gvk] = max(f.written[gvk], rv)
}

// unshown records a write without a resourceVersion, such as a deletion:
// until the cache shows the object deleting or gone, reads of its kind are
// live, for unshownFor at most (a request that changed nothing shows
// nothing).
func (f *writeFence) unshown(d pendingWrite) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[d] = time.Now()
}

// unshownFor bounds how long a write the cache has not shown keeps its
// kind's reads live.
const unshownFor = 30 * time.Second

func (f *writeFence) shown(d pendingWrite) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pending, d)
}

// need is the resourceVersion the cache must have delivered for a read of
// gvk to come from it, and whether a write it has not shown keeps the
// kind's reads live.
func (f *writeFence) need(gvk schema.GroupVersionKind) (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pending := false
	for d, at := range f.pending {
		switch {
		case time.Since(at) > unshownFor:
			delete(f.pending, d)
		case d.gvk == gvk:
			pending = true
		}
	}
	return f.written[gvk], pending
}

// fencedReader reads the cached kinds in the scenarios' namespace from the
// cache once it has delivered the scenarios' writes of them, and
// everything else live.
type fencedReader struct {
	rc     *readCache
	fence  *writeFence
	scheme *runtime.Scheme
	live   client.Reader
}

// fromCache says whether a read of obj (an object or a list) in namespace
// may come from the cache: typed objects only, as an unstructured one
// would start an informer of its own.
func (r fencedReader) fromCache(ctx context.Context, obj runtime.Object, namespace string) bool {
	gvk, ok := cachedKind(obj, r.scheme)
	if _, unstructured := obj.(runtime.Unstructured); !ok || unstructured || namespace != ns {
		return false
	}
	need, deleting := r.fence.need(gvk)
	return !deleting && (need == 0 || r.rc.caughtUp(ctx, gvk, need))
}

func (r fencedReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if r.fromCache(ctx, obj, key.Namespace) {
		return r.rc.cache.Get(ctx, key, obj, opts...)
	}
	return r.live.Get(ctx, key, obj, opts...)
}

func (r fencedReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	if r.fromCache(ctx, list, lo.Namespace) {
		return r.rc.cache.List(ctx, list, opts...)
	}
	return r.live.List(ctx, list, opts...)
}

// fencedClient is a scenario's client: it records its writes of the cached
// kinds in the fence, so that waits after them see them.
type fencedClient struct {
	client.Client
	fence *writeFence
}

// wrote records a write that returned obj, if of a cached kind in the
// scenarios' namespace.
func (c fencedClient) wrote(obj client.Object) {
	if gvk, ok := c.fenced(obj); ok {
		c.fence.wrote(gvk, obj)
	}
}

// fenced is obj's kind, and whether a write of obj fences the cache's
// reads: typed or not, in the scenarios' namespace.
func (c fencedClient) fenced(obj client.Object) (schema.GroupVersionKind, bool) {
	gvk, ok := cachedKind(obj, c.Scheme())
	return gvk, ok && obj.GetNamespace() == ns
}

func (c fencedClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := c.Client.Create(ctx, obj, opts...)
	if err == nil {
		c.wrote(obj)
	}
	return err
}

func (c fencedClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	err := c.Client.Update(ctx, obj, opts...)
	if err == nil {
		c.wrote(obj)
	}
	return err
}

func (c fencedClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	err := c.Client.Patch(ctx, obj, patch, opts...)
	if err == nil {
		c.wrote(obj)
	}
	return err
}

func (c fencedClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	err := c.Client.Delete(ctx, obj, opts...)
	if gvk, ok := c.fenced(obj); ok && err == nil {
		c.fence.unshown(pendingWrite{gvk, client.ObjectKeyFromObject(obj)})
	}
	return err
}

func (c fencedClient) Status() client.SubResourceWriter {
	return fencedSubResource{SubResourceClient: c.Client.SubResource("status"), c: c}
}

func (c fencedClient) SubResource(name string) client.SubResourceClient {
	return fencedSubResource{SubResourceClient: c.Client.SubResource(name), c: c}
}

// fencedSubResource records the writes of a subresource: the object's, or
// the body's a write was given (a scale's resourceVersion is its object's).
type fencedSubResource struct {
	client.SubResourceClient
	c fencedClient
}

func (s fencedSubResource) wrote(obj, body client.Object) {
	if gvk, ok := s.c.fenced(obj); ok {
		if body == nil {
			body = obj
		}
		s.c.fence.wrote(gvk, body)
	}
}

func (s fencedSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	err := s.SubResourceClient.Update(ctx, obj, opts...)
	if err == nil {
		uo := &client.SubResourceUpdateOptions{}
		uo.ApplyOptions(opts)
		s.wrote(obj, uo.SubResourceBody)
	}
	return err
}

func (s fencedSubResource) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	err := s.SubResourceClient.Patch(ctx, obj, patch, opts...)
	if err == nil {
		po := &client.SubResourcePatchOptions{}
		po.ApplyOptions(opts)
		s.wrote(obj, po.SubResourceBody)
	}
	return err
}

// TestWaitReadsSeeTheScenariosWrites writes a Cluster through a scenario's
// client and reads it back at once the way a wait does: every read shows
// the write before it, then the deletion. Read from the cache without the
// fence, the reads right after a write show the state before it.
func TestWaitReadsSeeTheScenariosWrites(t *testing.T) {
	mgmt := requireShared(t)
	s := &scenario{t: t, mgmt: mgmt, c: mgmt.fenced(mgmt.env.Client), name: "fence"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Paused, so that nothing but the test writes it; its infrastructure
	// does not exist.
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}, Spec: clusterv1.ClusterSpec{
		Paused:            ptr.To(true),
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "ProcessCluster", Name: s.name},
	}}
	s.create(ctx, cluster)
	wait := forWait(ctx)
	if _, ok := s.reader(wait).(fencedReader); !ok {
		t.Fatalf("a wait reads with %T, not the cache", s.reader(wait))
	}
	gvk, ok := cachedKind(cluster, mgmt.env.Scheme)
	if !ok {
		t.Fatalf("%s is not a kind waits read from the cache", gvk)
	}
	for i := range 20 {
		before := cluster.DeepCopy()
		metav1.SetMetaDataAnnotation(&cluster.ObjectMeta, "e2e.qcp.dev/write", strconv.Itoa(i))
		if err := s.c.Patch(ctx, cluster, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
		if need, _ := mgmt.writes().need(gvk); need < mustResourceVersion(t, cluster) {
			t.Fatalf("write %d returned resourceVersion %s; the fence holds reads of %s only to %d", i, cluster.ResourceVersion, gvk.Kind, need)
		}
		var got clusterv1.Cluster
		if err := s.reader(wait).Get(wait, client.ObjectKeyFromObject(cluster), &got); err != nil {
			t.Fatal(err)
		}
		if v := got.Annotations["e2e.qcp.dev/write"]; v != strconv.Itoa(i) {
			t.Fatalf("a wait's read right after write %d shows write %q", i, v)
		}
	}
	if err := s.c.Delete(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	var got clusterv1.Cluster
	err := s.reader(wait).Get(wait, client.ObjectKeyFromObject(cluster), &got)
	if err == nil && got.DeletionTimestamp.IsZero() {
		t.Fatalf("a wait's read right after the deletion shows the Cluster neither deleting nor gone")
	}
	if err != nil && !isNotFound(err) {
		t.Fatal(err)
	}
}

func mustResourceVersion(t *testing.T, obj client.Object) uint64 {
	t.Helper()
	rv, ok := resourceVersion(obj)
	if !ok {
		t.Fatalf("resourceVersion %q of %s is not a number", obj.GetResourceVersion(), obj.GetName())
	}
	return rv
}
