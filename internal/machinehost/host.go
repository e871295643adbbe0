// Package machinehost is the host side of process machines: what the
// infrastructure controller calls to start, inspect, stop and inject faults
// into machines and load balancers. It knows nothing of Kubernetes types.
// Machines are qcp-agent processes in their own session, so they outlive
// the manager that started them, as VMs outlive a cloud controller.
package machinehost

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/qcp-dev/qcp/internal/agent"
	"github.com/qcp-dev/qcp/internal/atomicfile"
	"github.com/qcp-dev/qcp/internal/bootstrap"
	"github.com/qcp-dev/qcp/internal/hostcgroup"
	"github.com/qcp-dev/qcp/internal/hostnet"
)

// Host manages the machines under Root.
type Host struct {
	// Root holds one directory per machine, <Root>/<namespace>/<name>.
	Root string
	// BinDir holds the pinned component binaries.
	BinDir string
	// AgentPath is the qcp-agent binary.
	AgentPath string
	// Network, when set, runs each machine and load balancer in network
	// and UTS namespaces of its own on it (hostnet), as a host of its own:
	// its address on the network's bridge, its hostname its name. Nil
	// runs them on the host's own (loopback) addresses.
	Network *hostnet.Network
	// Cgroups gives each machine cgroups of its own (hostcgroup), where a
	// freeze stops the whole machine at once and MachineSpec.MemoryLimit
	// is its size. Freeze, Thaw, Kill and Stop find a machine's cgroups in
	// its directory, so any Host handles a machine one with Cgroups started.
	Cgroups bool
}

// place is where a launched agent runs: in the namespace ns (joined by its
// veth pair, whose host end is hostIf), at addr, named hostname, and in
// the cgroups named cgroup (hostcgroup) with memory bytes at most (0: no
// limit); the zero place is the host itself.
type place struct {
	ns, hostIf, hostname string
	addr                 netip.Addr
	cgroup               string
	memory               int64
}

// NamespaceOf names the namespace of the machine or load balancer key
// ("machine/<ns>/<name>", "lb/<ns>/<cluster>") and the host end of its veth
// pair. They derive from key, so that they are found again after a manager
// restart.
func NamespaceOf(key string) (ns, hostIf string) {
	sum := sha256.Sum256([]byte(key))
	id := hex.EncodeToString(sum[:])[:10]
	return "qcp-" + id, "qcpv" + id
}

// placeFor is the place of the machine or load balancer key named hostname
// at address; the host itself without a Network.
func (h *Host) placeFor(key, hostname, address string) (place, error) {
	if h.Network == nil {
		return place{}, nil
	}
	addr, err := netip.ParseAddr(address)
	if err != nil {
		return place{}, fmt.Errorf("address %q: %w", address, err)
	}
	ns, hostIf := NamespaceOf(key)
	return place{ns: ns, hostIf: hostIf, hostname: hostname, addr: addr}, nil
}

// machinePlace is placeFor of the machine spec describes, in cgroups of
// its own with Cgroups.
func (h *Host) machinePlace(spec MachineSpec) (place, error) {
	key := machineKey(spec.Namespace, spec.Name)
	pl, err := h.placeFor(key, spec.Name, spec.Address)
	if err != nil {
		return place{}, &Error{Reason: ReasonInvalidSpec, Object: spec.Namespace + "/" + spec.Name, Err: err}
	}
	if h.Cgroups {
		pl.cgroup, pl.memory = cgroupOf(key), spec.MemoryLimit
	}
	return pl, nil
}

// cgroupOf names the cgroups of the machine key, as NamespaceOf names its
// network namespace.
func cgroupOf(key string) string {
	ns, _ := NamespaceOf(key)
	return ns
}

// NetworkNamespace names the network namespace machine namespace/name
// runs in, or is "" without a Network (loopback addresses).
func (h *Host) NetworkNamespace(namespace, name string) string {
	if h.Network == nil {
		return ""
	}
	ns, _ := NamespaceOf(machineKey(namespace, name))
	return ns
}

