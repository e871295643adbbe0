package engine

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/etcd"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// errNotHere is returned for the steps the executor does not take itself:
// CreateMachine needs the control plane's spec and templates, and Wait and
// Degraded are not steps.
var errNotHere = errors.New("not a step the executor takes")

// Executor carries out one planner decision on the management cluster
// (Machines) and on etcd. The reconciler has already observed again and
// checked the decision with quorum.Decision.Verify; the executor closes the
// rest of the gap: every write to a Machine is conditional on the
// resourceVersion the plan saw, so a machine that changed since (a user
// started deleting it, say) refuses the step instead of taking it.
type Executor struct {
	Client client.Client
	Etcd   *etcd.Client
	// AgentTLS reaches the machines' agents, and EtcdClientPair is what
	// a renewal delivers to them (see Observation).
	AgentTLS       *tls.Config
	EtcdClientPair *certs.KeyPair
	// Authority is what SetAuthority gives a machine: the CA
	// rotation's stage, of AuthorityKind (see Observation).
	Authority     *agent.Authority
	AuthorityKind agent.AuthorityKind
	// Owner is the control plane or EtcdCluster the step is for; Compact
	// records the compaction on it.
	Owner      client.Object
	Now        func() time.Time
	Failpoints Failpoints
	// Backup is the owner's backup configuration, which Snapshot uses;
	// Metrics record its outcome.
	Backup  *BackupConfig
	Metrics *Metrics
	// State is the fresh observation the step was checked against;
	// Recover records what its survivors show.
	State quorum.State
	// Restore is the snapshot RestoreFromBackup restores (see
	// Observation).
	Restore *Restore
}

// Execute takes decision d. machine is the Machine d names, as observed (nil
// for steps that name none).
func (x Executor) Execute(ctx context.Context, d quorum.Decision, machine *clusterv1.Machine) error {
	switch d.Kind {
	case quorum.AddHook, quorum.RemoveHook, quorum.DeleteMachine, quorum.AddLearner, quorum.Defragment, quorum.RestartMember, quorum.RenewCertificates, quorum.SetAuthority, quorum.Snapshot, quorum.Recover:
		if machine == nil || machine.Name != d.Machine {
			return fmt.Errorf("%s: machine %s was not observed", d.Kind, d.Machine)
		}
		if v := d.Expect.MachineResourceVersion; v != "" && machine.ResourceVersion != v {
			return fmt.Errorf("%s: machine %s changed since the plan (resourceVersion %s, planned with %s)", d.Kind, d.Machine, machine.ResourceVersion, v)
		}
	}
	switch d.Kind {
	case quorum.AddHook:
		defer x.Failpoints.Hit(FailpointAfterHook)
		return x.annotate(ctx, machine, func(a map[string]string) {
			for _, hook := range quorum.HookAnnotations {
				a[hook] = ""
			}
		})
	case quorum.RemoveHook:
		return x.annotate(ctx, machine, func(a map[string]string) {
			for _, hook := range quorum.HookAnnotations {
				delete(a, hook)
			}
		})
	case quorum.DeleteMachine:
		if x.State.Recovery.Restoring && slices.Contains(x.State.Recovery.LostMachines, machine.Name) {
			// A machine of a cluster lost for good: its Node's API server
			// is gone with it, so CAPI core could never drain it. The
			// restored cluster removes the Node (its data brought it).
			if err := x.annotate(ctx, machine, func(a map[string]string) {
				a[clusterv1.ExcludeNodeDrainingAnnotation] = ""
				a[clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation] = ""
			}); err != nil {
				return err
			}
		}
		rv, uid := machine.ResourceVersion, machine.UID
		if err := x.Client.Delete(ctx, machine, client.Preconditions{ResourceVersion: &rv, UID: &uid}); err != nil {
			return fmt.Errorf("deleting machine %s: %w", machine.Name, err)
		}
		return nil
	case quorum.AddLearner:
		return x.addLearner(ctx, d, machine)
	case quorum.Promote:
		defer x.Failpoints.Hit(FailpointAfterPromote)
		return x.Etcd.Promote(ctx, d.MemberID)
	case quorum.MoveLeader:
		return x.Etcd.MoveLeader(ctx, d.MemberID)
	case quorum.RemoveMember:
		return x.Etcd.Remove(ctx, d.MemberID)
	case quorum.DisarmAlarm:
		return x.Etcd.DisarmAlarm(ctx, d.MemberID, d.Alarm)
	case quorum.Defragment:
		return x.defragment(ctx, d, machine)
	case quorum.RestartMember:
		return x.restartMember(ctx, d, machine)
	case quorum.RenewCertificates:
		return x.renewCertificates(ctx, d, machine)
	case quorum.SetAuthority:
		return x.setAuthority(ctx, d, machine)
	case quorum.Snapshot:
		return x.snapshot(ctx, d, machine)
	case quorum.Recover:
		return x.recover(ctx, d, machine, x.State)
	case quorum.RestoreFromBackup:
		return x.recordRestoreFromBackup(ctx, d, x.Restore, x.State)
	case quorum.Compact:
		if err := x.Etcd.Compact(ctx, d.Revision); err != nil {
			return err
		}
		return x.recordOnOwner(ctx, CompactedAnnotation, FormatCompaction(d.Revision, x.Now()))
	}
	return fmt.Errorf("%s: %w", d.Kind, errNotHere)
}

