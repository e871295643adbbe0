package testkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func TestKVModelRejectsStaleRead(t *testing.T) {
	put := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: kvInput{Put: true, Key: "k", Value: v}, Output: kvOutput{}, Call: call, Return: ret}
	}
	get := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: kvInput{Key: "k"}, Output: kvOutput{Value: v}, Call: call, Return: ret}
	}
	ok := []porcupine.Operation{put("a", 0, 10), get("a", 11, 12), put("b", 13, 100), get("a", 14, 15), get("b", 101, 102)}
	if got := porcupine.CheckOperations(kvModel, ok); !got {
		t.Error("a linearizable history was rejected")
	}
	// After b is acknowledged, reading a is stale.
	stale := []porcupine.Operation{put("a", 0, 10), put("b", 11, 20), get("a", 21, 22)}
	if porcupine.CheckOperations(kvModel, stale) {
		t.Error("a stale read was accepted")
	}
}

// TestUnobservedUnknownWritesAreDropped: writes of unknown outcome that no
// read saw leave the check, which then finishes at once however many there
// are, and still rejects a stale read; one a read saw stays.
func TestUnobservedUnknownWritesAreDropped(t *testing.T) {
	put := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: kvInput{Put: true, Key: "k", Value: v}, Output: kvOutput{}, Call: call, Return: ret}
	}
	get := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: kvInput{Key: "k"}, Output: kvOutput{Value: v}, Call: call, Return: ret}
	}
	const end = 1 << 40 // an open end, as Stop sets it
	var history []porcupine.Operation
	var unknown []int
	at := int64(0)
	for i := range 200 {
		history = append(history, put(fmt.Sprintf("a%d", i), at, at+1), get(fmt.Sprintf("a%d", i), at+2, at+3))
		unknown = append(unknown, len(history))
		history = append(history, put(fmt.Sprintf("u%d", i), at+4, end))
		at += 10
	}
	// One unknown write was seen: it took effect, and must stay.
	history = append(history, get("u199", at, at+1))
	checked := withoutUnobservedUnknowns(history, unknown)
	if want := len(history) - 199; len(checked) != want {
		t.Fatalf("%d operations kept, want %d (the 199 unseen unknown writes dropped)", len(checked), want)
	}
	if res, _ := porcupine.CheckOperationsVerbose(kvModel, checked, 10*time.Second); res != porcupine.Ok {
		t.Errorf("verdict %s, want Ok", res)
	}
	stale := append(slices.Clone(history), get("a3", at+2, at+3))
	if res, _ := porcupine.CheckOperationsVerbose(kvModel, withoutUnobservedUnknowns(stale, unknown), 10*time.Second); res != porcupine.Illegal {
		t.Errorf("a stale read after the unknown writes: verdict %s, want Illegal", res)
	}
}

func TestLongestGapsCountEdges(t *testing.T) {
	got := longestGaps([]time.Duration{3, 4, 10}, 12, 3)
	want := []WriteGap{{Length: 6, End: 10}, {Length: 3, End: 3}, {Length: 2, End: 12}}
	if !slices.Equal(got, want) {
		t.Errorf("longestGaps = %v, want %v", got, want)
	}
	if got := longestGaps(nil, 7, 3); len(got) != 1 || got[0].Length != 7 {
		t.Errorf("longestGaps without acks = %v, want the whole run", got)
	}
}

