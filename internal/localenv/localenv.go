// Package localenv runs a local management cluster: etcd and kube-apiserver
// (controller-runtime's envtest, pointed at the pinned binaries), CAPI core's
// and QCP's CRDs, kube-controller-manager for garbage collection, and the
// CAPI core manager and qcp-manager as child processes, the managers each
// serving its own admission webhooks. Tests and `qcpctl up` share it.
package localenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	infrav1 "github.com/qcp-dev/qcp/api/infrastructure/v1alpha1"
	"github.com/qcp-dev/qcp/config"
	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/machinehost"
	"github.com/qcp-dev/qcp/internal/scheme"
	"k8s.io/apimachinery/pkg/runtime"
)

// Options configures a local management cluster. The zero value starts the
// pinned versions with CAPI core running.
type Options struct {
	// Dir holds the kubeconfig, manifests, certificates and logs. Empty means
	// a new temporary directory, removed on Stop.
	Dir string
	// KubeVersion, EtcdVersion and CAPIVersion choose the binaries.
	KubeVersion, EtcdVersion, CAPIVersion string
	// WithoutCAPI skips the CAPI core manager.
	WithoutCAPI bool
	// WithKubeadmBootstrap also runs CAPI's kubeadm bootstrap provider
	// (CABPK, from CAPIVersion), for worker Machines that join with kubeadm.
	WithKubeadmBootstrap bool
	// WithoutProcessProvider leaves the process provider's CRDs out, as in a
	// management cluster that runs QCP on another infrastructure provider.
	WithoutProcessProvider bool
	// Repository is the clusterctl configuration of a release (`make
	// release`'s out/clusterctl.yaml). If set, `clusterctl init` installs
	// CAPI core, CABPK, QCP and the process provider from it (clusterctl.go),
	// instead of the environment applying the CRDs and webhooks it embeds.
	Repository string
}

// Env is a running local management cluster.
type Env struct {
	// Config reaches the management kube-apiserver as an administrator.
	Config *rest.Config
	// Client is a client for Config with Scheme.
	Client client.Client
	// Scheme knows the Kubernetes, CAPI core and QCP types.
	Scheme *runtime.Scheme
	// Dir is where the environment keeps its files.
	Dir string
	// Kubeconfig is the path of an administrator kubeconfig.
	Kubeconfig string
	// WebhookPort and WebhookCertDir are where CAPI core serves webhooks.
	WebhookPort    int
	WebhookCertDir string
	// QCPWebhookPort is where qcp-manager serves QCP's webhooks, with the
	// same serving certificate as CAPI core.
	QCPWebhookPort int

	env *envtest.Environment
	// apiserverLog holds the management kube-apiserver's output.
	apiserverLog *os.File
	webhookHost  string
	capi         *Process
	cabpk        *Process
	// cabpkWebhookPort is where CABPK serves its webhooks.
	cabpkWebhookPort int
	gc               *Process
	managers         []*Process
	// managerRoles are the roles qcp-manager's ServiceAccount was last
	// bound to (managerKubeconfig).
	managerRoles []rbacv1.ClusterRole
	// capiIdentities are CAPI core's and CABPK's, by log name, when they
	// run as the release's ServiceAccounts (capiManagerRun).
	capiIdentities map[string]managerIdentity
	ownsDir        bool
	// opts are the options Start was given, for starting CAPI core again.
	opts Options
	// imageMu guards imageBinDir and imageAgent: the bin directory and
	// agent the machine image was last installed from
	// (installMachineImage).
	imageMu                 sync.Mutex
	imageBinDir, imageAgent string
}

