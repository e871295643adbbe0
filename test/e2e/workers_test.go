package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/keyutil"
	"k8s.io/utils/ptr"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/certs"
	"github.com/qcp-dev/qcp/internal/scheme"
	"github.com/qcp-dev/qcp/internal/testkit"
)

// workerGroup is the API group of the worker infrastructure the scenario
// defines: a process machine cannot run a kubelet (there is no container
// runtime here), so a worker's machine provisions nothing and only reports
// a providerID and readiness, as the InfraMachine contract asks.
const workerGroup = "infrastructure.workers.test.qcp.dev"

// workerLabel is the kubelet flag the workers' KubeadmConfigTemplate sets.
const workerLabel = "qcp.dev/worker=true"

// TestWorkerJoin: a MachineDeployment whose bootstrap is CAPI's kubeadm
// bootstrap provider (CABPK) gets a worker Machine, and the worker joins
// the QCP cluster up to the line a kubelet would cross, with real parts:
// kubeadm's own discovery validates the signed cluster-info against the
// token and CA hash CABPK generated (and refuses a wrong hash), reading
// kubeadm-config and kubelet-config with the token; client-go's CSR helpers
// obtain an auto-approved node client certificate with the token; with only
// that certificate the node registers its Node under the worker Machine's
// providerID, keeps its Lease and is Ready, and CAPI core links the Machine
// to it; the certificate is then renewed through a CSR of the node's own.
// QCP's own Nodes carry the control-plane taint.
func TestWorkerJoin(t *testing.T) {
	mgmt := requireShared(t)
	testkit.RequireBinaries(t, "cabpk-manager")
	parallel(t, 3*time.Minute)
	s, cp := newScenarioWithoutControlPlane(t, mgmt, "workers", 1, failureDomains)
	c := workerClient(t, mgmt)
	s.c = mgmt.fenced(c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// A network of its own, before the control plane exists.
	s.setClusterNetwork(ctx, workerNetwork.services, workerNetwork.pods, workerNetwork.domain)
	s.create(ctx, cp)
	installInfrastructureKinds(ctx, t, c, workerGroup, "WorkerMachine", "WorkerMachineTemplate")
	provisioning, stop := context.WithCancel(ctx)
	defer stop()
	go provisionWorkers(provisioning, c)
	s.waitAvailable(convergeTimeout, 1)

	s.create(ctx,
		&bootstrapv1.KubeadmConfigTemplate{ObjectMeta: metav1.ObjectMeta{Name: s.name + "-workers", Namespace: ns},
			Spec: bootstrapv1.KubeadmConfigTemplateSpec{Template: bootstrapv1.KubeadmConfigTemplateResource{Spec: bootstrapv1.KubeadmConfigSpec{
				JoinConfiguration: bootstrapv1.JoinConfiguration{NodeRegistration: bootstrapv1.NodeRegistrationOptions{
					KubeletExtraArgs: []bootstrapv1.Arg{{Name: "node-labels", Value: ptr.To(workerLabel)}},
				}},
			}}}},
		workerMachineTemplate(s.name+"-workers"),
		&clusterv1.MachineDeployment{
			ObjectMeta: metav1.ObjectMeta{Name: s.name + "-workers", Namespace: ns},
			Spec: clusterv1.MachineDeploymentSpec{
				ClusterName: s.name,
				Replicas:    ptr.To[int32](1),
				Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
					ClusterName: s.name,
					Version:     binaries.KubeVersion,
					Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfigTemplate", Name: s.name + "-workers",
					}},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: workerGroup, Kind: "WorkerMachineTemplate", Name: s.name + "-workers",
					},
				}},
			},
		})

	var worker clusterv1.Machine
	var joinConfig []byte
	s.eventually(3*time.Minute, "a worker Machine with CABPK's bootstrap data and a providerID", func(ctx context.Context) error {
		var list clusterv1.MachineList
		if err := s.reader(ctx).List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: s.name + "-workers"}); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d worker Machines", len(list.Items))
		}
		worker = list.Items[0]
		if worker.Spec.Bootstrap.DataSecretName == nil || worker.Spec.ProviderID == "" {
			return fmt.Errorf("Machine %s: bootstrap data %v, providerID %q", worker.Name, worker.Spec.Bootstrap.DataSecretName, worker.Spec.ProviderID)
		}
		var data corev1.Secret
		if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: *worker.Spec.Bootstrap.DataSecretName}, &data); err != nil {
			return err
		}
		var err error
		joinConfig, err = kubeadmJoinConfiguration(data.Data["value"], worker.Name)
		return err
	})
	nodeName := worker.Name
	var join bootstrapv1.JoinConfiguration
	if err := yaml.Unmarshal(joinConfig, &join); err != nil {
		t.Fatalf("CABPK's join configuration: %v\n%s", err, joinConfig)
	}
	token := join.Discovery.BootstrapToken
	if token.Token == "" || token.APIServerEndpoint == "" || len(token.CACertHashes) != 1 {
		t.Fatalf("CABPK's discovery settings: %+v", token)
	}
	if args := join.NodeRegistration.KubeletExtraArgs; len(args) != 1 || ptr.Deref(args[0].Value, "") != workerLabel {
		t.Errorf("CABPK's kubelet flags %v; want the template's node-labels=%s", args, workerLabel)
	}
	t.Logf("CABPK: token %s…, endpoint %s, CA hashes %v", token.Token[:6], token.APIServerEndpoint, token.CACertHashes)

	// Discovery, by kubeadm itself: the JWS signature of cluster-info for
	// this token, the CA pinned by hash, then kubeadm-config and
	// kubelet-config read with the token.
	dir := t.TempDir()
	// kubeadm fails unless it validates cluster-info and reads
	// kubeadm-config and kubelet-config (kube-proxy's is optional).
	if out, err := kubeadmPreflight(ctx, dir, joinConfig); err != nil {
		t.Fatalf("kubeadm join phase preflight with CABPK's configuration: %v\n%s", err, out)
	}
	wrong := strings.Replace(string(joinConfig), token.CACertHashes[0], "sha256:"+strings.Repeat("0", 64), 1)
	out, err := kubeadmPreflight(ctx, dir, []byte(wrong))
	if err == nil || !strings.Contains(out, "none of the public keys") {
		t.Errorf("kubeadm join phase preflight with a wrong CA hash: err %v; want it to fail on the pin\n%s", err, out)
	}

	// TLS bootstrap with the token: an auto-approved node client
	// certificate.
	endpoint := "https://" + token.APIServerEndpoint
	ca := clusterCA(ctx, t, s)
	bootstrapClient := kubernetes.NewForConfigOrDie(&rest.Config{Host: endpoint, BearerToken: token.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca}, Timeout: 10 * time.Second})
	nodeCert, nodeKey := nodeClientCertificate(ctx, t, bootstrapClient, nodeName)

	// Registration with that certificate alone.
	node := kubernetes.NewForConfigOrDie(&rest.Config{Host: endpoint, Timeout: 10 * time.Second,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: nodeCert, KeyData: nodeKey}})
	registerWorkerNode(ctx, t, node, nodeName, worker.Spec.ProviderID)
	heartbeats, stopHeartbeats := context.WithCancel(ctx)
	defer stopHeartbeats()
	go keepNodeLease(heartbeats, node, nodeName)
	s.eventually(2*time.Minute, "CAPI core to link the worker Machine to its Node", func(ctx context.Context) error {
		var m clusterv1.Machine
		if err := s.reader(ctx).Get(ctx, client.ObjectKeyFromObject(&worker), &m); err != nil {
			return err
		}
		if m.Status.NodeRef.Name != nodeName {
			return fmt.Errorf("Machine %s: nodeRef %q", m.Name, m.Status.NodeRef.Name)
		}
		return nil
	})

	// Renewal: the node asks with its own certificate.
	renewedCert, renewedKey := nodeClientCertificate(ctx, t, node, nodeName)
	renewed := kubernetes.NewForConfigOrDie(&rest.Config{Host: endpoint, Timeout: 10 * time.Second,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: renewedCert, KeyData: renewedKey}})
	if _, err := renewed.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, nodeName, metav1.GetOptions{}); err != nil {
		t.Errorf("the renewed node certificate cannot read the node's own Lease: %v", err)
	}

	s.checkControlPlaneTaints(ctx)
	s.checkClusterNetwork(ctx, nodeName)
	s.checkWorkloadVersions(binaries.KubeVersion)
	s.checkAddons(ctx, nodeName)
	// Longer than the node monitor's grace period (20 s): the lease the
	// node keeps with its own certificate keeps it Ready.
	admin, err := s.workload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.holds(25*time.Second, "the worker Node Ready", func(ctx context.Context) error {
		n, err := admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("Node %s conditions %v", nodeName, n.Status.Conditions)
	})
	s.finish()
}

