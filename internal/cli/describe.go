package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/cmd/clusterctl/client/tree"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
)

// ClusterTree is what `qcpctl describe cluster` shows; -o json prints it as is
// so scripts get the same data as the tree.
type ClusterTree struct {
	Namespace      string           `json:"namespace"`
	Cluster        Row              `json:"cluster"`
	Infrastructure *Row             `json:"infrastructure,omitempty"`
	ControlPlane   *ControlPlaneRow `json:"controlPlane,omitempty"`
}

// ConditionSummary is an object's main condition, the one its row shows.
type ConditionSummary struct {
	Condition          string                 `json:"condition"`
	Status             metav1.ConditionStatus `json:"status,omitempty"`
	Reason             string                 `json:"reason,omitempty"`
	Message            string                 `json:"message,omitempty"`
	LastTransitionTime *metav1.Time           `json:"lastTransitionTime,omitempty"`
	// Since is LastTransitionTime as an age, e.g. "3m".
	Since string `json:"since,omitempty"`
}

// Row is the Cluster, its infrastructure or its control plane.
type Row struct {
	Kind     string `json:"kind"`
	Name     string `json:"name"`
	Replicas string `json:"replicas,omitempty"`
	Ready    *int32 `json:"ready,omitempty"`
	UpToDate *int32 `json:"upToDate,omitempty"`
	ConditionSummary
}

// ControlPlaneRow is the QuorumControlPlane with what it is doing and its
// machines.
type ControlPlaneRow struct {
	Row
	Version   string       `json:"version,omitempty"`
	Operation *Operation   `json:"operation,omitempty"`
	Machines  []MachineRow `json:"machines"`
}

// Operation is the quorum engine's latest step; Kind Wait means the
// controller waits for Reason.
type Operation struct {
	controlplanev1.LastOperation
	// Since is StartTime as an age.
	Since string `json:"since,omitempty"`
}

// MachineRow is a control plane Machine with its etcd member.
type MachineRow struct {
	Name string `json:"name"` // the Machine's name, as qcpctl machine takes it
	ConditionSummary
	Version       string `json:"version,omitempty"`
	FailureDomain string `json:"failureDomain,omitempty"`
	// EtcdRole is leader, voter, learner, or none when no member is on it.
	EtcdRole      string `json:"etcdRole"`
	MemberHealthy *bool  `json:"memberHealthy,omitempty"`
	// Revision is a learner's, as status.etcd.members gives it.
	Revision int64 `json:"revision,omitempty"`
	// Database is the member's database, as status.etcd.members gives it.
	Database *controlplanev1.EtcdDatabaseStatus `json:"database,omitempty"`
	// DeletionHooks are the full annotation keys of the CAPI delete hooks
	// that hold the machine's deletion.
	DeletionHooks []string               `json:"deletionHooks,omitempty"`
	Deleting      bool                   `json:"deleting,omitempty"`
	UpToDate      metav1.ConditionStatus `json:"upToDate,omitempty"`
}

// hintError keeps the human message free of the API error's repetition while
// callers can still test the cause with apierrors.IsNotFound.
type hintError struct {
	msg string
	err error
}

func (e *hintError) Error() string { return e.msg }
func (e *hintError) Unwrap() error { return e.err }

