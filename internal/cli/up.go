package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/qcp-dev/qcp/internal/binaries"
	"github.com/qcp-dev/qcp/internal/localenv"
	"github.com/qcp-dev/qcp/internal/machinehost"
)

// Files of the state directory.
const (
	pidFile   = "qcpctl.pid"
	readyFile = "ready"
	logFile   = "qcpctl.log"
	// stateMark marks a directory qcpctl made, so that up and down never
	// clear a directory that holds anything else.
	stateMark = ".qcp-state"
)

// Bounds of up's waits.
const (
	managementTimeout = 5 * time.Minute
	sampleTimeout     = 10 * time.Minute
	downTimeout       = 2 * time.Minute
)

func newUpCommand(g *globals) *cobra.Command {
	sample, addressRange, repository := true, "", ""
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a local management cluster with a sample 3-machine control plane, in the background",
		Long: "up starts the management cluster (etcd, kube-apiserver), installs CAPI core, CAPI's kubeadm bootstrap provider, QCP and " +
			"the process provider into it with clusterctl init from the release (--repository, default out/clusterctl.yaml, which " +
			"'make release' writes), runs their managers as background processes that outlive the command, creates the sample cluster demo (config/samples/demo.yaml: " +
			"3 control plane machines over 3 failure domains), shows its machines joining, and returns once " +
			"its control plane is Available. Running it again while the cluster is up changes nothing. " +
			"'qcpctl down' stops and removes everything it started.",
		Example: `  qcpctl up
  qcpctl up --sample=false            # the management cluster alone
  qcpctl up --state-dir /tmp/qcp-demo`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return up(ctx, cmd.OutOrStdout(), g, sample, addressRange, repository)
		},
	}
	cmd.Flags().BoolVar(&sample, "sample", true, "create the sample cluster demo and wait until its control plane is Available")
	cmd.Flags().StringVar(&addressRange, "address-range", "", "loopback prefix the machines' and load balancers' addresses come from (default qcp-manager's, 127.20.0.0/16)")
	cmd.Flags().StringVar(&repository, "repository", "", "the clusterctl configuration of the release clusterctl init installs the providers from (default out/clusterctl.yaml beside bin/, which 'make release' writes)")
	return cmd
}

// defaultRepository is the release `make release` writes beside the
// binaries' directory.
func defaultRepository() (string, error) {
	bin, err := binaries.Dir()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(bin), "out", "clusterctl.yaml"), nil
}