// addLearner records that the join started, adds the learner, then records
// its member ID and when it was added. The first record comes first so that
// a crash right after the add leaves a machine the planner never joins
// again; the learner itself is then found by its peer URL. A refusal that
// certainly added nothing takes the first record back.
func (x Executor) addLearner(ctx context.Context, d quorum.Decision, machine *clusterv1.Machine) error {
	if err := x.annotate(ctx, machine, func(a map[string]string) { a[JoinStartedAnnotation] = FormatTime(x.Now()) }); err != nil {
		return err
	}
	x.Failpoints.Hit(FailpointBeforeMemberAdd)
	added, _, err := x.Etcd.AddLearner(ctx, d.PeerURL)
	x.Failpoints.Hit(FailpointAfterMemberAdd)
	if etcd.IsRefused(err) {
		// Certainly not added ("unhealthy cluster" for a few seconds after
		// every membership change): the join has not started after all.
		// Keeping the record would make the planner replace a good machine.
		if rerr := x.forgetJoin(ctx, machine); rerr != nil {
			return fmt.Errorf("adding machine %s to etcd: %w (and taking its join record back: %v)", machine.Name, err, rerr)
		}
		return fmt.Errorf("adding machine %s to etcd: %w", machine.Name, err)
	}
	if err != nil {
		return fmt.Errorf("adding machine %s to etcd: %w", machine.Name, err)
	}
	return x.annotate(ctx, machine, func(a map[string]string) {
		a[MemberIDAnnotation] = FormatMemberID(added.ID)
		a[LearnerAddedAnnotation] = FormatTime(x.Now())
	})
}

// defragment records the start on the machine, defragments its member,
// and records the end. A failed call leaves the start recorded: the member
// may still be defragmenting, and the planner counts it as a
// defragmentation started then, so it neither disrupts a second member
// meanwhile nor retries before the minimum interval.
func (x Executor) defragment(ctx context.Context, d quorum.Decision, machine *clusterv1.Machine) error {
	if err := x.annotate(ctx, machine, func(a map[string]string) { a[DefragStartedAnnotation] = FormatTime(x.Now()) }); err != nil {
		return err
	}
	if err := x.Etcd.Defragment(ctx, d.MemberID); err != nil {
		return err
	}
	return x.recordOwn(ctx, machine, func(a map[string]string) {
		delete(a, DefragStartedAnnotation)
		a[DefragmentedAnnotation] = FormatTime(x.Now())
	})
}

