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

// QCP's webhooks are served by qcp-manager, not by CAPI core, yet envtest
// points every configuration it installs at its one serving port. So envtest
// installs only CAPI's, and the environment installs QCP's itself: same
// envtest-generated serving certificate and CA, but qcp-manager's own port.

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
// restarted manager serves where the configurations already point. The port
// is below the kernel's ephemeral range: while the manager is down (a crash
// test kills it), a port in that range can be handed to any outgoing
// connection, and the restarted manager could then not bind it.
func (e *Env) allocateQCPWebhookPort() error {
	e.webhookHost = e.env.WebhookInstallOptions.LocalServingHost
	low := ephemeralLow()
	var err error
	for range 100 {
		port := low - 1 - rand.IntN(stablePorts)
		var l net.Listener
		if l, err = net.Listen("tcp", net.JoinHostPort(e.webhookHost, strconv.Itoa(port))); err == nil {
			_ = l.Close()
			e.QCPWebhookPort = port
			return nil
		}
	}
	return fmt.Errorf("finding a free port below %d for qcp-manager's webhooks on %s: %w", low, e.webhookHost, err)
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
func (e *Env) installQCPWebhooks(ctx context.Context, manager *Process) error {
	serving := e.env.WebhookInstallOptions
	opts := envtest.WebhookInstallOptions{
		LocalServingHost:   e.webhookHost,
		LocalServingPort:   e.QCPWebhookPort,
		LocalServingCAData: serving.LocalServingCAData,
	}
	var err error
	if opts.MutatingWebhooks, opts.ValidatingWebhooks, err = e.qcpWebhookConfigurations(); err != nil {
		return err
	}
	// With the CA given, Install neither makes a new certificate nor
	// rewrites the client configs; ModifyWebhookDefinitions points them at
	// qcp-manager.
	if err := opts.ModifyWebhookDefinitions(); err != nil {
		return fmt.Errorf("pointing QCP's webhook configurations at qcp-manager: %w", err)
	}
	if err := opts.Install(e.Config); err != nil {
		return fmt.Errorf("installing QCP's webhook configurations: %w", err)
	}
	return e.waitForQCPAdmission(ctx, manager)
}

// qcpWebhookConfigurations reads config/webhook/manifests.yaml.
func (e *Env) qcpWebhookConfigurations() (
	mutating []*admissionregistrationv1.MutatingWebhookConfiguration,
	validating []*admissionregistrationv1.ValidatingWebhookConfiguration,
	err error,
) {
	data, err := config.Manifests.ReadFile("webhook/manifests.yaml")
	if err != nil {
		return nil, nil, fmt.Errorf("reading QCP's webhook manifests: %w", err)
	}
	decoder := serializer.NewCodecFactory(e.Scheme).UniversalDeserializer()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return mutating, validating, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("splitting QCP's webhook manifests: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("decoding QCP's webhook manifests: %w", err)
		}
		switch cfg := obj.(type) {
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			cfg.Name = qcpWebhookNamePrefix + cfg.Name
			mutating = append(mutating, cfg)
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			cfg.Name = qcpWebhookNamePrefix + cfg.Name
			validating = append(validating, cfg)
		default:
			return nil, nil, fmt.Errorf("QCP's webhook manifests hold an unexpected %T", obj)
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
