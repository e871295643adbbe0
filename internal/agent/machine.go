// Package agent is qcp-agent's machine side: a kubelet and kubeadm in
// miniature. It reads the machine's identity and bootstrap data from the
// machine directory, issues the machine's certificates, runs the components
// as supervised child processes, and registers and heartbeats the Node.
package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/qcp-dev/qcp/internal/atomicfile"
)

// Files in a machine directory.
const (
	MachineFile   = "machine.json"
	BootstrapFile = "bootstrap-data"
	StatusFile    = "status.json"
	PKIDir        = "pki"
	LogDir        = "logs"
)

// Standard ports, so that a machine looks like a real host.
const (
	EtcdClientPort  = 2379
	EtcdPeerPort    = 2380
	EtcdMetricsPort = 2381
	EtcdAdminPort   = 2382 // qcp-agent's etcd settings endpoint
	APIServerPort   = 6443
	HealthPort      = 10248
	KCMPort         = 10257
	SchedulerPort   = 10259
)

// Machine is the machine's identity. A machine booted from cloud-config
// knows its name, address and cluster (Preflight): its providerID and
// zone are the infrastructure provider's to put on its Node, as a cloud's
// controller manager does. One booted from the old qcp format had all of
// it in machine.json, which the infrastructure side wrote like cloud
// metadata.
type Machine struct {
	Name          string `json:"name"`
	Namespace     string `json:"namespace"`
	Cluster       string `json:"cluster"`
	Address       string `json:"address"`
	ProviderID    string `json:"providerID"`
	FailureDomain string `json:"failureDomain,omitempty"`
}

// IP returns the machine's address.
func (m Machine) IP() net.IP { return net.ParseIP(m.Address) }

// String is namespace/name, or the name where the machine does not know
// its namespace (booted from cloud-config).
func (m Machine) String() string {
	if m.Namespace == "" {
		return m.Name
	}
	return m.Namespace + "/" + m.Name
}

// validateHost checks what every machine knows of itself.
func (m Machine) validateHost() error {
	var errs []error
	if m.Name == "" || len(validation.IsDNS1123Subdomain(m.Name)) > 0 {
		errs = append(errs, fmt.Errorf("name %q is not a DNS subdomain: the host name names the Node and the etcd member", m.Name))
	}
	if ip := m.IP(); ip == nil || ip.To4() == nil {
		errs = append(errs, fmt.Errorf("address %q is not an IPv4 address: give the machine one, or pass --address", m.Address))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid machine identity: %w", err)
	}
	return nil
}

// Validate checks the identity of machine.json; its errors name the field
// and the fix.
func (m Machine) Validate() error {
	var errs []error
	if m.Name == "" {
		errs = append(errs, errors.New("name is empty: set the Machine's name"))
	}
	if m.Namespace == "" {
		errs = append(errs, errors.New("namespace is empty: set the Machine's namespace"))
	}
	if m.Cluster == "" {
		errs = append(errs, errors.New("cluster is empty: set the cluster name"))
	}
	if ip := m.IP(); ip == nil || ip.To4() == nil {
		errs = append(errs, fmt.Errorf("address %q is not an IPv4 address: allocate one such as 127.0.10.1", m.Address))
	}
	if m.ProviderID == "" {
		errs = append(errs, errors.New("providerID is empty: set it, e.g. process://<namespace>/<name>"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid %s: %w", MachineFile, err)
	}
	return nil
}

// ReadMachine reads and validates dir/machine.json.
func ReadMachine(dir string) (Machine, error) {
	var m Machine
	data, err := os.ReadFile(filepath.Join(dir, MachineFile))
	if err != nil {
		return m, fmt.Errorf("reading machine identity: %w (the infrastructure provider writes %s)", err, MachineFile)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("decoding %s: %w", MachineFile, err)
	}
	return m, m.Validate()
}

// Phases of a machine as status.json reports them.
const (
	PhaseStarting = "Starting"
	PhaseRunning  = "Running"
	PhaseFailed   = "Failed"
	PhaseStopped  = "Stopped"
)

// Reasons in status.json, CamelCase for conditions.
const (
	ReasonInvalidMachine       = "InvalidMachineIdentity"
	ReasonInvalidBootstrapData = "InvalidBootstrapData"
	ReasonBinaryMissing        = "BinaryMissing"
	ReasonStartFailed          = "StartFailed"
	ReasonStopped              = "Stopped"
	// ReasonPortInUse: another process listens on one of the machine's
	// ports, so the machine's address is not its own.
	ReasonPortInUse = "PortInUse"
)

// Status is status.json: the agent's machine-readable account of why it is
// (not) running, for the infrastructure controller to surface.
type Status struct {
	Phase   string    `json:"phase"`
	Reason  string    `json:"reason,omitempty"`
	Message string    `json:"message,omitempty"`
	PID     int       `json:"pid"`
	Time    time.Time `json:"time"`
}

// WriteStatus replaces dir/status.json atomically, so a reader never sees a
// half-written file.
func WriteStatus(dir string, s Status) error {
	s.PID = os.Getpid()
	s.Time = time.Now().UTC()
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, StatusFile), data, 0o600)
}

// ReadStatus reads dir/status.json.
func ReadStatus(dir string) (Status, error) {
	var s Status
	data, err := os.ReadFile(filepath.Join(dir, StatusFile))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("decoding %s: %w", filepath.Join(dir, StatusFile), err)
	}
	return s, nil
}
