package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// BenchmarkCreateAndScale measures, on the shared management cluster, the
// wall time of creating a 3-machine control plane and of scaling it to 5,
// each next to the sum of the machines' own start-up times (agent start to
// every component's Node condition True), and the controller's reaction
// latency over both.
func BenchmarkCreateAndScale(b *testing.B) {
	if shared == nil {
		b.Skip("needs the shared management cluster (not with -short)")
	}
	for i := range b.N {
		name := fmt.Sprintf("bench-%d", i)
		s := createMeasured(b, name, 3, "")
		before := s.machineNames()

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		start := time.Now()
		s.scale(ctx, 5)
		s.waitAvailable(convergeTimeout, 5)
		scaleWall := time.Since(start)
		scaleSum := s.startupSum(before)
		cancel()

		b.ReportMetric(scaleWall.Seconds(), "scale-s")
		b.ReportMetric(scaleWall.Seconds()/scaleSum.Seconds(), "scale-ratio")
		reportReactionLatency(b, s, "")
		s.logSteps()
		s.finish()
		s.deleteCluster()
	}
}

// BenchmarkCreateGrowth measures how creation grows with the machines:
// control planes of 1, 3 and 5 replicas, one after another on the shared
// management cluster, each with its wall time over the sum of its
// machines' start-ups and its reaction latency.
func BenchmarkCreateGrowth(b *testing.B) {
	if shared == nil {
		b.Skip("needs the shared management cluster (not with -short)")
	}
	for i := range b.N {
		for _, replicas := range []int32{1, 3, 5} {
			suffix := fmt.Sprintf("-%d", replicas)
			s := createMeasured(b, fmt.Sprintf("growth-%d-%d", replicas, i), replicas, suffix)
			reportReactionLatency(b, s, suffix)
			s.finish()
			s.deleteCluster()
		}
	}
}

// createMeasured creates a control plane of replicas, waits until it is
// Available and reports its creation's wall time and its ratio to the sum
// of the machines' start-ups, as create-s and create-ratio, each unit
// ending in suffix.
func createMeasured(b *testing.B, name string, replicas int32, suffix string) *scenario {
	b.Helper()
	start := time.Now()
	s := newScenario(b, shared, name, replicas)
	s.waitAvailable(convergeTimeout, int(replicas))
	wall := time.Since(start)
	sum := s.startupSum(nil)
	b.ReportMetric(wall.Seconds(), "create-s"+suffix)
	b.ReportMetric(wall.Seconds()/sum.Seconds(), "create-ratio"+suffix)
	return s
}

// reportReactionLatency reports qcp-manager's reaction latency summary for
// s's control plane, p50 and p99 in ms, each unit ending in suffix.
func reportReactionLatency(b *testing.B, s *scenario, suffix string) {
	for q, unit := range map[string]string{"0.5": "reaction-p50-ms", "0.99": "reaction-p99-ms"} {
		v, err := testkit.Metric(context.Background(), s.mgmt.manager.MetricsAddr,
			fmt.Sprintf(`qcp_controlplane_reaction_latency_seconds{name=%q,namespace=%q,quantile=%q} `, s.name, ns, q))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(v*1000, unit+suffix)
	}
}

// machineNames are the control plane's machines now.
func (s *scenario) machineNames() map[string]bool {
	ms, err := s.machines(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range ms {
		out[m.Name] = true
	}
	return out
}

// startupSum adds up the start-up times of the machines not in skip: from
// the agent's process start to the moment its health endpoint says it was
// first healthy, both to the millisecond. (The Node's component condition
// times keep whole seconds; truncated, they made each start-up half a
// second shorter on average, a tenth of a 5-s one.)
func (s *scenario) startupSum(skip map[string]bool) time.Duration {
	ctx := context.Background()
	ms, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	var sum time.Duration
	for _, m := range ms {
		if skip[m.Name] {
			continue
		}
		pm := &infrav1.ProcessMachine{}
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: m.Spec.InfrastructureRef.Name}, pm); err != nil {
			s.t.Fatal(err)
		}
		started, err := processStart(int(pm.Status.PID))
		if err != nil {
			s.t.Fatal(err)
		}
		if len(pm.Status.Addresses) == 0 {
			s.t.Fatalf("machine %s has no address", m.Name)
		}
		h, err := agent.ReadHealth(ctx, pm.Status.Addresses[0].Address)
		if err != nil {
			s.t.Fatal(err)
		}
		if h.FirstHealthy.IsZero() {
			s.t.Fatalf("machine %s was never healthy: %+v", m.Name, h)
		}
		s.t.Logf("machine %s: agent started %s, first healthy %s (%s)", m.Name, started.Format(time.StampMilli), h.FirstHealthy.Format(time.StampMilli), h.FirstHealthy.Sub(started))
		sum += h.FirstHealthy.Sub(started)
	}
	return sum
}

