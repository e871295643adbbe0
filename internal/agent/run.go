package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// Options configure Run.
type Options struct {
	// Dir is the agent's data directory: certificates, etcd's data, logs
	// and status.json. A machine booted from the old qcp format also
	// holds machine.json and bootstrap-data there.
	Dir string
	// BootstrapFile, when set, is the bootstrap document a cloud-config
	// wrote (internal/cloudinit); the machine's identity then comes from
	// NodeName, Address and the instance data, and no machine.json is
	// read.
	BootstrapFile string
	// NodeName names the machine, its Node and its etcd member: the host
	// name, which cloud-init renders into the unit.
	NodeName string
	// Address is the machine's IPv4 address; empty: the instance data's
	// local IPv4 address, else the first address of an interface that is
	// up and not loopback (see HostAddress).
	Address string
	// InstanceData is cloud-init's instance-data.json.
	InstanceData string
	// BinDir holds etcd-<version> and kube-<version>.
	BinDir string
	Log    *slog.Logger
	// StableRun is how long a component must run for its restart backoff
	// to start again from one second; zero means a minute. Tests shorten
	// it so that the reset is seen in seconds.
	StableRun time.Duration
}

// PreflightError is a problem found before anything was started; Reason is
// the CamelCase reason also written to status.json.
type PreflightError struct {
	Reason string
	Err    error
}

func (e *PreflightError) Error() string { return e.Err.Error() }
func (e *PreflightError) Unwrap() error { return e.Err }

// machineCtx is one running machine: its identity, document, PKI and the
// parts that run it.
type machineCtx struct {
	dir     string
	machine Machine
	doc     *bootstrap.Document
	bins    map[string]string
	pki     *PKI
	log     *slog.Logger
	sup     *supervisor
	prober  *prober
	// node is the Node agent: from the start on a machine that runs
	// Kubernetes, from its first node registration on one that runs only
	// etcd (nodeStart serializes that start).
	node         atomic.Pointer[nodeAgent]
	nodeStart    sync.Mutex
	registration nodeRegistration
	// apiserverStarted is set once kube-apiserver was given its command
	// line (apiserverEtcdServers).
	apiserverStarted atomic.Bool
	// etcdEndpoint is the local etcd endpoint's URL, when the API server
	// follows an etcd cluster's membership through one.
	etcdEndpoint string
	etcdSettings etcdSettingsState
	// adminPair is the agent endpoint's serving certificate.
	adminPair *servingPair
	// renewing serializes certificate renewals.
	renewing sync.Mutex
	// servers counts the agent's endpoints' goroutines.
	servers sync.WaitGroup
}

// Preflight reads and validates everything Run needs without starting or
// writing anything.
func Preflight(opts Options) (Machine, *bootstrap.Document, error) {
	if opts.BootstrapFile != "" {
		return preflightCloudConfig(opts)
	}
	m, err := ReadMachine(opts.Dir)
	if err != nil {
		return m, nil, &PreflightError{Reason: ReasonInvalidMachine, Err: err}
	}
	doc, err := readBootstrap(m, filepath.Join(opts.Dir, BootstrapFile), opts.BinDir)
	return m, doc, err
}

// preflightCloudConfig is Preflight for a machine booted from cloud-config:
// its name from the unit, its cluster from the document, its address from
// the machine.
func preflightCloudConfig(opts Options) (Machine, *bootstrap.Document, error) {
	m := Machine{Name: opts.NodeName, Address: opts.Address}
	if m.Address == "" {
		addr, err := HostAddress(opts.InstanceData)
		if err != nil {
			return m, nil, &PreflightError{Reason: ReasonInvalidMachine, Err: fmt.Errorf("machine %s: %w", m, err)}
		}
		m.Address = addr
	}
	if err := m.validateHost(); err != nil {
		return m, nil, &PreflightError{Reason: ReasonInvalidMachine, Err: err}
	}
	doc, err := readBootstrap(m, opts.BootstrapFile, opts.BinDir)
	if doc != nil {
		m.Cluster = doc.ClusterName
	}
	return m, doc, err
}

func readBootstrap(m Machine, path, binDir string) (*bootstrap.Document, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &PreflightError{Reason: ReasonInvalidBootstrapData, Err: fmt.Errorf("machine %s: reading bootstrap data: %w (the infrastructure provider or cloud-init writes it there)", m, err)}
	}
	doc, err := bootstrap.Parse(data)
	if err != nil {
		return nil, &PreflightError{Reason: ReasonInvalidBootstrapData, Err: fmt.Errorf("machine %s: %w", m, err)}
	}
	if err := doc.CheckBinaries(binDir); err != nil {
		return nil, &PreflightError{Reason: ReasonBinaryMissing, Err: fmt.Errorf("machine %s: %w", m, err)}
	}
	return doc, nil
}

