package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/cloudinit"
	"github.com/qcp-dev/qcp/internal/quorum"
)

// NewMachine is a machine an owner asks the engine to create.
type NewMachine struct {
	// Owner controls the machine; OwnerRef references it.
	Owner    client.Object
	OwnerRef metav1.OwnerReference
	// InfraOwnerRef owns the infrastructure machine until CAPI core makes
	// the Machine its controller; OwnerRef if unset. CAPI core takes over
	// only from a MachineSet or the cluster's control plane, so any other
	// owner must not be its controller.
	InfraOwnerRef *metav1.OwnerReference
	Cluster       *clusterv1.Cluster
	Name          string
	Labels        map[string]string
	// Annotations go on the Machine; InfraAnnotations on the
	// infrastructure machine.
	Annotations, InfraAnnotations map[string]string
	// InfraTemplate is the infrastructure machine template to clone; its
	// field path names it in errors.
	InfraTemplate     clusterv1.ContractVersionedObjectReference
	InfraTemplatePath string
	Version           string
	FailureDomain     string
	Bootstrap         *bootstrap.Document
	// BootstrapFormat is the bootstrap data's format: cloud-config when
	// empty (see BootstrapDataSecret).
	BootstrapFormat string
	Deletion        clusterv1.MachineDeletionSpec
	ReadinessGates  []clusterv1.MachineReadinessGate
	Taints          []clusterv1.MachineTaint
}

// CreateMachine creates nm: its bootstrap data, its infrastructure machine
// cloned from the template, and the Machine. The first two are owned by
// the owner until the Machine exists, so a crash in between leaves nothing
// that outlives the owner; CAPI core then makes the infrastructure machine
// the Machine's, and the bootstrap Secret is handed to the Machine here.
// reader reads the API server directly: after a failed Machine create it
// says whether the Machine exists (see createdAnyway).
func CreateMachine(ctx context.Context, c client.Client, reader client.Reader, fp Failpoints, nm NewMachine) (*clusterv1.Machine, error) {
	data, err := BootstrapDataSecret(&clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: nm.Name, Namespace: nm.Owner.GetNamespace()},
		Spec: clusterv1.MachineSpec{ClusterName: nm.Cluster.Name}}, nm.Bootstrap, nm.BootstrapFormat)
	if err != nil {
		return nil, err
	}
	data.OwnerReferences = []metav1.OwnerReference{nm.OwnerRef}
	if err := c.Create(ctx, data); err != nil {
		return nil, fmt.Errorf("creating the bootstrap data of machine %s: %w", nm.Name, err)
	}
	fp.Hit(FailpointAfterBootstrapData)

	infra, err := cloneInfrastructure(ctx, c, reader, nm)
	if err != nil {
		cleanUp(ctx, c, data)
		return nil, fmt.Errorf("cloning %s %s for machine %s (check %s): %w", nm.InfraTemplate.Kind, nm.InfraTemplate.Name, nm.Name, nm.InfraTemplatePath, err)
	}
	fp.Hit(FailpointAfterInfraMachine)

	machine := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Name: nm.Name, Namespace: nm.Owner.GetNamespace(), Labels: nm.Labels,
			Annotations: withBootstrapHooks(nm.Annotations, nm.Bootstrap), OwnerReferences: []metav1.OwnerReference{nm.OwnerRef},
		},
		Spec: clusterv1.MachineSpec{
			ClusterName:       nm.Cluster.Name,
			Version:           nm.Version,
			FailureDomain:     nm.FailureDomain,
			Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To(data.Name)},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: nm.InfraTemplate.APIGroup, Kind: infra.GetKind(), Name: infra.GetName()},
			MinReadySeconds:   ptr.To[int32](0),
			Deletion:          nm.Deletion,
			ReadinessGates:    nm.ReadinessGates,
			Taints:            nm.Taints,
		},
	}
	if err := c.Create(ctx, machine); err != nil {
		// Decided by what exists, not by the error: a create whose answer
		// was lost may have committed, and cleaning up after it left a
		// Machine without bootstrap data. When not even that can be read,
		// both are kept; owned by the owner, at worst they go with it.
		created, lookErr := createdAnyway(ctx, reader, machine, nm.OwnerRef, err)
		switch {
		case created != nil:
			log.FromContext(ctx).Info("Creating the Machine failed, but it was created; keeping it", "Machine", klog.KObj(created), "error", err.Error())
			machine = created
		case lookErr != nil:
			return nil, fmt.Errorf("creating machine %s: %w; whether it was created anyway cannot be read (%v), so its bootstrap data and %s %s are kept, owned by %s %s",
				nm.Name, err, lookErr, infra.GetKind(), infra.GetName(), nm.OwnerRef.Kind, nm.OwnerRef.Name)
		default:
			cleanUp(ctx, c, data, infra)
			return nil, fmt.Errorf("creating machine %s: %w", nm.Name, err)
		}
	}
	fp.Hit(FailpointAfterMachine)

	before := data.DeepCopy()
	data.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(machine, clusterv1.GroupVersion.WithKind("Machine"))}
	if err := c.Patch(ctx, data, client.MergeFrom(before)); err != nil {
		return machine, fmt.Errorf("handing the bootstrap data of machine %s to the machine: %w", nm.Name, err)
	}
	return machine, nil
}