// processStart is when process pid started, from /proc.
func processStart(pid int) (time.Time, error) {
	fields, err := testkit.ProcStat(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, err
	}
	// Field 22: starttime, in clock ticks since boot.
	ticks, err := strconv.ParseInt(fields[19], 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	uptime, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Time{}, err
	}
	up, err := strconv.ParseFloat(strings.Fields(string(uptime))[0], 64)
	if err != nil {
		return time.Time{}, err
	}
	const hz = 100 // USER_HZ on Linux
	boot := time.Now().Add(-time.Duration(up * float64(time.Second)))
	return boot.Add(time.Duration(ticks) * time.Second / hz), nil
}

// logSteps logs the steps qcp-manager took for the scenario's control plane,
// each with its reaction latency, to show where the time went.
func (s *scenario) logSteps() {
	for _, st := range s.steps() {
		s.t.Logf("step %-14s %-22s reaction %s", st.Decision, st.Machine, st.ReactionLatency)
	}
}

// step is one step qcp-manager logged taking ("Taking step").
type step struct {
	At                             time.Time `json:"ts"`
	Msg, Decision, Machine, Reason string
	ReactionLatency                string
	CP                             struct{ Name string } `json:"QuorumControlPlane"`
}

// steps are the steps qcp-manager logged taking for the scenario's control
// plane, in order.
func (s *scenario) steps() []step {
	data, err := os.ReadFile(filepath.Join(s.mgmt.env.Dir, "qcp-manager.log"))
	if err != nil {
		s.t.Fatal(err)
	}
	var out []step
	for _, l := range strings.Split(string(data), "\n") {
		var entry step
		if json.Unmarshal([]byte(l), &entry) != nil || entry.Msg != "Taking step" || entry.CP.Name != s.name {
			continue
		}
		out = append(out, entry)
	}
	return out
}

// logGapSteps logs, for each of the writer's longest gaps, the steps QCP
// took from a second before it began to its end, and the writer's own
// stalls (its process waiting for a CPU) that overlap it: where the gap
// went, beside the writer's figures.
func (s *scenario) logGapSteps(wr testkit.WriterReport) {
	all := s.steps()
	for _, g := range wr.Gaps {
		end := wr.Start.Add(g.End)
		begin := end.Add(-g.Length)
		var near []string
		for _, st := range all {
			if !st.At.Before(begin.Add(-time.Second)) && !st.At.After(end) {
				near = append(near, fmt.Sprintf("%s at %+dms from the gap's start (%s)", st.Decision, st.At.Sub(begin).Milliseconds(), st.Machine))
			}
		}
		// Stalls and gaps as offsets from the writer's start.
		var stalled time.Duration
		for _, st := range wr.Stalls {
			if overlap := min(st.End, g.End) - max(st.End-st.Length, g.End-g.Length); overlap > 0 {
				stalled += overlap
			}
		}
		s.t.Logf("write gap of %s ending %s: the writer's process waited %s of it for a CPU; steps from 1 s before it: %s",
			g.Length.Round(time.Millisecond), end.Format("15:04:05.000"), stalled.Round(time.Millisecond), cmp.Or(strings.Join(near, "; "), "none"))
	}
}

// deleteCluster deletes the scenario's Cluster and waits until it is gone,
// so that the next iteration starts on an idle management cluster.
func (s *scenario) deleteCluster() {
	s.release()
	s.waitClusterGone()
}

// waitClusterGone waits until the scenario's Cluster is gone.
func (s *scenario) waitClusterGone() {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}}
	s.eventually(5*time.Minute, "Cluster "+s.name+" gone", func(ctx context.Context) error {
		err := s.reader(ctx).Get(ctx, client.ObjectKeyFromObject(cluster), cluster)
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}
