package machinehost

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// StopAll stops every machine and load balancer under Root, as tearing down
// a whole local environment must: machines outlive the manager by design,
// so nothing else would stop them.
func (h *Host) StopAll() error {
	var errs []error
	for _, ns := range subdirs(h.Root) {
		if ns == lbRoot {
			for _, lbNS := range subdirs(filepath.Join(h.Root, lbRoot)) {
				for _, cluster := range subdirs(filepath.Join(h.Root, lbRoot, lbNS)) {
					errs = append(errs, h.StopLB(lbNS, cluster))
				}
			}
			continue
		}
		for _, name := range subdirs(filepath.Join(h.Root, ns)) {
			errs = append(errs, h.Stop(ns, name))
		}
	}
	return errors.Join(errs...)
}

// subdirs lists the directories in dir, skipping hidden ones (such as the
// address reservations).
func subdirs(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}