// createdLookupWait bounds how long a Machine whose create failed without
// a definite answer is looked for: a write whose answer was lost to a
// timeout or a broken connection may still commit. It is far above the time
// a committed write takes to be readable, and short enough for a reconcile
// to wait out.
const createdLookupWait = 15 * time.Second

// createdAnyway looks machine up, uncached, after its create returned
// createErr, and returns it if it exists and is the one that create sent
// (controlled by owner, with the same bootstrap data). A definite refusal
// (a 4xx answer other than a timeout) committed nothing, and one read
// settles it; after any other error it looks until createdLookupWait has
// passed. It returns an error only when no read was answered, so whether
// the Machine exists is unknown.
func createdAnyway(ctx context.Context, reader client.Reader, machine *clusterv1.Machine, owner metav1.OwnerReference, createErr error) (*clusterv1.Machine, error) {
	// The create's own context may be what timed out.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createdLookupWait)
	defer cancel()
	var found *clusterv1.Machine
	var lastErr error
	answered := false
	_ = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		got := &clusterv1.Machine{}
		err := reader.Get(ctx, client.ObjectKeyFromObject(machine), got)
		switch {
		case err == nil:
			answered = true
			if ref := metav1.GetControllerOf(got); ref != nil && ref.UID == owner.UID &&
				ptr.Deref(got.Spec.Bootstrap.DataSecretName, "") == ptr.Deref(machine.Spec.Bootstrap.DataSecretName, "") {
				found = got
			}
			return true, nil // someone else's Machine of that name will not become this one
		case apierrors.IsNotFound(err):
			answered = true
			return refusedOutright(createErr), nil
		default:
			lastErr = err
			return false, nil
		}
	})
	if found != nil || answered {
		return found, nil
	}
	return nil, fmt.Errorf("reading machine %s: %w", machine.Name, lastErr)
}

// refusedOutright reports whether err is an answer that the API server
// refused the request, which then changed nothing: a 4xx status other than
// a request timeout. Anything else (a timeout, a server error, a broken
// connection, the client's own deadline) may follow a write that commits.
func refusedOutright(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	code := status.Status().Code
	return code >= 400 && code < 500 && code != http.StatusRequestTimeout
}

