package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	etcdv1 "github.com/qcp-dev/qcp/api/etcd/v1alpha1"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/etcd"
)

// externalEtcdPoll is how often a control plane on external etcd looks
// again at what no watch reports: Secrets it waits for, and whether
// endpoints QCP does not run answer.
const externalEtcdPoll = 10 * time.Second

// externalEtcd is the etcd a control plane with spec.etcd.external or
// spec.etcd.clusterRef uses: where it is, the material its API servers
// reach it with (seed 002's contract Secrets), and whether it can be used.
type externalEtcd struct {
	// source names it for humans: `EtcdCluster "x"`, or the endpoints.
	source    string
	endpoints []string
	// follow: the endpoints are an EtcdCluster's, whose members are
	// replaced; the agents follow its member list (static endpoints).
	follow bool
	// caCert, clientCert and clientKey are PEM, from <cluster>-etcd and
	// <cluster>-apiserver-etcd-client.
	caCert, clientCert, clientKey []byte
	// problem says why etcd cannot be used now; "" when it can. The planner
	// takes no step on the machines while it is set (see
	// quorum.State.ExternalEtcdProblem).
	problem string
}

// +kubebuilder:rbac:groups=etcd.cluster.x-k8s.io,resources=etcdclusters,verbs=get;list;watch

// observeExternalEtcd reads the external etcd of cp, or returns why the
// control plane must wait before it can start at all: the EtcdCluster is
// missing or not creationComplete yet, or a contract Secret is missing.
func (r *Reconciler) observeExternalEtcd(ctx context.Context, cluster *clusterv1.Cluster, cp *controlplanev1.QuorumControlPlane) (ext *externalEtcd, wait string, err error) {
	ext = &externalEtcd{}
	if ref := cp.Spec.Etcd.ClusterRef; ref != nil {
		ec := &etcdv1.EtcdCluster{}
		ext.source = fmt.Sprintf("EtcdCluster %q", ref.Name)
		switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: ref.Name}, ec); {
		case apierrors.IsNotFound(err):
			return nil, fmt.Sprintf("Waiting for %s (spec.etcd.clusterRef) to be created", ext.source), nil
		case err != nil:
			return nil, "", fmt.Errorf("reading %s: %w", ext.source, err)
		}
		if owner := ec.Labels[clusterv1.ClusterNameLabel]; owner != cluster.Name {
			return nil, fmt.Sprintf("%s belongs to Cluster %q, not %q; point spec.etcd.clusterRef at this cluster's EtcdCluster", ext.source, owner, cluster.Name), nil
		}
		if !ec.Status.CreationComplete || ec.Status.Endpoints == "" {
			return nil, fmt.Sprintf("Waiting for %s to report creationComplete (every member has passed a health check once); %s",
				ext.source, etcdClusterProgress(ec)), nil
		}
		ext.endpoints, ext.follow = strings.Split(ec.Status.Endpoints, ","), true
		if !conditions.IsTrue(ec, etcdv1.AvailableCondition) {
			ext.problem = fmt.Sprintf("%s is not available: %s", ext.source, conditionMessage(ec, etcdv1.AvailableCondition))
		}
	} else {
		ext.endpoints = cp.Spec.Etcd.External.Endpoints
		ext.source = "the etcd at " + strings.Join(ext.endpoints, ", ")
	}
	key := client.ObjectKeyFromObject(cluster)
	ca, err := secret.GetFromNamespacedName(ctx, r.Client, key, secret.EtcdCA)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Sprintf("Waiting for Secret %s, the CA of %s (tls.crt)", secret.Name(cluster.Name, secret.EtcdCA), ext.source), nil
	} else if err != nil {
		return nil, "", err
	}
	pair, err := secret.GetFromNamespacedName(ctx, r.Client, key, secret.APIServerEtcdClient)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Sprintf("Waiting for Secret %s, the API servers' client certificate and key for %s (tls.crt, tls.key)",
			secret.Name(cluster.Name, secret.APIServerEtcdClient), ext.source), nil
	} else if err != nil {
		return nil, "", err
	}
	ext.caCert, ext.clientCert, ext.clientKey = ca.Data[secret.TLSCrtDataName], pair.Data[secret.TLSCrtDataName], pair.Data[secret.TLSKeyDataName]
	if _, err := certs.ParseCert(ext.caCert); err != nil {
		return nil, fmt.Sprintf("Secret %s holds no CA certificate under tls.crt (%v); put the etcd CA's PEM certificate there", ca.Name, err), nil
	}
	if _, err := certs.ParseKeyPair(ext.clientCert, ext.clientKey); err != nil {
		return nil, fmt.Sprintf("Secret %s holds no valid tls.crt and tls.key pair (%v); put the API servers' etcd client certificate and key there", pair.Name, err), nil
	}
	if !ext.follow {
		ext.problem = r.checkEtcdConnectivity(ctx, cluster, ext)
	}
	return ext, "", nil
}