// keepNodeLease renews node name's Lease every 5 seconds as the node,
// as a kubelet does, until ctx ends.
func keepNodeLease(ctx context.Context, cs kubernetes.Interface, name string) {
	_ = wait.PollUntilContextCancel(ctx, 5*time.Second, false, func(ctx context.Context) (bool, error) {
		leases := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
		if lease, err := leases.Get(ctx, name, metav1.GetOptions{}); err == nil {
			lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
			_, _ = leases.Update(ctx, lease, metav1.UpdateOptions{})
		}
		return false, nil
	})
}

// kubeadmCoreDNS is the CoreDNS kubeadm installs for each Kubernetes
// version the scenarios run (constants.CoreDNSVersion of its release).
var kubeadmCoreDNS = map[string]string{binaries.PreviousKubeVersion: "v1.13.1", binaries.KubeVersion: "v1.14.2"}

// checkWorkloadVersions: kubeadm-config names version, kubelet-config
// exists, and the addons run kubeadm's images for version, down to the
// tags.
func (s *scenario) checkWorkloadVersions(version string) {
	s.t.Helper()
	s.eventually(2*time.Minute, "kubeadm-config, kubelet-config and the addons at "+version, func(ctx context.Context) error {
		cs, err := s.workload(ctx)
		if err != nil {
			return err
		}
		cfg, err := cs.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "kubeadm-config", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !strings.Contains(cfg.Data["ClusterConfiguration"], "kubernetesVersion: "+version+"\n") {
			return fmt.Errorf("kubeadm-config:\n%s", cfg.Data["ClusterConfiguration"])
		}
		if _, err := cs.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "kubelet-config", metav1.GetOptions{}); err != nil {
			return err
		}
		dns, err := cs.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if want := "registry.k8s.io/coredns/coredns:" + kubeadmCoreDNS[version]; dns.Spec.Template.Spec.Containers[0].Image != want {
			return fmt.Errorf("coredns runs %s; want %s", dns.Spec.Template.Spec.Containers[0].Image, want)
		}
		proxy, err := cs.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(ctx, "kube-proxy", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if want := "registry.k8s.io/kube-proxy:" + version; proxy.Spec.Template.Spec.Containers[0].Image != want {
			return fmt.Errorf("kube-proxy runs %s; want %s", proxy.Spec.Template.Spec.Containers[0].Image, want)
		}
		return nil
	})
}

