package images_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/qcp-dev/qcp/images"
)

// TestInstall installs a tree from a bin directory as `make binaries`
// leaves it (symbolic links to the pinned binaries, other files beside
// them): qcp-agent and every etcd and Kubernetes version land where the
// bootstrap data's unit runs them, as regular executables, and nothing
// else; a bin directory without them is refused.
func TestInstall(t *testing.T) {
	store, bin := t.TempDir(), t.TempDir()
	for _, name := range []string{"etcd-v3.6.16", "etcd-v3.5.35", "kube-v1.36.3", "kube-v1.35.4", "qcp-agent", "qcp-manager", "clusterctl-v1.14.2"} {
		if err := os.WriteFile(filepath.Join(store, name), []byte("#!/bin/sh\necho "+name+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(store, name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	if err := images.Install(root, bin, filepath.Join(bin, "qcp-agent")); err != nil {
		t.Fatal(err)
	}
	agent, binDir := images.Paths(root)
	for _, f := range []string{agent, filepath.Join(binDir, "etcd-v3.6.16"), filepath.Join(binDir, "kube-v1.35.4")} {
		fi, err := os.Lstat(f)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s: %v (%v); want an executable regular file", f, fi, err)
		}
	}
	entries, err := os.ReadDir(binDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"etcd-v3.5.35", "etcd-v3.6.16", "kube-v1.35.4", "kube-v1.36.3"}; !slices.Equal(names, want) {
		t.Errorf("%s holds %v, want every pinned version and nothing else: %v", binDir, names, want)
	}
	if fi, err := os.Stat(filepath.Join(root, "var/lib/qcp")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the agent's data directory: %v (%v), want mode 0700", fi, err)
	}
	// Installing again over the tree (a manager restart) works.
	if err := images.Install(root, bin, filepath.Join(bin, "qcp-agent")); err != nil {
		t.Fatal(err)
	}

	empty := t.TempDir()
	err = images.Install(t.TempDir(), empty, filepath.Join(bin, "qcp-agent"))
	if err == nil || !strings.Contains(err.Error(), "make binaries") {
		t.Errorf("installing from a bin directory without binaries: %v, want a refusal naming make binaries", err)
	}
}