// checkEtcdConnectivity is the preflight for endpoints QCP does not run
// (seed 000): etcd's connectivity only, with the API servers' own client
// certificate. At least one endpoint must pass /health; it returns why
// none does.
func (r *Reconciler) checkEtcdConnectivity(ctx context.Context, cluster *clusterv1.Cluster, ext *externalEtcd) string {
	key := externalPoolKey(cluster)
	// A pair the owner replaced in the Secret takes the pooled client's
	// place: the old one's certificate may expire, and with it every new
	// connection the client makes.
	if held, ok := r.externalPairs.Load(key); ok && !bytes.Equal(held.([]byte), ext.clientCert) {
		if err := r.Etcd.Forget(key); err != nil {
			return err.Error()
		}
	}
	r.externalPairs.Store(key, ext.clientCert)
	cli, err := r.Etcd.Get(key, etcd.Config{Endpoints: ext.endpoints, CAPEM: ext.caCert, CertPEM: ext.clientCert, KeyPEM: ext.clientKey})
	if err != nil {
		return err.Error()
	}
	if !slices.Equal(cli.Endpoints(), ext.endpoints) {
		cli.SetEndpoints(ext.endpoints...)
	}
	var errs []error
	for _, ep := range ext.endpoints {
		err := cli.Health(ctx, ep)
		if err == nil {
			return ""
		}
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
	}
	return "no etcd endpoint passes /health: " + errors.Join(errs...).Error()
}

// externalPoolKey is the etcd pool's key for the client of the endpoints
// QCP does not run, apart from a stacked cluster's own.
func externalPoolKey(cluster *clusterv1.Cluster) string { return klogRef(cluster) + "/external" }

// etcdClusterProgress says how far an EtcdCluster's creation is, for the
// message of the control plane waiting for it.
func etcdClusterProgress(ec *etcdv1.EtcdCluster) string {
	healthy := 0
	for _, m := range ec.Status.Members {
		if m.Healthy {
			healthy++
		}
	}
	want := int32(0)
	if ec.Spec.Replicas != nil {
		want = *ec.Spec.Replicas
	}
	return fmt.Sprintf("%d of %d members healthy", healthy, want)
}

func conditionMessage(o conditions.Getter, t string) string {
	c := conditions.Get(o, t)
	if c == nil {
		return "not reported yet"
	}
	if c.Message == "" {
		return c.Reason
	}
	return c.Message
}

// setWaitingForExternalEtcd reports that the control plane cannot start
// before its external etcd is there: what it waits for, in
// EtcdClusterHealthy and Available.
func setWaitingForExternalEtcd(cp *controlplanev1.QuorumControlPlane, wait string) {
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.EtcdClusterHealthyCondition, Status: metav1.ConditionFalse,
		Reason: controlplanev1.EtcdClusterWaitingReason, Message: wait})
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.AvailableCondition, Status: metav1.ConditionFalse,
		Reason: controlplanev1.NotAvailableReason, Message: wait})
	if !conditions.IsTrue(cp, controlplanev1.InitializedCondition) {
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.InitializedCondition, Status: metav1.ConditionFalse,
			Reason: controlplanev1.NotInitializedReason, Message: wait})
	}
}

// setExternalEtcdHealthy reports external etcd in EtcdClusterHealthy:
// QCP does not run it, so the condition says whether it can be used.
func setExternalEtcdHealthy(cp *controlplanev1.QuorumControlPlane, ext *externalEtcd) {
	if ext.problem != "" {
		conditions.Set(cp, metav1.Condition{Type: controlplanev1.EtcdClusterHealthyCondition, Status: metav1.ConditionFalse,
			Reason: controlplanev1.EtcdClusterExternalReason, Message: ext.problem})
		return
	}
	conditions.Set(cp, metav1.Condition{Type: controlplanev1.EtcdClusterHealthyCondition, Status: metav1.ConditionTrue,
		Reason: controlplanev1.EtcdClusterExternalReason, Message: "etcd is " + ext.source + ", which QCP does not run here; it answers"})
}

// externalBootstrap is the etcd section of a machine's bootstrap data for
// ext: its API server reaches etcd with the contract's client pair.
func externalBootstrap(ext *externalEtcd) bootstrap.ExternalEtcd {
	return bootstrap.ExternalEtcd{Endpoints: ext.endpoints, FollowMembership: ext.follow,
		CACert: string(ext.caCert), ClientCert: string(ext.clientCert), ClientKey: string(ext.clientKey)}
}

// etcdClusterToControlPlanes maps an EtcdCluster to the control planes in
// its namespace whose spec.etcd.clusterRef names it.
func (r *Reconciler) etcdClusterToControlPlanes(ctx context.Context, o client.Object) []ctrl.Request {
	var list controlplanev1.QuorumControlPlaneList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []ctrl.Request
	for _, cp := range list.Items {
		if ref := cp.Spec.Etcd.ClusterRef; ref != nil && ref.Name == o.GetName() {
			out = append(out, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&cp)})
		}
	}
	return out
}