// checkAddons: the DNS Service is on the tenth address of the range;
// kube-proxy's DaemonSet places its one pod on the worker, none on QCP's
// Nodes (which are Linux Nodes too, and tolerated); with kube-proxy
// disabled its objects are gone while CoreDNS's stay, and then CoreDNS's go
// too when it is disabled.
func (s *scenario) checkAddons(ctx context.Context, worker string) {
	s.t.Helper()
	cs, err := s.workload(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	s.checkServiceIP(ctx, cs, metav1.NamespaceSystem, "kube-dns", workerNetwork.dnsIP, "the tenth address of "+workerNetwork.services)
	s.eventually(time.Minute, "one kube-proxy pod, on the worker", func(ctx context.Context) error {
		pods, err := cs.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy"})
		if err != nil {
			return err
		}
		var nodes []string
		for _, p := range pods.Items {
			nodes = append(nodes, p.Spec.NodeName)
		}
		if len(nodes) != 1 || nodes[0] != worker {
			return fmt.Errorf("kube-proxy pods on Nodes %q; want one, on %s", nodes, worker)
		}
		return nil
	})
	s.patchControlPlane(ctx, func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Addons.KubeProxy.Disabled = true })
	s.eventually(time.Minute, "kube-proxy's objects gone once it is disabled", func(ctx context.Context) error {
		if _, err := cs.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(ctx, "kube-proxy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the kube-proxy DaemonSet: %v", err)
		}
		if _, err := cs.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "kube-proxy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the kube-proxy ConfigMap: %v", err)
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, "kubeadm:node-proxier", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the kubeadm:node-proxier binding: %v", err)
		}
		return nil
	})
	if _, err := cs.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, "coredns", metav1.GetOptions{}); err != nil {
		s.t.Errorf("CoreDNS, still enabled, lost its Deployment: %v", err)
	}
	s.patchControlPlane(ctx, func(cp *controlplanev1.QuorumControlPlane) { cp.Spec.Addons.CoreDNS.Disabled = true })
	s.eventually(time.Minute, "CoreDNS's objects gone once it is disabled", func(ctx context.Context) error {
		if _, err := cs.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, "coredns", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the coredns Deployment: %v", err)
		}
		if _, err := cs.CoreV1().Services(metav1.NamespaceSystem).Get(ctx, "kube-dns", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the kube-dns Service: %v", err)
		}
		return nil
	})
}