// newDescribeCommand returns `describe cluster NAME`. connect returns a client
// for the management cluster.
func newDescribeCommand(connect func() (client.Client, error)) *cobra.Command {
	namespace, output := "default", ""
	watch, interval := false, time.Second
	cmd := &cobra.Command{
		Use:   "cluster NAME",
		Short: "Show a cluster's control plane, its machines' etcd roles and what the controller waits for",
		Example: `  qcpctl describe cluster demo
  qcpctl describe cluster demo --watch
  qcpctl describe cluster demo -o json | jq '.controlPlane.machines[] | {name, etcdRole}'`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("name one cluster, e.g. 'qcpctl describe cluster demo'; got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != "json" {
				return fmt.Errorf("unknown output format %q: use -o json, or omit -o for the tree", output)
			}
			c, err := connect()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			tty := isTerminal(out)
			d := describer{c: c, namespace: namespace, name: args[0], json: output == "json", color: tty && output == ""}
			if !watch {
				frame, err := d.frame(cmd.Context(), time.Now())
				if err != nil {
					return err
				}
				_, err = io.WriteString(out, frame)
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return d.watch(ctx, out, tty, interval)
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", namespace, "namespace of the cluster")
	cmd.Flags().StringVarP(&output, "output", "o", output, `output format: "" for the tree, "json" for the same data for scripts`)
	cmd.Flags().BoolVar(&watch, "watch", false, "redraw whenever the cluster changes, until interrupted")
	cmd.Flags().DurationVar(&interval, "interval", interval, "how often --watch reads the cluster")
	return cmd
}

type describer struct {
	c               client.Client
	namespace, name string
	json, color     bool
}

func (d describer) frame(ctx context.Context, now time.Time) (string, error) {
	t, err := collect(ctx, d.c, d.namespace, d.name, now)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if d.json {
		err = renderJSON(&b, t)
	} else {
		err = renderTree(&b, t, d.color)
	}
	return b.String(), err
}

func (d describer) watch(ctx context.Context, out io.Writer, tty bool, every time.Duration) error {
	last := ""
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		frame, err := d.frame(ctx, time.Now())
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			// The management cluster may restart or the cluster be deleted
			// while watched; show why instead of quitting.
			frame = fmt.Sprintf("error: %v\n", err)
		}
		if frame != last {
			sep := ""
			switch {
			case tty:
				sep = "\x1b[H\x1b[2J"
			case last != "":
				sep = "\n"
			}
			if _, err := io.WriteString(out, sep+frame); err != nil {
				return fmt.Errorf("writing the description: %w", err)
			}
			last = frame
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// collect gathers the cluster's objects with clusterctl's discovery, so that
// describe shows the same tree as `clusterctl describe cluster`, and adds
// QCP's columns on top: what the control plane is doing, and the etcd member
// and delete hooks of each Machine that discovery put under it.
func collect(ctx context.Context, c client.Client, namespace, name string, now time.Time) (*ClusterTree, error) {
	objs, err := tree.Discovery(ctx, c, namespace, name, tree.DiscoverOptions{})
	if apierrors.IsNotFound(err) {
		return nil, &hintError{err: err, msg: fmt.Sprintf(
			"cluster %s/%s not found: list clusters with 'kubectl get clusters -A'", namespace, name)}
	} else if err != nil {
		return nil, fmt.Errorf("discovering the objects of cluster %s/%s: %w", namespace, name, err)
	}
	// Discovery always roots the tree at the Cluster it read.
	cluster := objs.GetRoot().(*clusterv1.Cluster)
	t := &ClusterTree{Namespace: namespace, Cluster: Row{
		Kind: "Cluster", Name: name, ConditionSummary: summarize(cluster, clusterv1.AvailableCondition, now)}}
	children := map[string]client.Object{}
	for _, o := range objs.GetObjectsByParent(cluster.GetUID()) {
		children[tree.GetMetaName(o)] = o
	}

	// Discovery leaves out a referenced object it cannot read; it may just
	// not be created yet, so its row says so rather than failing.
	if ref := cluster.Spec.InfrastructureRef; ref.IsDefined() {
		row := &Row{Kind: ref.Kind, Name: ref.Name}
		if infra := children["ClusterInfrastructure"]; infra != nil {
			row.ConditionSummary = summarize(infra, clusterv1.ReadyCondition, now)
		} else {
			row.Message = "not found"
		}
		t.Infrastructure = row
	}

	ref := cluster.Spec.ControlPlaneRef
	if !ref.IsDefined() {
		return t, nil
	}
	cp := &ControlPlaneRow{Row: Row{Kind: ref.Kind, Name: ref.Name}}
	t.ControlPlane = cp
	found, ok := children["ControlPlane"].(*unstructured.Unstructured)
	if !ok {
		cp.Message = "not found"
		return t, nil
	}
	// QCP's columns come from the QuorumControlPlane's status; another
	// provider's control plane, or another version of QCP's, has none that
	// this qcpctl can read.
	if found.GroupVersionKind() != controlplanev1.GroupVersion.WithKind("QuorumControlPlane") {
		cp.Message = "not a v1alpha1 QuorumControlPlane: use clusterctl describe"
		return t, nil
	}
	qcp := &controlplanev1.QuorumControlPlane{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(found.Object, qcp); err != nil {
		return nil, fmt.Errorf("reading QuorumControlPlane %s/%s: %w", namespace, ref.Name, err)
	}
	cp.Replicas = fmt.Sprintf("%d/%d", ptr.Deref(qcp.Status.Replicas, 0), ptr.Deref(qcp.Spec.Replicas, 1))
	cp.Ready, cp.UpToDate = qcp.Status.ReadyReplicas, qcp.Status.UpToDateReplicas
	cp.ConditionSummary = summarize(qcp, controlplanev1.AvailableCondition, now)
	cp.Version = qcp.Status.Version
	if op := qcp.Status.LastOperation; op.Kind != "" {
		cp.Operation = &Operation{LastOperation: op, Since: age(op.StartTime, now)}
	}

	// The tree keeps children in no order; rows go by name.
	var machines []*clusterv1.Machine
	for _, o := range objs.GetObjectsByParent(found.GetUID()) {
		if m, ok := o.(*clusterv1.Machine); ok {
			machines = append(machines, m)
		}
	}
	slices.SortFunc(machines, func(a, b *clusterv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	cp.Machines = []MachineRow{}
	for _, m := range machines {
		row := MachineRow{
			Name: m.Name, ConditionSummary: summarize(m, clusterv1.MachineReadyCondition, now),
			Version: m.Spec.Version, FailureDomain: m.Spec.FailureDomain, EtcdRole: "none",
			DeletionHooks: deletionHooks(m.Annotations), Deleting: !m.DeletionTimestamp.IsZero(),
		}
		if u := conditions.Get(m, clusterv1.MachineUpToDateCondition); u != nil {
			row.UpToDate = u.Status
		}
		for _, mem := range qcp.Status.Etcd.Members {
			if mem.Machine == m.Name {
				row.EtcdRole = strings.ToLower(string(mem.Role))
				row.MemberHealthy = ptr.To(mem.Healthy)
				row.Revision = mem.Revision
				row.Database = mem.Database
			}
		}
		cp.Machines = append(cp.Machines, row)
	}
	return t, nil
}

// summarize reads obj's conditionType condition. obj may be another
// provider's object, which discovery reads as unstructured.
func summarize(obj client.Object, conditionType string, now time.Time) ConditionSummary {
	s := ConditionSummary{Condition: conditionType}
	if c := meta.FindStatusCondition(tree.GetConditions(obj), conditionType); c != nil {
		s.Status, s.Reason, s.Message = c.Status, c.Reason, c.Message
		s.LastTransitionTime = &c.LastTransitionTime
		s.Since = age(c.LastTransitionTime, now)
	}
	return s
}

func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	return duration.ShortHumanDuration(now.Sub(t.Time))
}

func deletionHooks(annotations map[string]string) []string {
	var hooks []string
	for k := range annotations {
		if strings.HasPrefix(k, clusterv1.PreDrainDeleteHookAnnotationPrefix+"/") ||
			strings.HasPrefix(k, clusterv1.PreTerminateDeleteHookAnnotationPrefix+"/") {
			hooks = append(hooks, k)
		}
	}
	slices.Sort(hooks)
	return hooks
}

func renderJSON(w io.Writer, t *ClusterTree) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(t); err != nil {
		return fmt.Errorf("encoding the description as JSON: %w", err)
	}
	return nil
}

const maxMessage = 60

// database is a member's database for the table: its size, the part in
// use, and the fragmentation (1 - inUse/size); blank when unknown.
func database(db *controlplanev1.EtcdDatabaseStatus) (size, inUse, frag string) {
	if db == nil || db.Size.IsZero() {
		return "", "", ""
	}
	used := float64(db.InUse.Value()) / float64(db.Size.Value())
	return db.Size.String(), db.InUse.String(), fmt.Sprintf("%.0f%%", 100*max(0, 1-used))
}

// renderTree prints t as a clusterctl-like table. The operation line goes
// under the control plane row but outside the table, so that its length does
// not widen the NAME column.
func renderTree(w io.Writer, t *ClusterTree, color bool) error {
	rows := [][]string{{"NAME", "REPLICAS", "READY", "UP-TO-DATE", "VERSION", paint("STATUS", color),
		"REASON", "SINCE", "DOMAIN", "ROLE", "MEMBER", "REVISION", "DB SIZE", "IN USE", "FRAG", "HOOKS", "MESSAGE"}}
	add := func(prefix string, r Row, version string) {
		rows = append(rows, []string{prefix + r.Kind + "/" + r.Name, r.Replicas, count(r.Ready), count(r.UpToDate), version,
			paint(string(r.Status), color), r.Reason, r.Since, "", "", "", "", "", "", "", "", short(r.Message)})
	}
	add("", t.Cluster, "")
	if t.Infrastructure != nil {
		add(branch(t.ControlPlane == nil), *t.Infrastructure, "")
	}
	note, cpRow := "", -1
	if cp := t.ControlPlane; cp != nil {
		cpRow = len(rows)
		add("└─", cp.Row, cp.Version)
		if op := cp.Operation; op != nil {
			label, what, reason := "Operation:", strings.TrimSpace(string(op.Kind)+" "+op.Target), op.Reason
			switch {
			case op.Kind == controlplanev1.OperationWait && strings.HasPrefix(op.Reason, "nothing to do"):
				// The planner's steady state is a Wait too; it waits for nothing.
				label, what = "Steady:", op.Target
			case op.Kind == controlplanev1.OperationWait:
				// The planner's reasons say "waiting for ..." themselves.
				label, what, reason = "Waiting for:", op.Target, strings.TrimPrefix(op.Reason, "waiting for ")
			}
			if what != "" {
				what += ": "
			}
			note = fmt.Sprintf("%s %s%s (since %s)", label, what, reason, op.Since)
			if !op.FinishTime.IsZero() {
				note = strings.TrimSuffix(note, ")") + ", finished)"
			}
			bar := "    " // continues the tree when machines follow
			if len(cp.Machines) > 0 {
				bar = "  │ "
			}
			note = bar + note
		}
		for i, m := range cp.Machines {
			name, revision := "Machine/"+m.Name, ""
			if m.Deleting {
				name += " (deleting)"
			}
			if m.Revision > 0 { // a learner's: how far it has caught up
				revision = fmt.Sprint(m.Revision)
			}
			size, inUse, frag := database(m.Database)
			rows = append(rows, []string{"  " + branch(i == len(cp.Machines)-1) + name, "", "", string(m.UpToDate),
				m.Version, paint(string(m.Status), color), m.Reason, m.Since, m.FailureDomain, m.EtcdRole,
				health(m.MemberHealthy), revision, size, inUse, frag, shortHooks(m.DeletionHooks), short(m.Message)})
		}
	}

	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("formatting the description: %w", err)
	}
	var b strings.Builder
	for i, line := range strings.Split(strings.TrimSuffix(table.String(), "\n"), "\n") {
		b.WriteString(strings.TrimRight(line, " ") + "\n")
		if i == cpRow && note != "" {
			b.WriteString(note + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func branch(last bool) string {
	if last {
		return "└─"
	}
	return "├─"
}

func count(n *int32) string {
	if n == nil {
		return ""
	}
	return fmt.Sprint(*n)
}

func health(healthy *bool) string {
	if healthy == nil {
		return "-"
	}
	return map[bool]string{true: "healthy", false: "unhealthy"}[*healthy]
}

// shortHooks drops the CAPI prefixes, which are the same on every machine.
// shortHooks names each hook once: a pre-drain hook and its pre-terminate
// twin of the same name (QCP's quorum hook is both) are one cell entry.
func shortHooks(hooks []string) string {
	names := make([]string, 0, len(hooks))
	for _, h := range hooks {
		if name := h[strings.Index(h, "/")+1:]; !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return strings.Join(names, ",")
}

func short(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ") // CAPI messages span lines
	if r := []rune(msg); len(r) > maxMessage {
		return string(r[:maxMessage-1]) + "…"
	}
	return msg
}

var statusColors = map[string]string{"True": "\x1b[32m", "False": "\x1b[31m", "Unknown": "\x1b[33m"}

// paint colours a status cell. Every cell, the header too, gets escape codes
// of the same length, so tabwriter, which counts them, still aligns the
// column.
func paint(s string, on bool) string {
	if !on {
		return s
	}
	code, ok := statusColors[s]
	if !ok {
		code = "\x1b[39m" // the default colour
	}
	return code + s + "\x1b[0m"
}
