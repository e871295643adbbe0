package testkit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/qcp-dev/qcp/internal/etcd"
)

// WriterOptions tune the traffic; zero values get defaults.
type WriterOptions struct {
	// Keys is how many keys are written, one worker per key (default 4).
	Keys int
	// Pause is the pause between one worker's operations (default 50 ms):
	// with 4 workers, write gaps resolved to tens of milliseconds. The
	// workers run closed loops, so the pause is what bounds their cost: at
	// 5 ms a 3-member cluster took a whole core (950 ms/s of etcd CPU
	// against 48 at rest, docs/measurements.md), whatever the rest of the
	// host needed.
	Pause time.Duration
	// OpTimeout bounds each request (default 2 s).
	OpTimeout time.Duration
	// Prefix namespaces the keys (default "/qcp-writer/").
	Prefix string
}

func (o WriterOptions) withDefaults() WriterOptions {
	if o.Keys == 0 {
		o.Keys = 4
	}
	if o.Pause == 0 {
		o.Pause = 50 * time.Millisecond
	}
	if o.OpTimeout == 0 {
		o.OpTimeout = 2 * time.Second
	}
	if o.Prefix == "" {
		o.Prefix = "/qcp-writer/"
	}
	return o
}

// Writer runs a steady stream of writes and reads against a cluster through
// the normal client, recording every operation for porcupine.
type Writer struct {
	opts   WriterOptions
	client *etcd.Client
	start  time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// gate is held for reading through each worker's put and get, and
	// for writing by Hold; release, set while it is, lets it go once.
	gate    sync.RWMutex
	release func()

	mu      sync.Mutex
	history []porcupine.Operation
	// unknown marks history entries whose outcome is unknown; their
	// return time is set to the end of the history at Stop.
	unknown []int
	acks    []time.Duration
	failed  int
	lastAck map[string]ackedWrite
	// unknownOf holds, per key, the writes of unknown outcome since the
	// last CheckKept: each may take effect at any time after its call,
	// after a later acknowledged write too.
	unknownOf map[string][]string
	stopped   bool
	// stalls are the writer's own scheduling delays, as WriteGaps.
	stalls []WriteGap
	// lostAtCheck are the acknowledged writes CheckKept found gone.
	lostAtCheck []string
}

type ackedWrite struct {
	value string
	at    time.Duration
}

// StartWriter starts the workers. cfg should list the cluster's current
// endpoints; the writer keeps them current by auto sync, as any client must.
func StartWriter(cfg etcd.Config, opts WriterOptions) (*Writer, error) {
	opts = opts.withDefaults()
	cfg.AutoSyncInterval = 500 * time.Millisecond
	cli, err := etcd.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("writer client: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &Writer{opts: opts, client: cli, start: time.Now(), cancel: cancel,
		lastAck: map[string]ackedWrite{}, unknownOf: map[string][]string{}}
	for i := range opts.Keys {
		w.wg.Add(1)
		go w.work(ctx, i)
	}
	w.wg.Add(1)
	go w.watchStalls(ctx)
	return w, nil
}

// stallTick is how often watchStalls asks to wake up.
const stallTick = 5 * time.Millisecond

// watchStalls records how late the writer's own process wakes up. A write
// gap as long as a stall that ended with it was, at least in part, the
// client waiting for a CPU, not the cluster: on a shared host the client
// competes with every machine.
func (w *Writer) watchStalls(ctx context.Context) {
	defer w.wg.Done()
	for ctx.Err() == nil {
		asked := time.Now()
		time.Sleep(stallTick)
		if late := time.Since(asked) - stallTick; late > stallTick {
			w.mu.Lock()
			w.stalls = append(w.stalls, WriteGap{Length: late, End: time.Since(w.start)})
			w.mu.Unlock()
		}
	}
}

func (w *Writer) now() int64 { return time.Since(w.start).Nanoseconds() }

// SetEndpoints points the writer at endpoints: a cluster restored from a
// backup onto new machines has none of the addresses auto sync knew.
func (w *Writer) SetEndpoints(endpoints ...string) { w.client.SetEndpoints(endpoints...) }

// Hold stops the workers, once their operations in flight end, until
// release is called. A scenario that loses a majority holds the writer from
// the loss to the end of the recovery and then reads back what was kept
// (CheckKept): a write after the recovery would overwrite a key whose
// acknowledged value the recovery gave up, and hide the loss from the
// final read. Stop releases a hold left on.
func (w *Writer) Hold() (release func()) {
	w.gate.Lock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.release = sync.OnceFunc(w.gate.Unlock)
	return w.release
}

