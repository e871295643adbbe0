package localenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// With Options.Repository the management cluster is what `clusterctl init`
// makes of the release (`make release`): clusterctl installs CAPI core,
// CABPK, QCP's control plane provider and the process provider from the
// repository, with its provider inventory, the CRDs' clusterctl labels and
// the release's RBAC. What this host lacks beside a cluster is a kubelet,
// Service routing and cert-manager, so the environment does their part:
//   - the providers' Deployments never run; each manager runs as a host
//     process (startCAPI, startCABPK, StartManager);
//   - each webhook configuration and CRD conversion webhook clusterctl
//     installed calls its provider's host process instead of its Service
//     (pointWebhooksAtHosts), with the environment's serving CA where
//     cert-manager's CA injector would have put the CA of the Certificate
//     it names;
//   - cert-manager's CRDs are stand-ins that store Issuers and Certificates
//     and issue nothing (config/localenv), so that clusterctl init finds
//     cert-manager installed and never reaches for the internet.

// clusterctlInitTimeout bounds `clusterctl init`.
const clusterctlInitTimeout = 3 * time.Minute

// clusterctlInit installs the stand-ins for cert-manager's CRDs, runs
// `clusterctl init` with the repository's providers, and points the webhooks
// it installed at the host processes that serve them.
func (e *Env) clusterctlInit(ctx context.Context, opts Options, manifests string) error {
	if err := installCRDs(e.Config, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(manifests, "localenv")}, ErrorIfPathMissing: true,
	}); err != nil {
		return fmt.Errorf("installing the stand-ins for cert-manager's CRDs: %w", err)
	}
	path, err := binaries.Path("clusterctl", opts.CAPIVersion)
	if err != nil {
		return err
	}
	args := []string{"init", "--kubeconfig", e.Kubeconfig, "--config", opts.Repository,
		"--core", "cluster-api", "--bootstrap", "kubeadm", "--control-plane", "qcp"}
	if !opts.WithoutProcessProvider {
		args = append(args, "--infrastructure", "process")
	}
	home := filepath.Join(e.Dir, "clusterctl")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return err
	}
	log, err := os.Create(filepath.Join(e.Dir, "clusterctl-init.log"))
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	ctx, cancel := context.WithTimeout(ctx, clusterctlInitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	// clusterctl keeps its state under $HOME, and checks GitHub for a newer
	// version of itself unless told not to.
	cmd.Env = append(os.Environ(), "HOME="+home, "CLUSTERCTL_DISABLE_VERSIONCHECK=true")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("clusterctl %v (log: %s): %w", args, log.Name(), err)
	}
	return e.pointWebhooksAtHosts(ctx)
}

// webhookPorts are the host ports that serve each provider's webhooks, by
// the provider label clusterctl puts on every object it installs. One
// qcp-manager serves QCP's; the process provider has none.
func (e *Env) webhookPorts() map[string]int {
	return map[string]int{
		"cluster-api":       e.WebhookPort,
		"bootstrap-kubeadm": e.cabpkWebhookPort,
		"control-plane-qcp": e.QCPWebhookPort,
	}
}

// pointWebhooksAtHosts makes every admission and conversion webhook of the
// installed providers call the host process that serves it, and trust the
// environment's serving CA.
func (e *Env) pointWebhooksAtHosts(ctx context.Context) error {
	ports := e.webhookPorts()
	ca := e.env.WebhookInstallOptions.LocalServingCAData
	// hostConfig is the client configuration that reaches, on the host, what
	// cfg reaches through a Service of the provider labelled on obj.
	hostConfig := func(obj client.Object, svc *admissionregistrationv1.ServiceReference, path string) (*admissionregistrationv1.WebhookClientConfig, error) {
		provider := obj.GetLabels()[clusterv1.ProviderNameLabel]
		port, ok := ports[provider]
		if !ok || port == 0 {
			return nil, fmt.Errorf("%T %s calls Service %s/%s, but no host process serves provider %q's webhooks",
				obj, obj.GetName(), svc.Namespace, svc.Name, provider)
		}
		if svc.Path != nil {
			path = *svc.Path
		}
		url := "https://" + net.JoinHostPort(e.webhookHost, strconv.Itoa(port)) + path
		return &admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca}, nil
	}
	var mutating admissionregistrationv1.MutatingWebhookConfigurationList
	var validating admissionregistrationv1.ValidatingWebhookConfigurationList
	var crds apiextensionsv1.CustomResourceDefinitionList
	for _, list := range []client.ObjectList{&mutating, &validating, &crds} {
		if err := e.Client.List(ctx, list, client.HasLabels{clusterv1.ProviderNameLabel}); err != nil {
			return fmt.Errorf("listing what clusterctl installed: %w", err)
		}
	}
	// The admission webhooks' client configurations, by the configuration
	// that holds them.
	admission := map[client.Object][]*admissionregistrationv1.WebhookClientConfig{}
	for i := range mutating.Items {
		for j := range mutating.Items[i].Webhooks {
			admission[&mutating.Items[i]] = append(admission[&mutating.Items[i]], &mutating.Items[i].Webhooks[j].ClientConfig)
		}
	}
	for i := range validating.Items {
		for j := range validating.Items[i].Webhooks {
			admission[&validating.Items[i]] = append(admission[&validating.Items[i]], &validating.Items[i].Webhooks[j].ClientConfig)
		}
	}
	var updates []client.Object
	for obj, configs := range admission {
		for _, cc := range configs {
			if cc.Service == nil {
				continue
			}
			cfg, err := hostConfig(obj, cc.Service, "/")
			if err != nil {
				return err
			}
			*cc = *cfg
		}
		updates = append(updates, obj)
	}
	for i := range crds.Items {
		crd := &crds.Items[i]
		conv := crd.Spec.Conversion
		if conv == nil || conv.Strategy != apiextensionsv1.WebhookConverter || conv.Webhook == nil || conv.Webhook.ClientConfig == nil ||
			conv.Webhook.ClientConfig.Service == nil {
			continue
		}
		svc := conv.Webhook.ClientConfig.Service
		cfg, err := hostConfig(crd, &admissionregistrationv1.ServiceReference{Namespace: svc.Namespace, Name: svc.Name, Path: svc.Path}, "/convert")
		if err != nil {
			return err
		}
		conv.Webhook.ClientConfig = &apiextensionsv1.WebhookClientConfig{URL: cfg.URL, CABundle: cfg.CABundle}
		updates = append(updates, crd)
	}
	for _, obj := range updates {
		if err := e.Client.Update(ctx, obj); err != nil {
			return fmt.Errorf("pointing %T %s at its host process: %w", obj, obj.GetName(), err)
		}
	}
	return nil
}