// Start starts the management cluster, its garbage collector and, unless
// told not to, CAPI core (and CABPK if asked), and returns once all serve. On error everything
// started is stopped.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	opts = withDefaults(opts)
	e := &Env{Scheme: scheme.New(), Dir: opts.Dir, opts: opts}
	// The environment reads and edits CRDs (clusterctl.go).
	if err := apiextensionsv1.AddToScheme(e.Scheme); err != nil {
		return nil, err
	}
	if e.Dir == "" {
		if e.Dir, err = os.MkdirTemp("", "qcp-localenv-"); err != nil {
			return nil, fmt.Errorf("creating the local environment's directory: %w", err)
		}
		e.ownsDir = true
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Stop())
		}
	}()
	if err := os.MkdirAll(e.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", e.Dir, err)
	}
	if err := e.startAPIServer(opts); err != nil {
		return nil, err
	}
	if opts.Repository != "" {
		if e.cabpkWebhookPort, err = stablePort(e.webhookHost); err != nil {
			return nil, err
		}
		if err := e.clusterctlInit(ctx, opts, filepath.Join(e.Dir, "manifests")); err != nil {
			return nil, err
		}
	}
	// The garbage collector starts alongside CAPI core rather than before
	// it, so that it adds little to the start-up time.
	gcStarted := make(chan error, 1)
	go func() { gcStarted <- e.startControllerManager(ctx, opts) }()
	var capiErr error
	if !opts.WithoutCAPI {
		capiErr = e.startCAPI(ctx, opts)
	}
	if capiErr == nil && opts.WithKubeadmBootstrap {
		capiErr = e.startCABPK(ctx, opts)
	}
	if err := errors.Join(capiErr, <-gcStarted); err != nil {
		return nil, err
	}
	return e, nil
}

func withDefaults(o Options) Options {
	if o.KubeVersion == "" {
		o.KubeVersion = binaries.KubeVersion
	}
	if o.EtcdVersion == "" {
		o.EtcdVersion = binaries.EtcdVersion
	}
	if o.CAPIVersion == "" {
		o.CAPIVersion = binaries.CAPIVersion
	}
	return o
}

func (e *Env) startAPIServer(opts Options) error {
	etcdPath, err := binaries.Path("etcd", opts.EtcdVersion)
	if err != nil {
		return err
	}
	kubePath, err := binaries.Path("kube", opts.KubeVersion)
	if err != nil {
		return err
	}
	manifests, err := e.writeManifests(opts.WithoutProcessProvider)
	if err != nil {
		return err
	}
	// The multi-call kube binary picks its component from the name it is run
	// by, and envtest runs "kube-apiserver".
	apiserverLink := filepath.Join(e.Dir, "kube-apiserver")
	_ = os.Remove(apiserverLink)
	if err := os.Symlink(kubePath, apiserverLink); err != nil {
		return fmt.Errorf("linking kube-apiserver: %w", err)
	}
	e.env = &envtest.Environment{
		Scheme: e.Scheme,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(manifests, "capi", "webhook-manifests.yaml")},
			// CAPI's CRDs convert between v1beta1 and v1beta2 through its
			// webhook; without it v1beta1 objects silently lose fields.
			IgnoreSchemeConvertible: true,
		},
		ControlPlaneStartTimeout: controlPlaneStartTimeout,
		ControlPlaneStopTimeout:  time.Minute,
	}
	if opts.Repository != "" {
		// clusterctl installs them; envtest only makes the webhooks'
		// serving certificate.
		e.env.WebhookInstallOptions.Paths = nil
	}
	apiserver := e.env.ControlPlane.GetAPIServer()
	apiserver.Path = apiserverLink
	// Its output goes to a log of its own, which a start that timed out
	// quotes: envtest discards it.
	if e.apiserverLog, err = os.OpenFile(filepath.Join(e.Dir, apiserverLogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
		return fmt.Errorf("opening the management kube-apiserver's log: %w", err)
	}
	apiserver.Out, apiserver.Err = e.apiserverLog, e.apiserverLog
	// Certificates in a directory of the environment's own, not in one
	// envtest removes when the API server stops: then StartAPIServer serves
	// the same certificates, and every client reconnects. Fresh ones each
	// Start: envtest reads the serving CA only when it writes them.
	apiserver.CertDir = filepath.Join(e.Dir, "apiserver")
	if err := os.RemoveAll(apiserver.CertDir); err != nil {
		return err
	}
	if err := os.MkdirAll(apiserver.CertDir, 0o700); err != nil {
		return err
	}
	e.env.ControlPlane.Etcd = &envtest.Etcd{Path: etcdPath}
	cfg, err := e.env.Start()
	if err != nil {
		return fmt.Errorf("starting the management kube-apiserver and etcd: %w%s", err, e.apiserverLogTail())
	}
	e.Config = cfg
	if opts.Repository == "" {
		// Installed here rather than by Start, which gives up on the first
		// dropped connection.
		err := installCRDs(cfg, envtest.CRDInstallOptions{
			Paths: []string{
				filepath.Join(manifests, "capi", "crd"),
				filepath.Join(manifests, "crd", "bases"),
			},
			ErrorIfPathMissing: true,
			Scheme:             e.Scheme,
			// Conversions go to the webhook server envtest prepared.
			WebhookOptions: e.env.WebhookInstallOptions,
		})
		if err != nil {
			return err
		}
	}
	e.WebhookPort = e.env.WebhookInstallOptions.LocalServingPort
	e.WebhookCertDir = e.env.WebhookInstallOptions.LocalServingCertDir
	if err := e.allocateQCPWebhookPort(); err != nil {
		return err
	}
	e.Kubeconfig = filepath.Join(e.Dir, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, e.env.KubeConfig, 0o600); err != nil {
		return fmt.Errorf("writing the management kubeconfig: %w", err)
	}
	if e.Client, err = client.New(cfg, client.Options{Scheme: e.Scheme}); err != nil {
		return fmt.Errorf("creating a management client: %w", err)
	}
	return nil
}

