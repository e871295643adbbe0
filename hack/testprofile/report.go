package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"
)

// testEvent is one line of `go test -json`.
type testEvent struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// QueuedPrefix starts the line a test/e2e scenario logs once the package's
// scenario queue gives it a slot, followed by the seconds it waited.
const QueuedPrefix = "scenario queue: waited "

// span is a package's or a test's run.
type span struct {
	name       string
	start, end time.Time
	elapsed    float64 // what go test reports: a parallel test's paused time is not in it
	queued     float64 // seconds it waited in its package's own queue, if it logged them
	result     string
}

func (s span) wall() float64 { return s.end.Sub(s.start).Seconds() }

// run is what report reads: the samples and the test events.
type run struct {
	samples  []sample
	packages []span
	tests    []span // top-level tests
	// testStart and testEnd bound the test phase: from go test's first
	// event to its last.
	testStart, testEnd time.Time
}

func load(prof, tests string) (*run, error) {
	r := &run{}
	f, err := os.Open(prof)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var s sample
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("%s: %w", prof, err)
		}
		r.samples = append(r.samples, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(r.samples) == 0 {
		return nil, fmt.Errorf("%s: no samples", prof)
	}

	tf, err := os.Open(tests)
	if err != nil {
		return nil, err
	}
	defer tf.Close()
	sc = bufio.NewScanner(tf)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	pkgs, tsts := map[string]*span{}, map[string]*span{}
	for sc.Scan() {
		var e testEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Time.IsZero() {
			continue // make's own lines, or a build event without a time
		}
		if r.testStart.IsZero() || e.Time.Before(r.testStart) {
			r.testStart = e.Time
		}
		if e.Time.After(r.testEnd) {
			r.testEnd = e.Time
		}
		if e.Package == "" {
			continue
		}
		m, key := pkgs, e.Package
		if e.Test != "" {
			if strings.Contains(e.Test, "/") {
				continue
			}
			m, key = tsts, e.Package+" "+e.Test
		}
		s := m[key]
		if s == nil {
			s = &span{name: key, start: e.Time}
			m[key] = s
		}
		s.end = e.Time
		if _, rest, ok := strings.Cut(e.Output, QueuedPrefix); ok && e.Action == "output" {
			fmt.Sscanf(rest, "%fs", &s.queued)
		}
		switch e.Action {
		case "pass", "fail", "skip":
			s.result, s.elapsed = e.Action, e.Elapsed
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	r.packages, r.tests = ended(pkgs), ended(tsts)
	return r, nil
}

// ended lists the spans that have a result, by start.
func ended(m map[string]*span) []span {
	var out []span
	for _, s := range m {
		if s.result != "" {
			out = append(out, *s)
		}
	}
	slices.SortFunc(out, func(a, b span) int { return cmp.Or(a.start.Compare(b.start), strings.Compare(a.name, b.name)) })
	return out
}

// totals sums the samples in (from, to].
type totals struct {
	wall, busy, idle float64
	// memPeak is the most memory in use at any sample, in GiB.
	memPeak float64
	groups  map[string]float64
	// lives is, for each group, when it used CPU: from the sample before
	// its first (a sample covers the interval before it) to its last.
	lives map[string]life
}

// life is a time from when to until.
type life struct{ from, to time.Time }

func (l life) seconds() float64 { return l.to.Sub(l.from).Seconds() }

func (r *run) sum(from, to time.Time) totals {
	t := totals{groups: map[string]float64{}, lives: map[string]life{}}
	prev := from
	for _, s := range r.samples {
		// A sample covers the interval before it: (from, to] holds the
		// samples taken after from, up to and including to.
		at := time.UnixMilli(s.T)
		if !at.After(from) || at.After(to) {
			continue
		}
		t.busy += s.Busy
		t.idle += s.Idle
		t.memPeak = max(t.memPeak, s.MemUsed)
		for g, v := range s.CPU {
			t.groups[g] += v
			l, ok := t.lives[g]
			if !ok {
				l.from = prev
			}
			l.to = at
			t.lives[g] = l
		}
		prev = at
	}
	t.wall = to.Sub(from).Seconds()
	return t
}

// packageOf names the package whose test binary owns a group ("test
// <dir>"): the package of the run that dir ends in, or dir's last two
// elements if none does; "" for an owner that is no test binary.
func (r *run) packageOf(owner string) string {
	dir, ok := strings.CutPrefix(owner, "test ")
	if !ok {
		return ""
	}
	for _, p := range r.packages {
		if strings.HasSuffix(dir, "/"+lastTwo(p.name)) {
			return short(p.name)
		}
	}
	return lastTwo(dir)
}

// clusterUse is one process machine cluster's share of the test phase.
type clusterUse struct {
	pkg, cluster string
	cpu          float64
	life
}

// clusters lists the process machine clusters of t, by package and
// cluster name (two packages may name a cluster alike), the costliest
// first. A cluster's life spans its processes' groups'.
func (t totals) clusters(packageOf func(owner string) string) []clusterUse {
	m := map[string]*clusterUse{}
	// In a fixed order, so that clusters of equal CPU sort alike each run.
	for _, g := range slices.Sorted(maps.Keys(t.groups)) {
		v := t.groups[g]
		p := strings.SplitN(g, "|", 3)
		if len(p) < 3 || p[2] == "" {
			continue
		}
		pkg, l := packageOf(p[0]), t.lives[g]
		u := m[pkg+"|"+p[2]]
		if u == nil {
			u = &clusterUse{pkg: pkg, cluster: p[2], life: l}
			m[pkg+"|"+p[2]] = u
		}
		u.cpu += v
		if l.from.Before(u.from) {
			u.from = l.from
		}
		if l.to.After(u.to) {
			u.to = l.to
		}
	}
	out := make([]clusterUse, 0, len(m))
	for _, u := range m {
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b clusterUse) int {
		return cmp.Or(cmp.Compare(b.cpu, a.cpu), strings.Compare(a.pkg, b.pkg), strings.Compare(a.cluster, b.cluster))
	})
	return out
}

// by adds up groups by one of their parts (0 owner, 1 component, 2 cluster).
func (t totals) by(part int, keep func(owner string) bool) map[string]float64 {
	out := map[string]float64{}
	for g, v := range t.groups {
		p := strings.SplitN(g, "|", 3)
		if len(p) < 3 || keep != nil && !keep(p[0]) {
			continue
		}
		out[p[part]] += v
	}
	return out
}

// report writes the timeline. testStart, when not zero, is when go test
// started (make test notes it in bin/test-start); without it the test
// phase starts with the first sample of a go test command.
func report(w io.Writer, prof, tests string, testStart time.Time) error {
	r, err := load(prof, tests)
	if err != nil {
		return err
	}
	first, last := r.samples[0], r.samples[len(r.samples)-1]
	start := time.UnixMilli(first.T).Add(-time.Second)
	end := time.UnixMilli(last.T)
	if r.testStart.IsZero() {
		r.testStart, r.testEnd = end, end
	}
	// The test phase starts with go test itself, which compiles and links
	// the test binaries before the first package starts.
	if !testStart.IsZero() {
		r.testStart = testStart
	} else {
		for _, s := range r.samples {
			if at := time.UnixMilli(s.T).Add(-time.Second); at.Before(r.testStart) && hasOwner(s, "go test") {
				r.testStart = at
				break
			}
		}
	}
	all := r.sum(start, end)
	build := r.sum(start, r.testStart)
	test := r.sum(r.testStart, r.testEnd)
	after := r.sum(r.testEnd, end)
	cores := (all.busy + all.idle) / max(all.wall, 1)

	fmt.Fprintf(w, "## Phases\n\n%.0f cores. CPU-seconds are the host's (/proc/stat); idle is core-seconds no process used.\n\n", cores)
	fmt.Fprintf(w, "| phase | wall (s) | CPU-seconds | idle core-seconds | cores busy (mean) | peak memory in use (GiB) |\n|---|---:|---:|---:|---:|---:|\n")
	for _, p := range []struct {
		name string
		t    totals
	}{{"builds, generate, vet (before go test)", build}, {"test (go test: compiling, then running)", test}, {"after (stray check)", after}, {"whole run", all}} {
		// Profiles recorded before samples carried memory have none.
		peak := "not recorded"
		if p.t.memPeak > 0 {
			peak = fmt.Sprintf("%.1f", p.t.memPeak)
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %.2f | %s |\n", p.name, p.t.wall, p.t.busy, p.t.idle, p.t.busy/max(p.t.wall, 1), peak)
	}

	fmt.Fprintf(w, "\n## Build steps\n\nCPU-seconds by who asked for them, before go test started.\n\n")
	table(w, []string{"step", "CPU-seconds"}, build.by(0, nil), 0)

	fmt.Fprintf(w, "\n## Test phase: CPU by component\n\n")
	table(w, []string{"component", "CPU-seconds"}, test.by(1, nil), 0)
	fmt.Fprintf(w, "\nUnattributed (processes that started and exited between two samples, and not reaped by a process seen): %.0f CPU-seconds.\n", test.busy-sum(test.groups))

	owners := test.by(0, nil)
	fmt.Fprintf(w, "\n## Packages\n\nWall time from the package's first event to its result; CPU-seconds of its test binary and every process under it.\n\n")
	fmt.Fprintf(w, "| package | start (s) | wall (s) | CPU-seconds | result |\n|---|---:|---:|---:|---|\n")
	for _, p := range r.packages {
		if p.wall() < 1 {
			continue // no test files, or nothing that takes time
		}
		cpu := 0.0
		for o, v := range owners {
			if r.packageOf(o) == short(p.name) {
				cpu += v
			}
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %s |\n", short(p.name), p.start.Sub(r.testStart).Seconds(), p.wall(), cpu, p.result)
	}
	rest := map[string]float64{}
	for o, v := range owners {
		if !strings.HasPrefix(o, "test ") {
			rest[o] += v
		}
	}
	fmt.Fprintf(w, "\nCPU in the test phase outside any test binary (go test compiling and linking, the go command):\n\n")
	table(w, []string{"owner", "CPU-seconds"}, rest, 1)

	fmt.Fprintf(w, "\n## Tests over 20 s\n\nWall from start to result; a parallel test's includes its wait for a slot, which go test's elapsed excludes. A test/e2e scenario also waits in the package's own queue (queued), so it ran from start + queued for wall − queued.\n\n")
	fmt.Fprintf(w, "| test | start (s) | queued (s) | wall (s) | elapsed (s) | result |\n|---|---:|---:|---:|---:|---|\n")
	for _, t := range r.tests {
		if t.wall() >= 20 {
			fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %.0f | %s |\n", short(t.name), t.start.Sub(r.testStart).Seconds(), t.queued, t.wall(), t.elapsed, t.result)
		}
	}

	fmt.Fprintf(w, "\n## Process machines: CPU by cluster\n\nEvery process of a machine (agent, etcd, Kubernetes components), by the package and the cluster its machine belongs to; the scenarios name their clusters. A cluster lives from the first sample with a process of its to the last (a name that tests of one package use one after the other counts as one cluster, from the first's start to the last's end); cluster-seconds, its lifetime, are what a scenario that shares another's cluster saves.\n\n")
	uses := test.clusters(r.packageOf)
	fmt.Fprintf(w, "| package | cluster | lifetime (s) | CPU-seconds | CPU (ms/s) |\n|---|---|---:|---:|---:|\n")
	var lives, cpu float64
	for _, u := range uses {
		lives, cpu = lives+u.seconds(), cpu+u.cpu
		if u.cpu >= 1 {
			fmt.Fprintf(w, "| %s | %s | %.0f | %.0f | %.0f |\n", u.pkg, u.cluster, u.seconds(), u.cpu, 1000*u.cpu/max(u.seconds(), 1))
		}
	}
	fmt.Fprintf(w, "| total | %d clusters | %.0f | %.0f | %.0f |\n", len(uses), lives, cpu, 1000*cpu/max(lives, 1))
	fmt.Fprintf(w, "\nThe test phase's CPU besides the process machines': %.0f CPU-seconds.\n", test.busy-cpu)

	fmt.Fprintf(w, "\n## Timeline\n\nEach minute of the test phase: the cores busy (mean) and the packages running.\n\n| minute | cores busy | packages |\n|---:|---:|---|\n")
	for m := r.testStart; m.Before(r.testEnd); m = m.Add(time.Minute) {
		t := r.sum(m, m.Add(time.Minute))
		var running []string
		for _, p := range r.packages {
			if p.wall() >= 1 && p.start.Before(m.Add(time.Minute)) && p.end.After(m) {
				running = append(running, short(p.name))
			}
		}
		fmt.Fprintf(w, "| %.0f | %.2f | %s |\n", m.Sub(r.testStart).Minutes(), t.busy/60, strings.Join(running, ", "))
	}
	return nil
}

func hasOwner(s sample, owner string) bool {
	for g := range s.CPU {
		if strings.HasPrefix(g, owner+"|") {
			return true
		}
	}
	return false
}

func table(w io.Writer, head []string, rows map[string]float64, min float64) {
	fmt.Fprintf(w, "| %s |\n|---|---:|\n", strings.Join(head, " | "))
	keys := slices.Collect(maps.Keys(rows))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(rows[b], rows[a]), strings.Compare(a, b)) })
	for _, k := range keys {
		if rows[k] >= min {
			fmt.Fprintf(w, "| %s | %.0f |\n", cmp.Or(k, "(none)"), rows[k])
		}
	}
	fmt.Fprintf(w, "| total | %.0f |\n", sum(rows))
}

func sum(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

// short strips the module path from a package or test name.
func short(name string) string {
	if i := strings.Index(name, "/qcp/"); i >= 0 {
		return name[i+len("/qcp/"):]
	}
	return name
}

// lastTwo is the last two elements of an import path.
func lastTwo(pkg string) string {
	p := strings.Split(pkg, "/")
	if len(p) < 2 {
		return pkg
	}
	return strings.Join(p[len(p)-2:], "/")
}
