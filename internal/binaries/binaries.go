// Package binaries finds the pinned binaries `make binaries` builds into
// bin/, named with their version (bin/etcd-v3.6.16, bin/kube-v1.36.3, ...).
package binaries

import (
	"fmt"
	"os"
	"path/filepath"
)

// Default versions; `make binaries` builds these unless told otherwise.
const (
	EtcdVersion = "v3.6.16"
	KubeVersion = "v1.36.3"
	CAPIVersion = "v1.14.2"
	// PreviousKubeVersion is the kube version upgrades are tested from; `make
	// test` builds it too (KUBE_PREVIOUS_VERSION).
	PreviousKubeVersion = "v1.35.4"
	// PreviousEtcdVersion is the etcd version EtcdCluster upgrades are
	// tested from, the newest v3.5 patch the module proxy serves; `make
	// test` builds it too (ETCD_PREVIOUS_VERSION).
	PreviousEtcdVersion = "v3.5.35"
	// ObjectStoreVersion is versitygw's, the S3-compatible server the
	// local environment and the backup tests store snapshots in.
	ObjectStoreVersion = "v1.8.0"
)

// makeVariables name the Makefile variable that picks each pinned binary's version.
var makeVariables = map[string]string{"etcd": "ETCD_VERSION", "kube": "KUBE_VERSION", "capi-manager": "CAPI_VERSION", "cabpk-manager": "CAPI_VERSION", "versitygw": "VERSITYGW_VERSION"}

// DirEnv overrides where the binaries are looked up.
const DirEnv = "QCP_BIN_DIR"

// Dir returns the binaries directory: $QCP_BIN_DIR, or bin/ in the first
// ancestor of the working directory that holds go.mod of this repository.
func Dir() (string, error) {
	if d := os.Getenv(DirEnv); d != "" {
		return filepath.Abs(d)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "hack", "tools", "kube", "gomod.sh")); err == nil {
			return filepath.Join(dir, "bin"), nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("cannot find the QCP repository above %s: set %s to the directory holding the pinned binaries", wd, DirEnv)
		}
	}
}

// Path returns the path of binary name at version (name is etcd, kube,
// capi-manager, qcp-agent, ...), and an error naming the fix if it is missing.
func Path(name, version string) (string, error) {
	dir, err := Dir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name+"-"+version)
	if _, err := os.Stat(p); err != nil {
		if v, ok := makeVariables[name]; ok {
			return "", fmt.Errorf("binary %s %s not found at %s: run `make binaries` (for another version, `make binaries %s=%s`)", name, version, p, v, version)
		}
		return "", fmt.Errorf("binary %s %s not found at %s: run `make binaries`", name, version, p)
	}
	return p, nil
}