// withBootstrapHooks adds the deletion hooks (I5) to the annotations of a
// machine whose bootstrap data starts a new etcd cluster. Its member is a
// voter from its first moment, and the only copy of etcd: deleted before
// the planner's AddHook step, which on a loaded host took minutes to land,
// the machine took etcd with it. Every other machine joins as a learner and
// gets the hooks before its promotion.
func withBootstrapHooks(annotations map[string]string, doc *bootstrap.Document) map[string]string {
	if doc == nil || doc.Etcd.Local == nil || doc.Etcd.Local.Mode != bootstrap.EtcdModeNew {
		return annotations
	}
	out := maps.Clone(annotations)
	if out == nil {
		out = map[string]string{}
	}
	for _, hook := range quorum.HookAnnotations {
		out[hook] = ""
	}
	return out
}

// cloneInfrastructure creates the machine's infrastructure machine from
// the template, owned by the owner (CAPI core moves it to the Machine, as
// it does for KubeadmControlPlane).
func cloneInfrastructure(ctx context.Context, c client.Client, live client.Reader, nm NewMachine) (*unstructured.Unstructured, error) {
	tmpl, err := GetTemplate(ctx, c, live, nm.InfraTemplate, nm.Owner.GetNamespace())
	if err != nil {
		return nil, err
	}
	owner := nm.OwnerRef
	if nm.InfraOwnerRef != nil {
		owner = *nm.InfraOwnerRef
	}
	infra, err := external.GenerateTemplate(&external.GenerateTemplateInput{
		Template:    tmpl,
		TemplateRef: &corev1.ObjectReference{APIVersion: tmpl.GetAPIVersion(), Kind: tmpl.GetKind(), Name: tmpl.GetName(), Namespace: tmpl.GetNamespace()},
		Namespace:   nm.Owner.GetNamespace(), Name: nm.Name, ClusterName: nm.Cluster.Name, OwnerRef: &owner,
		Labels: nm.Labels, Annotations: nm.InfraAnnotations,
	})
	if err != nil {
		return nil, err
	}
	if err := c.Create(ctx, infra); err != nil {
		return nil, err
	}
	return infra, nil
}

// cleanUp deletes what a failed CreateMachine made; what it cannot delete
// the owner still owns, and garbage collection takes with it.
func cleanUp(ctx context.Context, c client.Client, objs ...client.Object) {
	for _, o := range objs {
		if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			log.FromContext(ctx).Error(err, "Cleaning up after a failed machine creation", "object", o.GetName())
		}
	}
}

// BootstrapDataSecret returns the bootstrap data Secret of machine: doc as
// cloud-config (internal/cloudinit), which any infrastructure provider
// hands its machine, under CAPI's "value" key with format cloud-config,
// owned by the Machine, named after it. The caller names it in the
// Machine's spec.bootstrap.dataSecretName. With format qcp (bootstrap.Format)
// the value is the document itself, as QCP wrote it before cloud-config:
// qcp-manager --bootstrap-format=qcp stands in for such a manager, to show
// that its machines keep running and are replaced.
func BootstrapDataSecret(machine *clusterv1.Machine, doc *bootstrap.Document, format string) (*corev1.Secret, error) {
	data, err := bootstrap.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("bootstrap data of machine %s: %w", machine.Name, err)
	}
	switch format {
	case bootstrap.Format:
	case cloudinit.Format, "":
		format = cloudinit.Format
		if data, err = cloudinit.Build(data); err != nil {
			return nil, fmt.Errorf("bootstrap data of machine %s: %w", machine.Name, err)
		}
	default:
		return nil, fmt.Errorf("bootstrap data of machine %s: unknown format %q: use %q or %q", machine.Name, format, cloudinit.Format, bootstrap.Format)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: BootstrapDataSecretName(machine.Name), Namespace: machine.Namespace,
			Labels:          map[string]string{clusterv1.ClusterNameLabel: machine.Spec.ClusterName},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(machine, clusterv1.GroupVersion.WithKind("Machine"))},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": data, "format": []byte(format)},
	}, nil
}

// BootstrapDataSecretName is the name of machine's bootstrap data Secret.
func BootstrapDataSecretName(machine string) string { return machine + "-bootstrap" }