// restartMember records the start on the machine, has the machine's agent
// restart its etcd with the new quota, waits for the member to answer
// again, and records the end and the quota. The agent listens on the
// member's own address and takes the same client certificate as etcd's
// client port: whoever may change etcd's data may restart it. A failure
// leaves the start recorded, and the planner counts the member as
// restarting until its RestartTimeout.
func (x Executor) restartMember(ctx context.Context, d quorum.Decision, machine *clusterv1.Machine) error {
	endpoint, err := x.Etcd.ClientURL(ctx, d.MemberID)
	if err != nil {
		return err
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return fmt.Errorf("restarting member %x: its client URL %q: %w", d.MemberID, endpoint, err)
	}
	if err := x.annotate(ctx, machine, func(a map[string]string) { a[RestartStartedAnnotation] = FormatTime(x.Now()) }); err != nil {
		return err
	}
	res, err := agent.PutEtcdSettings(ctx, x.Etcd.TLSConfig(), u.Hostname(), agent.EtcdSettings{QuotaBackendBytes: d.QuotaBackendBytes})
	if err != nil {
		return fmt.Errorf("restarting member %x on machine %s with a backend quota of %d bytes: %w", d.MemberID, machine.Name, d.QuotaBackendBytes, err)
	}
	if res.Restarted {
		if err := x.Etcd.WaitHealthy(ctx, endpoint, restartWait); err != nil {
			return fmt.Errorf("member %x on machine %s restarted with a backend quota of %d bytes, and does not answer yet: %w", d.MemberID, machine.Name, d.QuotaBackendBytes, err)
		}
	}
	return x.recordOwn(ctx, machine, func(a map[string]string) {
		delete(a, RestartStartedAnnotation)
		a[QuotaAnnotation] = strconv.FormatInt(d.QuotaBackendBytes, 10)
	})
}

// restartWait bounds how long restartMember waits for a restarted member
// to answer: etcd is back in seconds, and a member that is not is left to
// the planner, which counts it as restarting until its RestartTimeout.
const restartWait = 30 * time.Second

// forgetJoin takes machine's join record back. Its patch carries no
// resourceVersion: CAPI core may well have written the machine's status
// since the record was added, and the record is QCP's own, which no one
// else writes. Failing on that conflict left the record behind, and the
// planner then replaced a good machine whose member it took for removed.
func (x Executor) forgetJoin(ctx context.Context, machine *clusterv1.Machine) error {
	return x.recordOwn(ctx, machine, func(a map[string]string) { delete(a, JoinStartedAnnotation) })
}

// recordOwn changes QCP's own records on machine with a patch that carries
// no resourceVersion: after a step, CAPI core may well have written the
// machine since, and no one else writes these records.
func (x Executor) recordOwn(ctx context.Context, machine *clusterv1.Machine, change func(map[string]string)) error {
	before := machine.DeepCopy()
	if machine.Annotations == nil {
		machine.Annotations = map[string]string{}
	}
	change(machine.Annotations)
	if err := x.Client.Patch(ctx, machine, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("annotating machine %s: %w", machine.Name, err)
	}
	return nil
}

// recordOnOwner sets one record on the owner: written at once through its
// metadata alone, so that the owner's status, which its controller is
// changing in memory and patches at the end of the round, is left alone;
// and set on the owner in memory too, so that the round's patch agrees.
func (x Executor) recordOnOwner(ctx context.Context, key, value string) error {
	if err := x.patchOwnerAnnotations(ctx, map[string]any{key: value}); err != nil {
		return err
	}
	SetRecord(x.Owner, key, value)
	return nil
}

// patchOwnerAnnotations merges annotations (a nil value removes one) into
// the owner's metadata alone.
func (x Executor) patchOwnerAnnotations(ctx context.Context, annotations map[string]any) error {
	gvk, err := apiutil.GVKForObject(x.Owner, x.Client.Scheme())
	if err != nil {
		return err
	}
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(gvk)
	meta.SetNamespace(x.Owner.GetNamespace())
	meta.SetName(x.Owner.GetName())
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	if err := x.Client.Patch(ctx, meta, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotating %s %s: %w", gvk.Kind, klog.KObj(x.Owner), err)
	}
	return nil
}

// annotate changes machine's annotations with a patch that fails if the
// machine changed since it was read, and leaves machine as written.
func (x Executor) annotate(ctx context.Context, machine *clusterv1.Machine, change func(map[string]string)) error {
	before := machine.DeepCopy()
	if machine.Annotations == nil {
		machine.Annotations = map[string]string{}
	}
	change(machine.Annotations)
	patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	if err := x.Client.Patch(ctx, machine, patch); err != nil {
		return fmt.Errorf("annotating machine %s: %w", machine.Name, err)
	}
	return nil
}