// workerNetwork is the scenario's Cluster's spec.clusterNetwork, none of
// it the default.
var workerNetwork = struct{ services, pods, domain, kubernetesIP, dnsIP string }{
	"10.128.0.0/16", "192.168.0.0/16", "qcp.test", "10.128.0.1", "10.128.0.10",
}

// checkServiceIP: the Service ns/name has the cluster IP want (which is
// what, for the message).
func (s *scenario) checkServiceIP(ctx context.Context, cs kubernetes.Interface, ns, name, want, what string) {
	s.t.Helper()
	svc, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if svc.Spec.ClusterIP != want {
		s.t.Errorf("Service %s/%s has %s; want %s, %s", ns, name, svc.Spec.ClusterIP, want, what)
	}
}

// setClusterNetwork sets the scenario's Cluster's spec.clusterNetwork.
func (s *scenario) setClusterNetwork(ctx context.Context, services, pods, domain string) {
	s.t.Helper()
	s.patchCluster(ctx, func(c *clusterv1.Cluster) {
		c.Spec.ClusterNetwork.Services.CIDRBlocks = []string{services}
		c.Spec.ClusterNetwork.Pods.CIDRBlocks = []string{pods}
		c.Spec.ClusterNetwork.ServiceDomain = domain
	})
}

// checkClusterNetwork: the cluster runs the Cluster's network (the
// kubernetes Service from its range, kubelet-config's DNS address and
// domain, node IPAM giving the worker Node a pod range), and a change of
// the range afterwards is reported, not applied: no machine rolls.
func (s *scenario) checkClusterNetwork(ctx context.Context, worker string) {
	s.t.Helper()
	cs, err := s.workload(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	s.checkServiceIP(ctx, cs, metav1.NamespaceDefault, "kubernetes", workerNetwork.kubernetesIP, "the first address of "+workerNetwork.services)
	kubelet, err := cs.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, "kubelet-config", metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if cfg := kubelet.Data["kubelet"]; !strings.Contains(cfg, "- "+workerNetwork.dnsIP) || !strings.Contains(cfg, "clusterDomain: "+workerNetwork.domain) {
		s.t.Errorf("kubelet-config does not name DNS at %s in %s:\n%s", workerNetwork.dnsIP, workerNetwork.domain, cfg)
	}
	s.eventually(time.Minute, "node IPAM to give the worker Node a pod range", func(ctx context.Context) error {
		n, err := cs.CoreV1().Nodes().Get(ctx, worker, metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, pods, _ := net.ParseCIDR(workerNetwork.pods)
		ip, _, err := net.ParseCIDR(n.Spec.PodCIDR)
		if err != nil || !pods.Contains(ip) {
			return fmt.Errorf("Node %s has pod range %q; want one from %s", worker, n.Spec.PodCIDR, workerNetwork.pods)
		}
		return nil
	})

	machines, err := s.machines(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	s.setClusterNetwork(ctx, "10.129.0.0/16", workerNetwork.pods, workerNetwork.domain)
	s.eventually(time.Minute, "ClusterNetworkApplied False, naming the changed field", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		c := conditions.Get(cp, controlplanev1.ClusterNetworkAppliedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != controlplanev1.ClusterNetworkChangeNotSupportedReason ||
			!strings.Contains(c.Message, `spec.clusterNetwork.services.cidrBlocks changed from "10.128.0.0/16" to "10.129.0.0/16"`) {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	s.holds(10*time.Second, "the same machines after the refused change", func(ctx context.Context) error {
		now, err := s.machines(ctx)
		if err != nil {
			return err
		}
		if len(now) != len(machines) || now[0].UID != machines[0].UID || now[0].Spec.Bootstrap.DataSecretName == nil ||
			*now[0].Spec.Bootstrap.DataSecretName != *machines[0].Spec.Bootstrap.DataSecretName {
			return fmt.Errorf("%d machines, the first %s; were %d, the first %s", len(now), now[0].Name, len(machines), machines[0].Name)
		}
		return nil
	})
	s.setClusterNetwork(ctx, workerNetwork.services, workerNetwork.pods, workerNetwork.domain)
	s.eventually(time.Minute, "ClusterNetworkApplied True once the Cluster asks for its network again", func(ctx context.Context) error {
		cp, err := s.controlPlane(ctx)
		if err != nil {
			return err
		}
		if !conditions.IsTrue(cp, controlplanev1.ClusterNetworkAppliedCondition) {
			return fmt.Errorf("condition %+v", conditions.Get(cp, controlplanev1.ClusterNetworkAppliedCondition))
		}
		return nil
	})
}

// workerClient is a management client that also knows CABPK's types and
// CRDs.
func workerClient(t *testing.T, mgmt *management) client.Client {
	sch := scheme.New()
	if err := bootstrapv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(mgmt.env.Config, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// installInfrastructureKinds creates the CRDs of kinds in group, version
// v1alpha1, labelled with the contract they follow, once for the
// management cluster, and waits until they are served. As a provider whose
// group CAPI core's own role does not name must, it also aggregates the
// permissions CAPI core needs on its kinds into CAPI core's role, and waits
// until they are there: CAPI core runs as its release's ServiceAccount.
func installInfrastructureKinds(ctx context.Context, t *testing.T, c client.Client, group string, kinds ...string) {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + group + "-capi", Labels: map[string]string{"cluster.x-k8s.io/aggregate-to-manager": "true"}},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{group}, Resources: []string{"*"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	}
	if err := c.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var capi rbacv1.ClusterRole
		if err := c.Get(ctx, client.ObjectKey{Name: "capi-aggregated-manager-role"}, &capi); err != nil {
			return false, nil
		}
		return slices.ContainsFunc(capi.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.APIGroups, group) }), nil
	})
	if err != nil {
		t.Fatalf("CAPI core's role did not take in the permissions on %s: %v", group, err)
	}
	for _, kind := range kinds {
		plural := strings.ToLower(kind) + "s"
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group, Labels: map[string]string{"cluster.x-k8s.io/v1beta2": "v1alpha1"}},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: group, Scope: apiextensionsv1.NamespaceScoped,
				Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: kind, ListKind: kind + "List", Plural: plural, Singular: strings.ToLower(kind)},
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1alpha1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object", XPreserveUnknownFields: ptr.To(true)}},
					Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				}},
			},
		}
		if err := c.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			list := &unstructured.UnstructuredList{}
			list.SetAPIVersion(group + "/v1alpha1")
			list.SetKind(kind + "List")
			return c.List(ctx, list, client.InNamespace(ns)) == nil, nil
		})
		if err != nil {
			t.Fatalf("the %s CRD is not served: %v", kind, err)
		}
	}
}