func up(ctx context.Context, out io.Writer, g *globals, sample bool, addressRange, repository string) error {
	dir := g.stateDir
	start := time.Now()
	if pid, ok := runningPID(dir); ok {
		fmt.Fprintf(out, "QCP is already up in %s (pid %d); nothing to do.\n", dir, pid)
		printManagement(out, dir)
		return nil
	}
	if repository == "" {
		var err error
		if repository, err = defaultRepository(); err != nil {
			return err
		}
	}
	repository, err := filepath.Abs(repository)
	if err != nil {
		return err
	}
	if _, err := os.Stat(repository); err != nil {
		return fmt.Errorf("no release to install the providers from (%w): build it with 'make release', or name one with --repository", err)
	}
	if err := claimStateDir(dir); err != nil {
		return err
	}
	phase := newPhases(out, start)
	phase.begin("installing CAPI core, CABPK, QCP and the process provider with clusterctl init from " + repository +
		", and starting the management cluster: etcd, kube-apiserver, CAPI core, CABPK, qcp-manager")
	if err := startServer(ctx, dir, addressRange, repository); err != nil {
		return err
	}
	phase.end()
	printManagement(out, dir)
	if !sample {
		return nil
	}
	g.kubeconfig = filepath.Join(dir, "kubeconfig")
	c, err := g.connect()
	if err != nil {
		return err
	}
	phase.begin(fmt.Sprintf("creating the sample cluster %s (config/%s): %d control plane machines over 3 failure domains",
		sampleCluster, sampleFile, sampleReplicas))
	if err := applySample(ctx, c); err != nil {
		return fmt.Errorf("the sample cluster was not created: %w", err)
	}
	if err := enableSampleBackups(ctx, c, dir); err != nil {
		return fmt.Errorf("the sample cluster's backups were not set up: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, sampleTimeout)
	defer cancel()
	if err := waitForSample(wctx, out, c, start); err != nil {
		return fmt.Errorf("the sample control plane is not Available after %s (%w); the management cluster "+
			"keeps running: inspect it with 'qcpctl describe cluster %s', stop it with 'qcpctl down'",
			sampleTimeout, err, sampleCluster)
	}
	if err := waitForFirstBackup(ctx, out, c); err != nil {
		return fmt.Errorf("the sample control plane is Available, but %w; inspect it with 'qcpctl describe cluster %s'", err, sampleCluster)
	}
	phase.end()
	fmt.Fprintf(out, `
The sample control plane is Available: 3 etcd voters, one machine per failure domain.
  Its kubeconfig:  qcpctl kubeconfig %[1]s -o %[1]s.kubeconfig
  Then try:        KUBECONFIG=%[1]s.kubeconfig kubectl get nodes
                   qcpctl describe cluster %[1]s --watch
                   qcpctl scale %[1]s --replicas 5
                   qcpctl machine kill <a machine from describe>
  Its backups:     hourly, to bucket %[2]s of the object store qcpctl runs (status.backup)
  Stop it all:     qcpctl down
`, sampleCluster, storeBucket)
	return nil
}

// claimStateDir empties dir for a new management cluster, refusing a
// directory qcpctl did not make.
func claimStateDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("reading the state directory %s: %w", dir, err)
	}
	if len(entries) > 0 {
		if _, err := os.Stat(filepath.Join(dir, stateMark)); err != nil {
			return fmt.Errorf("state directory %s is not empty and was not made by qcpctl: choose another with --state-dir or %s", dir, StateDirEnv)
		}
		// A management cluster that ended without down may have left machines.
		if err := (&machinehost.Host{Root: filepath.Join(dir, "machines")}).StopAll(); err != nil {
			return fmt.Errorf("stopping the machines left in %s: %w", dir, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("clearing %s: %w", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, stateMark), nil, 0o600)
}

// startServer starts `qcpctl serve` in a session of its own, so that it
// outlives this command and the terminal's Ctrl-C, and waits until it
// reports the management cluster ready.
func startServer(ctx context.Context, dir, addressRange, repository string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	log, err := os.OpenFile(filepath.Join(dir, logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(self, "serve", "--state-dir", dir, "--address-range", addressRange, "--repository", repository)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting qcpctl serve: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ctx, cancel := context.WithTimeout(ctx, managementTimeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(filepath.Join(dir, readyFile)); err == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the management cluster did not start (%v); the end of %s:\n%s",
				err, filepath.Join(dir, logFile), localenv.LogTail(filepath.Join(dir, logFile), 20))
		case <-ctx.Done():
			return fmt.Errorf("the management cluster is not ready after %s (%w): read %s, then run 'qcpctl down'",
				managementTimeout, ctx.Err(), filepath.Join(dir, logFile))
		case <-tick.C:
		}
	}
}

// printManagement says how to reach the management cluster in dir.
func printManagement(out io.Writer, dir string) {
	fmt.Fprintf(out, `QCP management cluster (state and logs in %[1]s):
  export KUBECONFIG=%[2]s
`, dir, filepath.Join(dir, "kubeconfig"))
}

// phases prints each phase of up with its elapsed time.
type phases struct {
	out        io.Writer
	start, now time.Time
}

func newPhases(out io.Writer, start time.Time) *phases { return &phases{out: out, start: start} }

func (p *phases) begin(what string) {
	p.now = time.Now()
	fmt.Fprintf(p.out, "[%6.1fs] %s ...\n", time.Since(p.start).Seconds(), what)
}

func (p *phases) end() {
	fmt.Fprintf(p.out, "[%6.1fs] done in %s\n", time.Since(p.start).Seconds(), time.Since(p.now).Round(100*time.Millisecond))
}

// newServeCommand is the background half of up: it runs the management
// cluster until down signals it.
func newServeCommand(g *globals) *cobra.Command {
	addressRange, repository := "", ""
	cmd := &cobra.Command{
		Use:    "serve",
		Short:  "Run the management cluster in the foreground (what up starts in the background)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serve(ctx, g.stateDir, addressRange, repository)
		},
	}
	cmd.Flags().StringVar(&addressRange, "address-range", "", "passed on to qcp-manager")
	cmd.Flags().StringVar(&repository, "repository", "", "the release's clusterctl configuration, which clusterctl init installs from")
	return cmd
}

func serve(ctx context.Context, dir, addressRange, repository string) (err error) {
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return err
	}
	store, err := startStore(ctx, dir)
	if err != nil {
		return err
	}
	env, err := localenv.Start(ctx, localenv.Options{Dir: dir, WithKubeadmBootstrap: true, Repository: repository})
	if err != nil {
		return errors.Join(err, store.Stop())
	}
	defer func() {
		err = errors.Join(err, env.Stop(), store.Stop())
		_ = os.Remove(filepath.Join(dir, readyFile))
		_ = os.Remove(filepath.Join(dir, pidFile))
	}()
	var args []string
	if addressRange != "" {
		args = append(args, "--address-range="+addressRange)
	}
	if _, err := env.StartManager(ctx, localenv.ManagerOptions{ExtraArgs: args}); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, readyFile), []byte(env.Config.Host), 0o600); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

func newDownCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop and remove everything qcpctl up started: management cluster, machines, load balancers, files",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return down(cmd.OutOrStdout(), g.stateDir)
		},
	}
}

func down(out io.Writer, dir string) error {
	if _, err := os.Stat(filepath.Join(dir, stateMark)); err != nil {
		fmt.Fprintf(out, "no management cluster at %s; nothing to do\n", dir)
		return nil
	}
	if pid, ok := runningPID(dir); ok {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return fmt.Errorf("signalling qcpctl serve (pid %d): %w", pid, err)
		}
		if !waitGone(pid, downTimeout) {
			return fmt.Errorf("the management cluster (qcpctl serve, pid %d) did not stop within %s; read %s",
				pid, downTimeout, filepath.Join(dir, logFile))
		}
	}
	// serve stops the machines it knows; these are the ones a crashed
	// serve left behind.
	if err := (&machinehost.Host{Root: filepath.Join(dir, "machines")}).StopAll(); err != nil {
		return fmt.Errorf("stopping machines: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	fmt.Fprintf(out, "management cluster stopped; %s removed\n", dir)
	return nil
}

func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

func runningPID(dir string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || syscall.Kill(pid, 0) != nil {
		return 0, false
	}
	return pid, true
}
