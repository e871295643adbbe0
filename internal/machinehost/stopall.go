package machinehost

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// StopAll stops every machine and load balancer under Root, as tearing down
// a whole local environment must: machines outlive the manager by design,
// so nothing else would stop them. They stop side by side: each waits up
// to stopTimeout for its processes to exit, and one after another that
// added up to minutes at the end of a test package.
func (h *Host) StopAll() error {
	var stops []func() error
	for _, ns := range subdirs(h.Root) {
		if ns == lbRoot {
			for _, lbNS := range subdirs(filepath.Join(h.Root, lbRoot)) {
				for _, cluster := range subdirs(filepath.Join(h.Root, lbRoot, lbNS)) {
					stops = append(stops, func() error { return h.StopLB(lbNS, cluster) })
				}
			}
			continue
		}
		for _, name := range subdirs(filepath.Join(h.Root, ns)) {
			stops = append(stops, func() error { return h.Stop(ns, name) })
		}
	}
	errs := make([]error, len(stops))
	var wg sync.WaitGroup
	for i, stop := range stops {
		wg.Go(func() { errs[i] = stop() })
	}
	wg.Wait()
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