// workerMachineTemplate is a WorkerMachineTemplate named name.
func workerMachineTemplate(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": workerGroup + "/v1alpha1", "kind": "WorkerMachineTemplate",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{}}},
	}}
	return u
}

// provisionWorkers is the worker infrastructure's controller: it gives
// every WorkerMachine a providerID and reports it provisioned, until ctx
// ends.
func provisionWorkers(ctx context.Context, c client.Client) {
	_ = wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion(workerGroup + "/v1alpha1")
		list.SetKind("WorkerMachineList")
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			return false, nil
		}
		for i := range list.Items {
			m := &list.Items[i]
			if id, _, _ := unstructured.NestedString(m.Object, "spec", "providerID"); id == "" {
				patch := []byte(fmt.Sprintf(`{"spec":{"providerID":"worker://%s/%s"}}`, m.GetNamespace(), m.GetName()))
				_ = c.Patch(ctx, m, client.RawPatch("application/merge-patch+json", patch))
				continue
			}
			if done, _, _ := unstructured.NestedBool(m.Object, "status", "initialization", "provisioned"); !done {
				patch := []byte(`{"status":{"initialization":{"provisioned":true}}}`)
				_ = c.Status().Patch(ctx, m, client.RawPatch("application/merge-patch+json", patch))
			}
		}
		return false, nil
	})
}