// unplace removes the namespace of key, if a Network gave it one: also
// when this Host has none, as a host that only tears machines down (a
// local environment's StopAll) has not.
func (h *Host) unplace(key string) error {
	ns, hostIf := NamespaceOf(key)
	if !hostnet.Exists(ns) {
		return nil
	}
	return hostnet.Network{}.Detach(ns, hostIf)
}

// Isolate cuts machine namespace/name off from each of peers, as a
// network partition does: both ways, or with hostnet.Outgoing only what
// the machine sends. The cut holds until Heal, whatever else the machine
// does; it needs the machine to run in a network namespace of its own (a
// Network).
func Isolate(namespace, name string, peers []netip.Addr, d hostnet.Direction) error {
	ns, err := machineNetns(namespace, name)
	if err != nil {
		return err
	}
	for _, p := range peers {
		if err := hostnet.Cut(ns, p, d); err != nil {
			return fmt.Errorf("cutting machine %s/%s off from %s: %w", namespace, name, p, err)
		}
	}
	return nil
}

// Heal removes every cut Isolate made on machine namespace/name.
func Heal(namespace, name string) error {
	ns, err := machineNetns(namespace, name)
	if err != nil {
		return err
	}
	return hostnet.HealAll(ns)
}

// NetworkHostAddr is the address machine namespace/name reaches its
// manager's host at: the bridge's.
func NetworkHostAddr(namespace, name string) (netip.Addr, error) {
	ns, err := machineNetns(namespace, name)
	if err != nil {
		return netip.Addr{}, err
	}
	return hostnet.HostAddrOf(ns)
}

// machineNetns is the network namespace of machine namespace/name, or an
// error saying why it has none.
func machineNetns(namespace, name string) (string, error) {
	ns, _ := NamespaceOf(machineKey(namespace, name))
	if !hostnet.Exists(ns) {
		return "", fmt.Errorf("machine %s/%s has no network namespace of its own (%s): its qcp-manager runs its machines on loopback addresses, where a partition cannot be made; start it with --machine-network=namespaces", namespace, name, ns)
	}
	return ns, nil
}

func machineKey(namespace, name string) string { return "machine/" + namespace + "/" + name }

// MachineSpec is a machine's identity, written to machine.json, and its
// size.
type MachineSpec struct {
	Name          string
	Namespace     string
	Cluster       string
	Address       string
	ProviderID    string
	FailureDomain string
	// MemoryLimit, in bytes, limits the memory of all of the machine's
	// processes together (0: no limit); it needs a Host with Cgroups.
	MemoryLimit int64
}

// MinMemoryLimit is the smallest MemoryLimit a machine may be given.
const MinMemoryLimit = 128 << 20

// identity is what the agent reads from machine.json.
func (s MachineSpec) identity() agent.Machine {
	return agent.Machine{Name: s.Name, Namespace: s.Namespace, Cluster: s.Cluster, Address: s.Address,
		ProviderID: s.ProviderID, FailureDomain: s.FailureDomain}
}

// Reasons of a *Error, CamelCase for conditions.
const (
	ReasonInvalidSpec          = "InvalidMachineSpec"
	ReasonInvalidBootstrapData = agent.ReasonInvalidBootstrapData
	ReasonBinaryMissing        = agent.ReasonBinaryMissing
	ReasonAgentMissing         = "AgentMissing"
	ReasonStartFailed          = agent.ReasonStartFailed
)

// Error is a failure to start a machine; Reason is a condition reason and
// the message names the cause and the fix.
type Error struct {
	Reason string
	Object string // namespace/name
	Err    error
}

