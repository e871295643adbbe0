package machinehost

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/qcp-dev/qcp/internal/atomicfile"
	"github.com/qcp-dev/qcp/internal/lb"
)

// lbRoot is below Root but cannot collide with a namespace: namespace names
// never start with an underscore.
const lbRoot = "_lb"

// LBDir returns the directory of cluster namespace/cluster's load balancer.
func (h *Host) LBDir(namespace, cluster string) string {
	return filepath.Join(h.Root, lbRoot, namespace, cluster)
}

// StartLB starts the cluster's load balancer on addr (host:port), verifying
// backends against caPEM. It does nothing if the balancer already runs.
func (h *Host) StartLB(namespace, cluster, addr string, caPEM []byte) error {
	dir := h.LBDir(namespace, cluster)
	if st, _ := h.status(dir, "lb"); st.Running {
		// The cluster CA may appear or rotate after the balancer started;
		// it re-reads the file when it changes.
		return writeIfChanged(filepath.Join(dir, lb.CAFile), caPEM)
	}
	cfg, err := json.Marshal(lb.Config{Listen: addr})
	if err != nil {
		return err
	}
	files := map[string][]byte{lb.ConfigFile: cfg, lb.CAFile: caPEM}
	if _, err := os.Stat(filepath.Join(dir, lb.BackendsFile)); err != nil {
		files[lb.BackendsFile] = []byte("[]")
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("load balancer of cluster %s/%s: address %q: %w", namespace, cluster, addr, err)
	}
	pl, err := h.placeFor(lbKey(namespace, cluster), cluster+"-lb", host)
	if err != nil {
		return fmt.Errorf("load balancer of cluster %s/%s: %w", namespace, cluster, err)
	}
	if _, err := h.launch(dir, files, pl, "lb", "--dir", dir); err != nil {
		return fmt.Errorf("load balancer of cluster %s/%s: %w", namespace, cluster, err)
	}
	return nil
}

func lbKey(namespace, cluster string) string { return "lb/" + namespace + "/" + cluster }

// SetBackends replaces the load balancer's backends (host:port of API
// servers); it picks the change up within a second.
func (h *Host) SetBackends(namespace, cluster string, backends []string) error {
	if backends == nil {
		backends = []string{}
	}
	data, err := json.Marshal(backends)
	if err != nil {
		return err
	}
	dir := h.LBDir(namespace, cluster)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, lb.BackendsFile), data, 0o600)
}

// LBStatus reports whether the cluster's load balancer runs.
func (h *Host) LBStatus(namespace, cluster string) (MachineStatus, error) {
	return h.status(h.LBDir(namespace, cluster), "lb")
}

// StopLB stops the load balancer and removes its directory.
func (h *Host) StopLB(namespace, cluster string) error {
	return h.stop(h.LBDir(namespace, cluster), lbKey(namespace, cluster), "lb", "load balancer "+namespace+"/"+cluster)
}

func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return atomicfile.Write(path, data, 0o600)
}