// kubeadmJoinConfiguration is the JoinConfiguration file of CABPK's
// cloud-config, with the host name cloud-init would fill in.
func kubeadmJoinConfiguration(value []byte, hostname string) ([]byte, error) {
	var cloudConfig struct {
		WriteFiles []struct {
			Path     string `json:"path"`
			Content  string `json:"content"`
			Encoding string `json:"encoding"`
		} `json:"write_files"`
	}
	if err := yaml.Unmarshal(value, &cloudConfig); err != nil {
		return nil, fmt.Errorf("CABPK's bootstrap data is not cloud-config: %w", err)
	}
	for _, f := range cloudConfig.WriteFiles {
		if f.Path == "/run/kubeadm/kubeadm-join-config.yaml" {
			if f.Encoding != "" {
				return nil, fmt.Errorf("the join configuration is encoded %q", f.Encoding)
			}
			return []byte(strings.ReplaceAll(f.Content, "{{ ds.meta_data.local_hostname }}", hostname)), nil
		}
	}
	return nil, fmt.Errorf("CABPK's bootstrap data has no /run/kubeadm/kubeadm-join-config.yaml")
}

// kubeadmPreflight runs `kubeadm join phase preflight` with config, every
// host check a warning (this host runs no kubelet or container runtime):
// what is left is discovery and reading the cluster's configuration.
func kubeadmPreflight(ctx context.Context, dir string, config []byte) (string, error) {
	path := filepath.Join(dir, "join.yaml")
	if err := os.WriteFile(path, config, 0o600); err != nil {
		return "", err
	}
	kube, err := binaries.Path("kube", binaries.KubeVersion)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, kube, "kubeadm", "join", "phase", "preflight", "--config", path,
		"--ignore-preflight-errors=all").CombinedOutput()
	return string(out), err
}