// CheckKept reads every key back (each until a read succeeds or ctx ends)
// and returns the acknowledged writes whose values are gone, as Stop's
// LostWrites would; Stop reports them too. Call it while the writer is held.
func (w *Writer) CheckKept(ctx context.Context) []string {
	finals := w.readFinals(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	lost := w.lostWrites(finals)
	w.lostAtCheck = append(w.lostAtCheck, lost...)
	// What was read is what later reads are judged against: a loss is
	// reported once.
	for key, f := range finals {
		w.lastAck[key], w.unknownOf[key] = ackedWrite{value: f.value, at: time.Duration(f.ret)}, nil
	}
	return lost
}

// Acknowledged is how many writes the cluster has acknowledged so far.
func (w *Writer) Acknowledged() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acks)
}

// WaitAcknowledged waits until n more writes than now are acknowledged,
// or ctx ends; its error says how many were.
func (w *Writer) WaitAcknowledged(ctx context.Context, n int) error {
	want := w.Acknowledged() + n
	return Eventually(ctx, 20*time.Millisecond, fmt.Sprintf("%d more acknowledged writes", n), func(context.Context) error {
		if got := w.Acknowledged(); got < want {
			return fmt.Errorf("%d of %d acknowledged", got, want)
		}
		return nil
	})
}

func (w *Writer) work(ctx context.Context, worker int) {
	defer w.wg.Done()
	key := fmt.Sprintf("%sk%d", w.opts.Prefix, worker)
	for seq := 0; ctx.Err() == nil; seq++ {
		w.gate.RLock()
		w.put(ctx, worker, key, fmt.Sprintf("w%d-%d", worker, seq))
		w.get(ctx, worker, key)
		w.gate.RUnlock()
		select {
		case <-ctx.Done():
		case <-time.After(w.opts.Pause):
		}
	}
}

// put writes a unique value once. A failed write is not retried with the
// same value: the next iteration writes a new one. A write that may have
// been applied stays in the history with an open end, so porcupine may
// place it anywhere after its call.
func (w *Writer) put(ctx context.Context, worker int, key, value string) {
	call := w.now()
	octx, cancel := context.WithTimeout(ctx, w.opts.OpTimeout)
	_, err := w.client.Raw().Put(octx, key, value)
	cancel()
	ret := w.now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	op := porcupine.Operation{ClientId: worker, Input: kvInput{Put: true, Key: key, Value: value}, Call: call, Output: kvOutput{}, Return: ret}
	switch {
	case err == nil:
		w.recordAck(op, key, value)
	case ctx.Err() != nil:
		// Stopping: the request may or may not have been sent; not a
		// failure of the cluster.
		w.recordUnknown(op, key, value)
	case notApplied(err):
		w.failed++
	default:
		w.failed++
		w.recordUnknown(op, key, value)
	}
}

// recordAck records an acknowledged write. The writes of unknown outcome
// before it stay possible final values (lostWrites).
func (w *Writer) recordAck(op porcupine.Operation, key, value string) {
	w.history = append(w.history, op)
	w.acks = append(w.acks, time.Duration(op.Return))
	w.lastAck[key] = ackedWrite{value: value, at: time.Duration(op.Return)}
}

func (w *Writer) recordUnknown(op porcupine.Operation, key, value string) {
	w.unknown = append(w.unknown, len(w.history))
	w.history = append(w.history, op)
	w.unknownOf[key] = append(w.unknownOf[key], value)
}