func (e *Error) Error() string { return fmt.Sprintf("machine %s: %v", e.Object, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// ReasonOf returns the Reason of a *Error in err's chain, or "".
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

const (
	pidFile  = "agent.pid"
	agentLog = "agent.log"
	// cgroupFile holds the machine's cgroups (hostcgroup.Group.Save).
	cgroupFile = "cgroups.json"
	// stopTimeout bounds a graceful stop, after which the machine loses
	// power (SIGKILL). A machine is deleted after QCP removed its etcd
	// member, so its kube-apiserver has no etcd left: it would spend its
	// graceful shutdown waiting out a 10-s timeout to delete its identity
	// lease, and hold the next machine of a rollout back by as much.
	stopTimeout = 2 * time.Second
	killTimeout = 10 * time.Second
)

// Dir returns the directory of machine namespace/name.
func (h *Host) Dir(namespace, name string) string {
	return filepath.Join(h.Root, namespace, name)
}

// Start starts the machine, or does nothing if its agent is already running
// (after a manager restart this re-attaches). It validates the spec, the
// bootstrap data, and the binaries first, and creates nothing if they fail.
func (h *Host) Start(spec MachineSpec, bootstrapData []byte) error {
	obj := spec.Namespace + "/" + spec.Name
	m := spec.identity()
	dir, running, err := h.attach(spec)
	if err != nil || running {
		return err
	}
	doc, err := bootstrap.Parse(bootstrapData)
	if err != nil {
		return &Error{Reason: ReasonInvalidBootstrapData, Object: obj, Err: fmt.Errorf("%w (fix the bootstrap data Secret; its provider must write a %s %s document)", err, bootstrap.APIVersion, bootstrap.Kind)}
	}
	if err := doc.CheckBinaries(h.BinDir); err != nil {
		return &Error{Reason: ReasonBinaryMissing, Object: obj, Err: err}
	}
	if err := h.checkAgent(obj); err != nil {
		return err
	}
	identity, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return &Error{Reason: ReasonStartFailed, Object: obj, Err: err}
	}
	files := map[string][]byte{agent.MachineFile: identity, agent.BootstrapFile: bootstrapData}
	pl, err := h.machinePlace(spec)
	if err != nil {
		return err
	}
	if _, err := h.launch(dir, files, pl, "run", "--dir", dir, "--bin-dir", h.BinDir); err != nil {
		return &Error{Reason: ReasonStartFailed, Object: obj, Err: err}
	}
	return nil
}

// attach validates spec and re-attaches to the machine's agent if it runs;
// running says so, and there is nothing to start.
func (h *Host) attach(spec MachineSpec) (dir string, running bool, err error) {
	if err := h.validateSpec(spec); err != nil {
		return "", false, &Error{Reason: ReasonInvalidSpec, Object: spec.Namespace + "/" + spec.Name, Err: err}
	}
	dir = h.Dir(spec.Namespace, spec.Name)
	if st, _ := h.Status(spec.Namespace, spec.Name); st.Running {
		return dir, true, nil
	}
	if pid := runningAgent(dir); pid > 0 {
		return dir, true, writePID(dir, pid)
	}
	return dir, false, nil
}

// checkAgent fails unless the agent binary is there.
func (h *Host) checkAgent(obj string) error {
	if fi, err := os.Stat(h.AgentPath); err != nil || fi.IsDir() {
		return &Error{Reason: ReasonAgentMissing, Object: obj, Err: fmt.Errorf("qcp-agent not found at %s: build it with `go build -o %s ./cmd/qcp-agent`", h.AgentPath, h.AgentPath)}
	}
	return nil
}

// validateSpec checks the machine's identity, that its name makes a
// directory of its own, and that its memory limit can be applied.
func (h *Host) validateSpec(spec MachineSpec) error {
	if err := spec.identity().Validate(); err != nil || strings.ContainsAny(spec.Namespace+spec.Name, "/\x00") || strings.HasPrefix(spec.Namespace, ".") || strings.HasPrefix(spec.Name, ".") {
		return fmt.Errorf("invalid machine spec: %v; fix the ProcessMachine", err)
	}
	switch {
	case spec.MemoryLimit == 0:
	case spec.MemoryLimit < MinMemoryLimit:
		return fmt.Errorf("spec.memory %d bytes is below %dMi: a machine runs etcd and kube-apiserver; give it 1Gi or more, or leave spec.memory unset", spec.MemoryLimit, MinMemoryLimit>>20)
	case !h.Cgroups:
		return fmt.Errorf("spec.memory needs cgroups for each machine, and this qcp-manager gives machines none (it needs root and cgroup v1's memory controller): leave spec.memory unset, or run qcp-manager where it can make cgroups")
	}
	return nil
}

// writePID re-attaches to the machine's running agent. agent.pid may name
// a process that is not the running agent (a second agent launched beside
// it fails on its taken health port and leaves its own PID there): the
// agent itself is found and recorded, or the machine would be taken for
// dead while it runs.
func writePID(dir string, pid int) error {
	return atomicfile.Write(filepath.Join(dir, pidFile), []byte(strconv.Itoa(pid)), 0o600)
}

// launch writes files into dir and starts the agent detached, at pl: its
// own session and process group, stdin from /dev/null, output to
// agent.log.
func (h *Host) launch(dir string, files map[string][]byte, pl place, args ...string) (int, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return 0, err
	}
	for name, data := range files {
		if err := atomicfile.Write(filepath.Join(dir, name), data, 0o600); err != nil {
			return 0, err
		}
	}
	logFile, err := os.OpenFile(filepath.Join(dir, agentLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("opening agent log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(h.AgentPath, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if pl.ns != "" {
		if err := h.Network.Attach(pl.ns, pl.hostIf, pl.addr); err != nil {
			return 0, fmt.Errorf("giving it a network namespace: %w", err)
		}
		// ip joins the namespace and executes the agent in its place.
		cmd = hostnet.Command(pl.ns, h.AgentPath, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWUTS}
		env, err := hostnet.HostnameEnviron(pl.hostname)
		if err != nil {
			return 0, err
		}
		cmd.Env = append(os.Environ(), env...)
	}
	if pl.cgroup != "" {
		g, err := hostcgroup.Create(pl.cgroup, pl.memory)
		if err != nil {
			return 0, fmt.Errorf("giving it cgroups: %w", err)
		}
		if err := g.Save(filepath.Join(dir, cgroupFile)); err != nil {
			return 0, err
		}
		// The shell joins the cgroups and executes the agent (or ip, which
		// executes it) in its place: nothing of the machine runs outside.
		wrapped := exec.Command("/bin/sh", append([]string{"-c", g.JoinScript(), "sh", cmd.Path}, cmd.Args[1:]...)...)
		wrapped.SysProcAttr, wrapped.Env = cmd.SysProcAttr, cmd.Env
		cmd = wrapped
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", h.AgentPath, err)
	}
	pid := cmd.Process.Pid
	// Reap the agent if it exits while this process lives; after a manager
	// restart init reaps it instead.
	go func() { _ = cmd.Wait() }()
	// Start returns once the exec began, but /proc/<pid>/cmdline stays
	// empty until the kernel has laid out the new program's arguments, and
	// Status recognises the agent by them. On a loaded host that took long
	// enough for the caller to take the new agent for dead and launch a
	// second one; wait until it can be recognised (or has exited).
	// Under ip netns exec, the command line is ip's until it executes the
	// agent.
	for deadline := time.Now().Add(5 * time.Second); !launched(pid, h.AgentPath) && time.Now().Before(deadline); {
		if p, err := readProc(pid); err != nil || p.State == "Z" {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := atomicfile.Write(filepath.Join(dir, pidFile), []byte(strconv.Itoa(pid)), 0o600); err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return 0, err
	}
	return pid, nil
}

// launched reports whether pid runs agent (its command line is laid out).
func launched(pid int, agent string) bool {
	args := cmdline(pid)
	return len(args) > 0 && args[0] == agent
}

// MachineStatus is what Status reports.
type MachineStatus struct {
	// Running is true while the agent process lives.
	Running bool
	// PID is the agent's PID (also its process group ID) when running.
	PID int
	// Agent is the agent's own status.json, if it wrote one: on failure
	// its Reason and Message say why it exited.
	Agent *agent.Status
}

// Status reports whether the machine's agent runs and what it last said.
func (h *Host) Status(namespace, name string) (MachineStatus, error) {
	return h.status(h.Dir(namespace, name), "run")
}

func (h *Host) status(dir, sub string) (MachineStatus, error) {
	var st MachineStatus
	if s, err := agent.ReadStatus(dataDir(dir)); err == nil {
		st.Agent = &s
	}
	pid, err := readPID(dir)
	if err != nil {
		return st, err
	}
	if pid > 0 && isAgent(pid, sub, dir) {
		st.Running, st.PID = true, pid
	}
	return st, nil
}

func readPID(dir string) (int, error) {
	data, err := os.ReadFile(filepath.Join(dir, pidFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}