// writeManifests copies the embedded CRDs and webhook manifests to disk,
// where envtest reads them, all but the process provider's CRDs if
// withoutProcess.
func (e *Env) writeManifests(withoutProcess bool) (string, error) {
	dir := filepath.Join(e.Dir, "manifests")
	processCRDs := "crd/bases/" + infrav1.GroupVersion.Group + "_"
	err := fs.WalkDir(config.Manifests, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || withoutProcess && strings.HasPrefix(path, processCRDs) {
			return err
		}
		data, err := config.Manifests.ReadFile(path)
		if err != nil {
			return err
		}
		target := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o600)
	})
	if err != nil {
		return "", fmt.Errorf("writing manifests to %s: %w", dir, err)
	}
	return dir, nil
}

// Stop stops qcp-manager, the machines, CAPI core, kube-controller-manager,
// kube-apiserver and etcd, and removes a temporary directory. It is safe to
// call more than once.
func (e *Env) Stop() error {
	var errs []error
	for _, m := range e.managers {
		errs = append(errs, m.Stop())
	}
	e.managers = nil
	// Machines outlive the manager by design; the environment that made
	// them ends them.
	if err := (&machinehost.Host{Root: e.MachineRoot()}).StopAll(); err != nil {
		errs = append(errs, fmt.Errorf("stopping machines: %w", err))
	}
	if e.capi != nil {
		errs = append(errs, e.capi.Stop())
		e.capi = nil
	}
	if e.cabpk != nil {
		errs = append(errs, e.cabpk.Stop())
		e.cabpk = nil
	}
	if e.gc != nil {
		errs = append(errs, e.gc.Stop())
		e.gc = nil
	}
	if e.env != nil {
		// The API server's data goes with the environment, so nothing needs
		// its graceful stop, which outlasted envtest's one-minute timeout at
		// the end of test/e2e (its in-flight requests draining): kill it.
		if e.apiserverRunning() {
			if err := e.StopAPIServer(context.Background()); err != nil {
				errs = append(errs, err)
			}
		}
		if err := e.env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping the management kube-apiserver and etcd: %w", err))
		}
		e.env = nil
	}
	if e.apiserverLog != nil {
		errs = append(errs, e.apiserverLog.Close())
		e.apiserverLog = nil
	}
	if e.ownsDir {
		errs = append(errs, os.RemoveAll(e.Dir))
		e.ownsDir = false
	}
	return errors.Join(errs...)
}