// Run validates the machine directory, starts the components and keeps the
// Node alive until ctx ends, then stops the components. Any failure before
// a component starts is recorded in status.json and nothing is left running.
func Run(ctx context.Context, opts Options) (err error) {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	defer func() {
		if err != nil {
			reason := ReasonStartFailed
			var pf *PreflightError
			if errors.As(err, &pf) {
				reason = pf.Reason
			}
			if werr := WriteStatus(opts.Dir, Status{Phase: PhaseFailed, Reason: reason, Message: err.Error()}); werr != nil {
				log.Error("cannot record failure", "err", werr)
			}
		}
	}()
	m, doc, err := Preflight(opts)
	if err != nil {
		return err
	}
	a := &machineCtx{dir: opts.Dir, machine: m, doc: doc, bins: doc.Binaries(opts.BinDir), log: log.With("machine", m.Name)}
	if doc.Runs(bootstrap.Etcd) {
		if err := a.loadEtcdSettings(); err != nil {
			return err
		}
	}
	if err := a.loadAuthorities(); err != nil {
		return err
	}
	if err := WriteStatus(opts.Dir, Status{Phase: PhaseStarting}); err != nil {
		return err
	}
	if a.pki, err = IssuePKI(opts.Dir, m, doc, time.Now()); err != nil {
		return fmt.Errorf("machine %s: issuing certificates: %w", m, err)
	}
	logDir := filepath.Join(opts.Dir, LogDir)
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return err
	}
	a.sup = newSupervisor(logDir, a.log, opts.StableRun)
	if a.prober, err = a.newProber(); err != nil {
		return err
	}
	if a.registersNode() {
		if err := a.loadNodeRegistration(); err != nil {
			return err
		}
	}
	// The Node agent this run starts once the components are; one a
	// registration starts later runs from then.
	var node *nodeAgent
	if reg, _ := a.registration.get(); doc.RunsKubernetes() || reg != nil {
		if node, err = a.newNodeAgent(); err != nil {
			return err
		}
		a.node.Store(node)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		a.servers.Wait()
	}()
	// The health listener goes first: binding the machine's address fails
	// fast if another machine already has it, before any component starts.
	if err := a.serveHealth(ctx); err != nil {
		return err
	}
	if doc.Runs(bootstrap.Etcd) || doc.Runs(bootstrap.KubeAPIServer) {
		if err := a.serveAgentEndpoint(ctx); err != nil {
			return err
		}
	}
	go a.prober.Run(ctx)
	if err := WriteStatus(opts.Dir, Status{Phase: PhaseRunning}); err != nil {
		return err
	}
	a.log.Info("machine starting", "address", m.Address, "components", doc.Components)
	startErr := a.startComponents(ctx)
	if startErr == nil && node != nil {
		go node.Run(ctx)
	}
	if startErr == nil {
		<-ctx.Done()
	}
	cancel()
	a.sup.Wait()
	if startErr != nil && !errors.Is(startErr, context.Canceled) {
		return startErr
	}
	a.log.Info("machine stopped")
	return WriteStatus(opts.Dir, Status{Phase: PhaseStopped, Reason: ReasonStopped, Message: "qcp-agent was asked to stop"})
}

// startComponents starts the components in dependency order. It returns
// once all are started (their supervisors keep them running).
func (a *machineCtx) startComponents(ctx context.Context) error {
	if a.doc.Runs(bootstrap.Etcd) {
		initial := a.machine.Name + "=" + a.url("https", EtcdPeerPort)
		state := "new"
		if a.doc.Etcd.Local.Mode == bootstrap.EtcdModeExisting {
			var err error
			if initial, err = a.joinEtcd(ctx); err != nil {
				return fmt.Errorf("joining etcd: %w", err)
			}
			state = "existing"
		} else if a.doc.Etcd.Local.Restore != nil {
			if err := a.restoreEtcd(ctx, initial); err != nil {
				return fmt.Errorf("restoring etcd from a snapshot: %w", err)
			}
		}
		a.sup.Start(ctx, a.etcdProcess(initial, state))
		if state == "existing" {
			go a.watchPublish(ctx)
		}
	}
	if a.doc.Runs(bootstrap.KubeAPIServer) {
		if a.doc.Runs(bootstrap.Etcd) && a.doc.Etcd.Local.Mode == bootstrap.EtcdModeExisting {
			if err := a.waitVoter(ctx); err != nil {
				return fmt.Errorf("waiting for etcd promotion: %w", err)
			}
		}
		if ext := a.doc.Etcd.External; ext != nil && ext.FollowMembership {
			var err error
			if a.etcdEndpoint, err = a.startEtcdEndpoint(ctx); err != nil {
				return fmt.Errorf("starting the local etcd endpoint: %w", err)
			}
		}
		a.sup.Start(ctx, a.apiserverProcess())
	}
	if a.doc.Runs(bootstrap.KubeControllerManager) {
		a.sup.Start(ctx, a.controllerManagerProcess())
	}
	if a.doc.Runs(bootstrap.KubeScheduler) {
		a.sup.Start(ctx, a.schedulerProcess())
	}
	return nil
}
