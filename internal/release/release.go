// Package release writes QCP's clusterctl provider repository (`make
// release`, through hack/release), in
// clusterctl's local-repository layout (<out>/<provider label>/<version>/):
//
//   - control-plane-qcp: control-plane-components.yaml (the QuorumControlPlane
//     and EtcdCluster controllers and webhooks) and metadata.yaml;
//   - infrastructure-process: infrastructure-components.yaml (the process
//     provider), metadata.yaml, and the cluster templates and ClusterClass;
//   - cluster-api and bootstrap-kubeadm: CAPI core's and its kubeadm
//     bootstrap provider's own components, built from the pinned module's
//     core/config/default and bootstrap/kubeadm/config/default, with its
//     metadata.yaml, so that `clusterctl init`, which installs both, finds
//     them without the internet;
//
// and <out>/clusterctl.yaml, a clusterctl configuration naming all three as
// local providers. Components are built with kustomize's library (krusty)
// from config/release/*; the manager image is ${QCP_MANAGER_IMAGE}, by
// default ghcr.io/qcp-dev/qcp-manager:<version>, where the image `make image`
// builds is meant to be published.
package release

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/mod/semver"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/qcp-dev/qcp/internal/binaries"
)

// capiStagingImage matches the images CAPI's kustomizations name (core's
// and CABPK's); their releases name registry.k8s.io's of the same version,
// as this does.
var capiStagingImage = regexp.MustCompile(`gcr\.io/k8s-staging-cluster-api/([a-z-]+):main`)

// provider is one provider of the repository.
type provider struct {
	label, kind, name string
	// kustomization is the directory kustomize builds; components the file
	// it is written to.
	kustomization, components, version string
	// metadata is the provider's metadata.yaml.
	metadata []byte
	// extra are files copied beside the components: templates.
	extra []string
}

// Write builds the repository of version from the source tree root into
// out, and returns the path of its clusterctl configuration.
func Write(root, out, version string) (string, error) {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return "", fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH, such as v0.1.0", version)
	}
	out, err := filepath.Abs(out)
	if err != nil {
		return "", err
	}
	capiDir, err := moduleDir(root, "sigs.k8s.io/cluster-api")
	if err != nil {
		return "", err
	}
	coreMetadata, err := os.ReadFile(filepath.Join(capiDir, "metadata.yaml"))
	if err != nil {
		return "", err
	}
	qcpMetadata, err := metadata(version)
	if err != nil {
		return "", err
	}
	templates, err := filepath.Glob(filepath.Join(root, "config", "templates", "*.yaml"))
	if err != nil {
		return "", err
	}
	providers := []provider{
		{label: "control-plane-qcp", kind: "ControlPlaneProvider", name: "qcp", version: version, metadata: qcpMetadata,
			kustomization: filepath.Join(root, "config", "release", "control-plane"), components: "control-plane-components.yaml"},
		{label: "infrastructure-process", kind: "InfrastructureProvider", name: "process", version: version, metadata: qcpMetadata,
			kustomization: filepath.Join(root, "config", "release", "infrastructure"), components: "infrastructure-components.yaml", extra: templates},
		{label: "cluster-api", kind: "CoreProvider", name: "cluster-api", version: binaries.CAPIVersion, metadata: coreMetadata,
			kustomization: filepath.Join(capiDir, "core", "config", "default"), components: "core-components.yaml"},
		// clusterctl init installs CAPI's kubeadm bootstrap provider
		// whenever it installs core, unless told another.
		{label: "bootstrap-kubeadm", kind: "BootstrapProvider", name: "kubeadm", version: binaries.CAPIVersion, metadata: coreMetadata,
			kustomization: filepath.Join(capiDir, "bootstrap", "kubeadm", "config", "default"), components: "bootstrap-components.yaml"},
	}
	type entry struct {
		Name string `json:"name"`
		Type string `json:"type"`
		URL  string `json:"url"`
	}
	var config struct {
		Providers []entry `json:"providers"`
	}
	for _, p := range providers {
		dir := filepath.Join(out, p.label, p.version)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		components, err := build(p.kustomization)
		if err != nil {
			return "", fmt.Errorf("building %s's components from %s: %w", p.label, p.kustomization, err)
		}
		components = bytes.ReplaceAll(components, []byte("RELEASE_VERSION"), []byte(version))
		components = capiStagingImage.ReplaceAll(components, []byte("registry.k8s.io/cluster-api/${1}:"+binaries.CAPIVersion))
		files := map[string][]byte{p.components: components, "metadata.yaml": p.metadata}
		for _, path := range p.extra {
			if files[filepath.Base(path)], err = os.ReadFile(path); err != nil {
				return "", err
			}
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				return "", err
			}
		}
		config.Providers = append(config.Providers, entry{Name: p.name, Type: p.kind, URL: filepath.Join(dir, p.components)})
	}
	data, err := yaml.Marshal(config)
	if err != nil {
		return "", err
	}
	header := "# clusterctl's configuration for this release: every provider from the local repository\n" +
		"# beside it. Use it as clusterctl --config " + filepath.Join(out, "clusterctl.yaml") + "\n"
	path := filepath.Join(out, "clusterctl.yaml")
	return path, os.WriteFile(path, append([]byte(header), data...), 0o644)
}

// build runs kustomize on dir. The providers' kustomizations name files of
// config/ outside their own directory (the generated CRDs and roles), which
// kustomize's default load restrictions forbid.
func build(dir string) ([]byte, error) {
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsNone
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, err
	}
	return m.AsYaml()
}

// metadata is QCP's metadata.yaml: the release series of version, on CAPI's
// v1beta2 contract.
func metadata(version string) ([]byte, error) {
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(semver.MajorMinor(version), "v"), "%d.%d", &major, &minor); err != nil {
		return nil, fmt.Errorf("version %s: %w", version, err)
	}
	return fmt.Appendf(nil, `apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3
kind: Metadata
releaseSeries:
- major: %d
  minor: %d
  contract: v1beta2
`, major, minor), nil
}

// moduleDir is where the go command keeps module path, as root's go.mod
// pins it.
func moduleDir(root, path string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", path)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("finding module %s: %w", path, err)
	}
	return strings.TrimSpace(string(out)), nil
}