// clusterCA is the cluster CA from <cluster>-ca.
func clusterCA(ctx context.Context, t *testing.T, s *scenario) []byte {
	var sec corev1.Secret
	if err := s.reader(ctx).Get(ctx, client.ObjectKey{Namespace: ns, Name: secret.Name(s.name, secret.ClusterCA)}, &sec); err != nil {
		t.Fatal(err)
	}
	return sec.Data[secret.TLSCrtDataName]
}

// nodeClientCertificate asks through cs, as a kubelet does, for a client
// certificate of node name, and returns it once approved and signed.
func nodeClientCertificate(ctx context.Context, t testing.TB, cs kubernetes.Interface, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	request, err := certutil.MakeCSR(key, &pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	reqName, reqUID, err := csr.RequestCertificateWithContext(ctx, cs, request, "", certificatesv1.KubeAPIServerClientKubeletSignerName, nil, usages, key)
	if err != nil {
		t.Fatalf("requesting a node client certificate: %v", err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	certPEM, err = csr.WaitForCertificate(waitCtx, cs, reqName, reqUID)
	if err != nil {
		t.Fatalf("waiting for CSR %s to be approved and signed: %v", reqName, err)
	}
	c, err := certs.ParseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject.CommonName != "system:node:"+name {
		t.Fatalf("CSR %s signed for %q", reqName, c.Subject.CommonName)
	}
	keyPEM, err = keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

// registerWorkerNode does what a kubelet does at start, as the node: its
// Node with providerID, its Lease, and a Ready status; and checks it sees
// its own Node back.
func registerWorkerNode(ctx context.Context, t *testing.T, cs kubernetes.Interface, name, providerID string) {
	t.Helper()
	_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
		Spec:       corev1.NodeSpec{ProviderID: providerID},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("registering Node %s with its own certificate: %v", name, err)
	}
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
	}
	if lease, err = cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Node %s's Lease: %v", name, err)
	}
	lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
	if _, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("renewing Node %s's Lease: %v", name, err)
	}
	// Node IPAM, the node lifecycle controller and CAPI core write the
	// Node too. A patch of its status, as a kubelet sends: an update of a
	// copy read before the lifecycle controller tainted the Node is refused
	// by NodeRestriction (a node may not modify its taints), not as a
	// conflict, and so was never retried.
	heartbeat := metav1.Now()
	// What a kubelet reports of its machine: without room for pods the
	// scheduler binds nothing here.
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("110")}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"capacity": capacity, "allocatable": capacity,
		"conditions": []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "the scenario's stand-in for a kubelet", LastHeartbeatTime: heartbeat, LastTransitionTime: heartbeat}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err = cs.CoreV1().Nodes().PatchStatus(ctx, name, patch); err != nil {
		t.Fatalf("reporting Node %s Ready: %v", name, err)
	}
}

// checkControlPlaneTaints: every Node of the control plane's machines
// carries kubeadm's control-plane taint.
func (s *scenario) checkControlPlaneTaints(ctx context.Context) {
	s.t.Helper()
	s.eventually(time.Minute, "the control-plane taint on QCP's Nodes", func(ctx context.Context) error {
		machines, err := s.machines(ctx)
		if err != nil {
			return err
		}
		cs, err := s.workload(ctx)
		if err != nil {
			return err
		}
		for _, m := range machines {
			n, err := cs.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !testkit.HasControlPlaneTaint(n) {
				return fmt.Errorf("Node %s has taints %v", n.Name, n.Spec.Taints)
			}
		}
		return nil
	})
}