// notApplied reports errors after which the write certainly did not take
// effect: the server refused it before proposing it to raft, or raft
// dropped the proposal (during a leader transfer). "database space
// exceeded" is not one: etcd's quota applier applies the put that crosses
// the quota and only then answers with that error (and members restarted
// with different quotas disagree on which put crosses it), so such a write
// may well be there. The NOSPACE scenario's first runs counted it as
// failed, and porcupine found the history not linearizable.
func notApplied(err error) bool {
	msg := err.Error()
	for _, s := range []string{"raft proposal dropped", "etcdserver: no leader", "rpc not supported for learner", "etcdserver: too many requests"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// get reads a key linearizably; a failed read changes nothing and is not
// recorded.
func (w *Writer) get(ctx context.Context, worker int, key string) {
	call := w.now()
	octx, cancel := context.WithTimeout(ctx, w.opts.OpTimeout)
	resp, err := w.client.Raw().Get(octx, key)
	cancel()
	ret := w.now()
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.history = append(w.history, porcupine.Operation{ClientId: worker, Input: kvInput{Key: key}, Call: call, Output: kvOutput{Value: value(resp)}, Return: ret})
	}
}

func value(resp *clientv3.GetResponse) string {
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// WriterReport summarises a run.
type WriterReport struct {
	Ops, Writes, Reads, UnknownWrites, FailedAttempts int
	// MaxWriteGap is the longest time without an acknowledged write,
	// counting from the start and up to Stop.
	MaxWriteGap time.Duration
	// Gaps are the longest gaps, longest first (at most reportedGaps), to
	// be matched with what the cluster went through at their ends.
	Gaps []WriteGap
	// Stalls are the longest times the writer's own process waited for a
	// CPU (at most reportedGaps, longest first): a gap that ends with one
	// was the client's as much as the cluster's.
	Stalls []WriteGap
	// Start is when the writer started, the origin of every gap's End.
	Start    time.Time
	Duration time.Duration
	// Linearizable is porcupine's verdict on the whole history.
	Linearizable porcupine.CheckResult
	// Visualization is a porcupine HTML file written when the verdict is
	// not Ok.
	Visualization string
	// LostWrites lists keys whose final value is neither the last
	// acknowledged write nor a later write of unknown outcome.
	LostWrites []string
}

// Err returns nil if the history is linearizable and no acknowledged write
// was lost, or an error saying what went wrong.
func (r WriterReport) Err() error {
	var errs []error
	if r.Linearizable != porcupine.Ok {
		errs = append(errs, fmt.Errorf("history of %d operations is %s, not linearizable (see %s)", r.Ops, r.Linearizable, r.Visualization))
	}
	if len(r.LostWrites) > 0 {
		errs = append(errs, fmt.Errorf("acknowledged writes lost: %s", strings.Join(r.LostWrites, "; ")))
	}
	if r.Writes == 0 {
		errs = append(errs, errors.New("no write was acknowledged"))
	}
	return errors.Join(errs...)
}

func (r WriterReport) String() string {
	return fmt.Sprintf("%d ops (%d acknowledged writes, %d reads, %d unknown writes) in %s, %d failed write attempts, longest write gaps %s, longest client stalls %s, porcupine %s, lost writes %d",
		r.Ops, r.Writes, r.Reads, r.UnknownWrites, r.Duration.Round(time.Millisecond), r.FailedAttempts,
		r.intervals(r.Gaps), r.intervals(r.Stalls), r.Linearizable, len(r.LostWrites))
}

func (r WriterReport) intervals(list []WriteGap) string {
	if len(list) == 0 {
		return "none"
	}
	out := make([]string, len(list))
	for i, g := range list {
		out[i] = fmt.Sprintf("%s ending at +%s (%s)", g.Length.Round(time.Millisecond), g.End.Round(time.Millisecond),
			r.Start.Add(g.End).UTC().Format("15:04:05.000"))
	}
	return strings.Join(out, ", ")
}

// reportedGaps is how many of the longest write gaps a report lists.
const reportedGaps = 3

// Stop ends the traffic, reads back every key (within ctx), and checks the
// history.
func (w *Writer) Stop(ctx context.Context) WriterReport {
	w.cancel()
	w.mu.Lock()
	if w.release != nil {
		w.release()
	}
	w.mu.Unlock()
	w.wg.Wait()
	end := time.Duration(w.now())
	finals := w.readFinals(ctx)
	w.mu.Lock()
	w.stopped = true
	history := slices.Clone(w.history)
	for k, f := range finals {
		history = append(history, porcupine.Operation{ClientId: w.opts.Keys, Input: kvInput{Key: k}, Call: f.call, Output: kvOutput{Value: f.value}, Return: f.ret})
	}
	last := int64(0)
	for _, op := range history {
		last = max(last, op.Return)
	}
	for _, i := range w.unknown {
		history[i].Return = last + 1
	}
	checked := withoutUnobservedUnknowns(history, w.unknown)
	r := WriterReport{Ops: len(history), UnknownWrites: len(w.unknown), FailedAttempts: w.failed, Duration: end, Start: w.start}
	for _, op := range history {
		if op.Input.(kvInput).Put {
			r.Writes++
		} else {
			r.Reads++
		}
	}
	r.Writes -= r.UnknownWrites
	r.Gaps = longestGaps(w.acks, end, reportedGaps)
	r.Stalls = longest(w.stalls, reportedGaps)
	r.MaxWriteGap = r.Gaps[0].Length
	r.LostWrites = append(slices.Clone(w.lostAtCheck), w.lostWrites(finals)...)
	w.mu.Unlock()
	_ = w.client.Close()

	result, info := porcupine.CheckOperationsVerbose(kvModel, checked, time.Minute)
	r.Linearizable = result
	if result != porcupine.Ok {
		if f, err := os.CreateTemp("", "qcp-porcupine-*.html"); err == nil {
			_ = porcupine.Visualize(kvModel, info, f)
			_ = f.Close()
			r.Visualization = f.Name()
		}
	}
	return r
}

// withoutUnobservedUnknowns drops from history the writes of unknown
// outcome (at the indexes unknown) whose value no read returned. With
// unique values this changes no verdict. Such a write, had it taken effect,
// can be placed after every other operation (its end is open), where no
// read sees it; and a linearization of the whole history stays one without
// it, since no read returned its value. Kept, each doubles the orders
// porcupine may have to try: the hundred or so written while etcd had no
// quorum made the check run out of time.
func withoutUnobservedUnknowns(history []porcupine.Operation, unknown []int) []porcupine.Operation {
	observed := map[kvInput]bool{}
	for _, op := range history {
		if in := op.Input.(kvInput); !in.Put {
			observed[kvInput{Put: true, Key: in.Key, Value: op.Output.(kvOutput).Value}] = true
		}
	}
	drop := map[int]bool{}
	for _, i := range unknown {
		if !observed[history[i].Input.(kvInput)] {
			drop[i] = true
		}
	}
	out := make([]porcupine.Operation, 0, len(history)-len(drop))
	for i, op := range history {
		if !drop[i] {
			out = append(out, op)
		}
	}
	return out
}

type finalRead struct {
	value     string
	call, ret int64
	err       error
}

// readFinals reads each written key until a read succeeds or ctx ends: the
// cluster may still be settling when the traffic stops.
func (w *Writer) readFinals(ctx context.Context) map[string]finalRead {
	out := map[string]finalRead{}
	for i := range w.opts.Keys {
		key := fmt.Sprintf("%sk%d", w.opts.Prefix, i)
		var f finalRead
		_ = Eventually(ctx, 100*time.Millisecond, "final read of "+key, func(ctx context.Context) error {
			f.call = w.now()
			octx, cancel := context.WithTimeout(ctx, w.opts.OpTimeout)
			resp, err := w.client.Raw().Get(octx, key)
			cancel()
			f.ret, f.err = w.now(), err
			if err == nil {
				f.value = value(resp)
			}
			return err
		})
		if f.err == nil {
			out[key] = f
		}
	}
	return out
}

// UnreadableFinal ends a LostWrites entry whose key could not be read
// back at all.
const UnreadableFinal = ": final value could not be read"

// lostWrites lists the keys whose final value is neither the last
// acknowledged write nor a write of unknown outcome. An unknown write
// issued before the last acknowledged one counts too: it may still have
// been in flight, and linearizability lets it land later. Chaos seed
// 784394 (stop 69) read two such values after two overlapping cuts, and
// porcupine, which has the final reads in its history, found it
// linearizable. The likeliest path: a put sent to a cut-off member times
// out at the client, which writes on through the majority, while the
// proposal the member forwarded waits in its TCP send buffer and reaches
// the leader when the cut heals.
func (w *Writer) lostWrites(finals map[string]finalRead) []string {
	var lost []string
	for i := range w.opts.Keys {
		key := fmt.Sprintf("%sk%d", w.opts.Prefix, i)
		f, ok := finals[key]
		if !ok {
			lost = append(lost, key+UnreadableFinal)
			continue
		}
		acked, hasAck := w.lastAck[key]
		if (hasAck && f.value == acked.value) || (!hasAck && f.value == "") || slices.Contains(w.unknownOf[key], f.value) {
			continue
		}
		lost = append(lost, fmt.Sprintf("%s: last acknowledged %q, read %q", key, acked.value, f.value))
	}
	return lost
}

// WriteGap is one interval without an acknowledged write.
type WriteGap struct {
	Length time.Duration
	// End is when the gap ended, since the writer started.
	End time.Duration
}

// longestGaps returns the n longest intervals between consecutive
// acknowledgements, longest first, including from the start to the first
// and from the last to end.
func longestGaps(acks []time.Duration, end time.Duration, n int) []WriteGap {
	sorted := append(slices.Clone(acks), end)
	slices.Sort(sorted)
	gaps := make([]WriteGap, 0, len(sorted))
	prev := time.Duration(0)
	for _, a := range sorted {
		gaps = append(gaps, WriteGap{Length: a - prev, End: a})
		prev = a
	}
	return longest(gaps, n)
}

// longest returns the n longest of list, longest first.
func longest(list []WriteGap, n int) []WriteGap {
	list = slices.Clone(list)
	slices.SortStableFunc(list, func(a, b WriteGap) int { return cmp.Compare(b.Length, a.Length) })
	return list[:min(n, len(list))]
}