// StopAPIServer kills the management kube-apiserver, as a crash would, and
// leaves its etcd and every client running: the first half of a fault
// test's restart. (A graceful stop, with CAPI core and qcp-manager
// attached, outlasted envtest's one-minute stop timeout.)
func (e *Env) StopAPIServer(ctx context.Context) error {
	apiserver := e.env.ControlPlane.GetAPIServer()
	mine := func() ([]machinehost.Proc, error) {
		return machinehost.ProcessesMatching("--cert-dir=" + apiserver.CertDir)
	}
	procs, err := mine()
	if err != nil {
		return err
	}
	if len(procs) != 1 {
		return fmt.Errorf("want one management kube-apiserver serving from %s, found %v", apiserver.CertDir, procs)
	}
	if err := syscall.Kill(procs[0].PID, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing the management kube-apiserver: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		procs, err := mine()
		return err == nil && len(procs) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the killed management kube-apiserver to end: %w", err)
	}
	// envtest reaps it and forgets it.
	return apiserver.Stop()
}

// apiserverRunning reports whether the management kube-apiserver was started
// and has not exited since.
func (e *Env) apiserverRunning() bool {
	procs, err := machinehost.ProcessesMatching("--cert-dir=" + e.env.ControlPlane.GetAPIServer().CertDir)
	return err == nil && len(procs) > 0
}

// StartAPIServer starts the management kube-apiserver again after
// StopAPIServer, on the same address, with the same certificates and data,
// and returns once it serves.
func (e *Env) StartAPIServer() error {
	if err := e.env.ControlPlane.GetAPIServer().Start(); err != nil {
		return fmt.Errorf("starting the management kube-apiserver again: %w%s", err, e.apiserverLogTail())
	}
	return nil
}

// MachineRoot is where qcp-manager keeps the process machines by default.
func (e *Env) MachineRoot() string { return filepath.Join(e.Dir, "machines") }

// controlPlaneStartTimeout bounds the start of the management etcd and
// kube-apiserver, and the kube-apiserver's restart (StartAPIServer). A
// healthy start takes seconds; on a 2-core host busy with four scenarios'
// machines a restart outlasted one minute in CI, so the bound is a ceiling
// for a starved host, not a wait.
const controlPlaneStartTimeout = 3 * time.Minute

// apiserverLogName is the management kube-apiserver's log, in Dir.
const apiserverLogName = "kube-apiserver.log"

// apiserverLogTail is the end of the management kube-apiserver's log, for
// the error of a start that failed.
func (e *Env) apiserverLogTail() string {
	return fmt.Sprintf("; the end of its log (%s):\n%s", apiserverLogName, LogTail(filepath.Join(e.Dir, apiserverLogName), 20))
}

// LogTail returns the last n lines of the file at path, or why it cannot.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// crdInstallBackoff spaces the attempts installCRDs makes: about 6 s in all.
var crdInstallBackoff = wait.Backoff{Steps: 5, Duration: 400 * time.Millisecond, Factor: 2}

// installCRDs installs CRDs as envtest does, and tries again when the API
// server dropped the connection or timed out, as a loaded kube-apiserver
// occasionally does (a POST whose response ends in "unexpected EOF"). Each
// attempt creates what is missing and updates what exists.
func installCRDs(cfg *rest.Config, opts envtest.CRDInstallOptions) error {
	return retry.OnError(crdInstallBackoff, transientAPIError, func() error {
		_, err := envtest.InstallCRDs(cfg, opts)
		return err
	})
}

// transientAPIError reports whether err is the API server's transport or load
// failing, not a refusal: a retry may clear it.
func transientAPIError(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		utilnet.IsConnectionReset(err) || utilnet.IsConnectionRefused(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err)
}