// TestWriterSurvivesLeaderKill runs the writer against three real members
// while the leader is killed and restarted: the history must stay
// linearizable, nothing acknowledged may be lost, and the gap must show the
// election.
func TestWriterSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := NewEtcdCluster(t, "writer")
	ps, err := cl.Bootstrap(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	cli := cl.NewClient(ps...)
	mon := StartMonitor(cli, 3, 0)
	w, err := StartWriter(cl.Config(ps[0].ClientURL(), ps[1].ClientURL(), ps[2].ClientURL()), WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitAcknowledged(ctx, 50); err != nil {
		t.Fatal(err)
	}
	leader, err := cli.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var victim *EtcdProcess
	for _, p := range ps {
		if p.ClientURL() == leader.Endpoint {
			victim = p
		}
	}
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitAcknowledged(ctx, 50); err != nil {
		t.Fatal(err)
	}
	if err := victim.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := WaitHealthy(ctx, cli, victim); err != nil {
		t.Fatal(err)
	}
	r := w.Stop(ctx)
	t.Log(r)
	if err := r.Err(); err != nil {
		t.Error(err)
	}
	if r.MaxWriteGap < 100*time.Millisecond {
		t.Errorf("max write gap %s is shorter than any election; the gap measurement is broken", r.MaxWriteGap)
	}
	// The sampling loop may have been starved by a loaded machine; three
	// samples taken now, with every member back, must all be observed.
	for range 3 {
		mon.SampleNow(ctx)
	}
	mr := mon.Stop()
	if err := mr.Err(); err != nil {
		t.Error(err)
	}
	if mr.Samples-mr.Unobserved < 3 {
		t.Errorf("monitor observed only %d of %d samples", mr.Samples-mr.Unobserved, mr.Samples)
	}
}

// TestLostWritesAreFlagged feeds the lost-write check a history made for
// the purpose: a key whose final value is older than its last acknowledged
// write is lost; one holding a write of unknown outcome is not, even one
// issued before the last acknowledged write (a proposal delivered late).
func TestLostWritesAreFlagged(t *testing.T) {
	w := &Writer{opts: WriterOptions{Keys: 4}.withDefaults(), lastAck: map[string]ackedWrite{}, unknownOf: map[string][]string{}}
	key := func(i int) string { return fmt.Sprintf("%sk%d", w.opts.Prefix, i) }
	put := func(k int, value string, acked bool) {
		op := porcupine.Operation{Input: kvInput{Put: true, Key: key(k), Value: value}}
		if acked {
			w.recordAck(op, key(k), value)
		} else {
			w.recordUnknown(op, key(k), value)
		}
	}
	put(0, "w0-4", true)
	put(0, "w0-5", true)
	put(1, "w1-5", true)
	put(1, "w1-6", false)
	put(2, "w2-5", true)
	put(3, "w3-4", false)
	put(3, "w3-5", true)
	finals := map[string]finalRead{
		key(0): {value: "w0-4"}, // the acknowledged w0-5 was lost
		key(1): {value: "w1-6"}, // a write of unknown outcome landed
		key(2): {value: "w2-5"},
		key(3): {value: "w3-4"}, // one issued before the acknowledged w3-5 landed after it
	}
	lost := w.lostWrites(finals)
	if len(lost) != 1 || !strings.Contains(lost[0], key(0)) {
		t.Fatalf("lost writes %v, want only %s", lost, key(0))
	}
	r := WriterReport{Linearizable: porcupine.Ok, Writes: 3, LostWrites: lost}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Errorf("report error %v does not flag the lost write", err)
	}
	delete(finals, key(2))
	if lost := w.lostWrites(finals); len(lost) != 2 {
		t.Errorf("a key whose final value could not be read was not flagged: %v", lost)
	}
}

// TestHeldWriterChecksWhatWasKept: a writer held while a key loses its
// acknowledged value (put back behind its back, as a recovery that gave the
// write up would) reports the loss once CheckKept reads it, before the
// released writer overwrites the key; Stop reports it once more in
// LostWrites, and nothing else, and ends a hold left on.
func TestHeldWriterChecksWhatWasKept(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := NewEtcdCluster(t, "held")
	ps, err := cl.Bootstrap(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	w, err := StartWriter(cl.Config(ps[0].ClientURL()), WriterOptions{Keys: 2, Pause: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitAcknowledged(ctx, 10); err != nil {
		t.Fatal(err)
	}
	release := w.Hold()
	key := w.opts.Prefix + "k0"
	if _, err := w.client.Raw().Put(ctx, key, "given up"); err != nil {
		t.Fatal(err)
	}
	lost := w.CheckKept(ctx)
	if len(lost) != 1 || !strings.Contains(lost[0], key) || !strings.Contains(lost[0], `read "given up"`) {
		t.Fatalf("CheckKept found %v, want the loss of %s", lost, key)
	}
	release()
	if err := w.WaitAcknowledged(ctx, 10); err != nil {
		t.Fatal(err)
	}
	w.Hold() // left on: Stop releases it
	r := w.Stop(ctx)
	if len(r.LostWrites) != 1 || r.LostWrites[0] != lost[0] {
		t.Errorf("Stop reports lost writes %v, want only %v", r.LostWrites, lost)
	}
}

// TestEventuallyKeepsTheConditionsComplaint: a wait that runs out reports
// the condition's own last complaint, not the refusal of a call begun too
// close to the deadline to finish (a client's rate limiter refuses at
// once to wait past it).
func TestEventuallyKeepsTheConditionsComplaint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	interval := 100 * time.Millisecond
	err := Eventually(ctx, interval, "the leader to change", func(ctx context.Context) error {
		if dl, _ := ctx.Deadline(); time.Until(dl) < interval {
			return errors.New("rate: Wait(n=1) would exceed context deadline")
		}
		return errors.New("leader is m1")
	})
	if err == nil || !strings.Contains(err.Error(), "leader is m1") || strings.Contains(err.Error(), "would exceed") {
		t.Errorf("Eventually = %v; want the condition's complaint %q", err, "leader is m1")
	}
}
