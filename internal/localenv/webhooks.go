package localenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	controlplanev1 "github.com/qcp-dev/qcp/api/controlplane/v1alpha1"
	"github.com/qcp-dev/qcp/config"
)

// QCP's webhooks are served by qcp-manager, and CABPK's by CABPK, not by CAPI
// core, yet envtest points every configuration it installs at its one serving
// port. So envtest installs only CAPI core's, and the environment installs
// the others itself: same envtest-generated serving certificate and CA, but
// each manager's own port.

// qcpWebhookNamePrefix keeps QCP's configurations apart from CAPI core's:
// controller-gen names both "mutating-webhook-configuration" (a real
// deployment's kustomize namePrefix does the same job).
const qcpWebhookNamePrefix = "qcp-"

// qcpWebhookArgs are the qcp-manager flags that serve the webhooks where the
// installed configurations point.
func (e *Env) qcpWebhookArgs() []string {
	return []string{
		"--webhook-host=" + e.webhookHost,
		"--webhook-port=" + strconv.Itoa(e.QCPWebhookPort),
		"--webhook-cert-dir=" + e.WebhookCertDir,
	}
}

// allocateQCPWebhookPort picks qcp-manager's webhook port once, so that a
// restarted manager serves where the configurations already point.
func (e *Env) allocateQCPWebhookPort() (err error) {
	e.webhookHost = e.env.WebhookInstallOptions.LocalServingHost
	e.QCPWebhookPort, err = stablePort(e.webhookHost)
	return err
}

// stablePort finds a free port on host for a long-lived listener. It is
// below the kernel's ephemeral range: while its server is down (a crash
// test kills qcp-manager), a port in that range can be handed to any
// outgoing connection, and the restarted server could then not bind it.
func stablePort(host string) (int, error) {
	low := ephemeralLow()
	var err error
	for range 100 {
		port := low - 1 - rand.IntN(stablePorts)
		var l net.Listener
		if l, err = net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port))); err == nil {
			_ = l.Close()
			return port, nil
		}
	}
	return 0, fmt.Errorf("finding a free port below %d on %s: %w", low, host, err)
}

// stablePorts is how many ports below the ephemeral range long-lived
// listeners are picked from.
const stablePorts = 8000

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default if it cannot be read).
func ephemeralLow() int {
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil && low > stablePorts+1024 {
				return low
			}
		}
	}
	return 32768
}

// installQCPWebhooks creates or updates QCP's webhook configurations and
// waits until the API server calls them, served by manager.
// With a repository, clusterctl installed them, pointed at the same port.
func (e *Env) installQCPWebhooks(ctx context.Context, manager *Process) error {
	if e.opts.Repository == "" {
		if err := e.installWebhooks("webhook/manifests.yaml", qcpWebhookNamePrefix, e.QCPWebhookPort); err != nil {
			return err
		}
	}
	return e.waitForQCPAdmission(ctx, manager)
}

// installWebhooks creates or updates the webhook configurations in the
// embedded manifests at path, named with prefix, pointed at port on the
// webhook host: same envtest-generated serving certificate and CA as CAPI
// core's.
func (e *Env) installWebhooks(path, prefix string, port int) error {
	opts := envtest.WebhookInstallOptions{
		LocalServingHost:   e.webhookHost,
		LocalServingPort:   port,
		LocalServingCAData: e.env.WebhookInstallOptions.LocalServingCAData,
	}
	var err error
	if opts.MutatingWebhooks, opts.ValidatingWebhooks, err = e.webhookConfigurations(path, prefix); err != nil {
		return err
	}
	// With the CA given, Install neither makes a new certificate nor
	// rewrites the client configs; ModifyWebhookDefinitions points them at
	// the port.
	if err := opts.ModifyWebhookDefinitions(); err != nil {
		return fmt.Errorf("pointing the webhook configurations of %s at port %d: %w", path, port, err)
	}
	if err := opts.Install(e.Config); err != nil {
		return fmt.Errorf("installing the webhook configurations of %s: %w", path, err)
	}
	return nil
}

// webhookConfigurations reads the embedded webhook manifests at path and
// names each configuration with prefix.
func (e *Env) webhookConfigurations(path, prefix string) (
	mutating []*admissionregistrationv1.MutatingWebhookConfiguration,
	validating []*admissionregistrationv1.ValidatingWebhookConfiguration,
	err error,
) {
	data, err := config.Manifests.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading webhook manifests: %w", err)
	}
	decoder := serializer.NewCodecFactory(e.Scheme).UniversalDeserializer()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return mutating, validating, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("splitting %s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("decoding %s: %w", path, err)
		}
		switch cfg := obj.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			cfg.Name = prefix + cfg.Name
			mutating = append(mutating, cfg)
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			cfg.Name = prefix + cfg.Name
			validating = append(validating, cfg)
		default:
			return nil, nil, fmt.Errorf("%s holds an unexpected %T", path, obj)
		}
	}
}

// waitForQCPAdmission waits until the API server both defaults and validates
// QuorumControlPlanes through qcp-manager. The configuration objects exist at
// once, but the API server loads them asynchronously; until it has, requests
// would be admitted unchecked. Server-side dry runs show when it has, and
// store nothing.
func (e *Env) waitForQCPAdmission(ctx context.Context, manager *Process) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if manager.Exited() {
			return false, fmt.Errorf("qcp-manager exited (%v) before the API server called its webhooks", manager.Err())
		}
		defaulted := admissionProbe(nil)
		if err := e.Client.Create(ctx, defaulted, client.DryRunAll); err != nil {
			last = "dry-run create of a valid QuorumControlPlane: " + err.Error()
			return false, nil
		}
		if defaulted.Spec.Replicas == nil {
			last = "the API server did not call the defaulting webhook yet"
			return false, nil
		}
		even := int32(2)
		err := e.Client.Create(ctx, admissionProbe(&even), client.DryRunAll)
		if !apierrors.IsInvalid(err) {
			last = fmt.Sprintf("the API server did not call the validating webhook yet (an even stacked replica count got %v)", err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the API server to call qcp-manager's webhooks (last: %s; log: %s/qcp-manager.log): %w", last, e.Dir, err)
	}
	return nil
}

// admissionProbe is a QuorumControlPlane that only dry runs ever submit.
func admissionProbe(replicas *int32) *controlplanev1.QuorumControlPlane {
	return &controlplanev1.QuorumControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "qcp-admission-probe", Namespace: metav1.NamespaceDefault},
		Spec: controlplanev1.QuorumControlPlaneSpec{
			Replicas: replicas,
			Version:  "v1.36.3",
			MachineTemplate: controlplanev1.QuorumControlPlaneMachineTemplate{
				Spec: controlplanev1.QuorumControlPlaneMachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "ProcessMachineTemplate", Name: "qcp-admission-probe",
					},
				},
			},
		},
	}
}
