package bootstrap

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/qcp-dev/qcp/internal/certs"
)

// FieldError is one problem in a document: the field (a JSON path), what is
// wrong, and how to fix it.
type FieldError struct {
	Field   string
	Problem string
	Fix     string
}

func (e FieldError) Error() string {
	return fmt.Sprintf("%s: %s; %s", e.Field, e.Problem, e.Fix)
}

// InvalidError lists every problem found in a document, so the author fixes
// them in one round.
type InvalidError struct {
	Errors []FieldError
}

func (e *InvalidError) Error() string {
	msgs := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		msgs[i] = fe.Error()
	}
	return "invalid bootstrap data: " + strings.Join(msgs, "; also ")
}

// Parse decodes a YAML or JSON document strictly (unknown or duplicate
// fields are errors) and validates it.
func Parse(data []byte) (*Document, error) {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, &InvalidError{Errors: []FieldError{{Field: "(document)", Problem: "bootstrap data is empty", Fix: "write a " + Kind + " document with apiVersion " + APIVersion}}}
	}
	// Check the version header before strict decoding so that a document of
	// a newer version is reported as such, not as a list of unknown fields.
	var header struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &header); err != nil {
		return nil, &InvalidError{Errors: []FieldError{{Field: "(document)", Problem: "not valid YAML or JSON: " + err.Error(), Fix: "regenerate the bootstrap data"}}}
	}
	if header.APIVersion != APIVersion {
		return nil, &InvalidError{Errors: []FieldError{{Field: "apiVersion", Problem: fmt.Sprintf("unknown version %q", header.APIVersion), Fix: fmt.Sprintf("this agent reads %q; upgrade qcp-agent or regenerate the data for this version", APIVersion)}}}
	}
	if header.Kind != Kind {
		return nil, &InvalidError{Errors: []FieldError{{Field: "kind", Problem: fmt.Sprintf("unknown kind %q", header.Kind), Fix: fmt.Sprintf("set kind: %s", Kind)}}}
	}
	var doc Document
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		if f := unknownField(data); f != "" {
			return nil, &InvalidError{Errors: []FieldError{{Field: f, Problem: fmt.Sprintf("unknown field %q", f), Fix: "remove it or correct its spelling (field names are case-sensitive); see docs/bootstrap-format.md"}}}
		}
		return nil, &InvalidError{Errors: []FieldError{{Field: "(document)", Problem: err.Error(), Fix: "remove or correct the named field; see docs/bootstrap-format.md"}}}
	}
	if err := doc.Validate(); err != nil {
		return nil, err
	}
	return &doc, nil
}

// Marshal encodes the document as YAML after validating it, so nothing
// writes data the agent would reject.
func Marshal(d *Document) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	out, err := yaml.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encoding bootstrap data for cluster %s: %w", d.ClusterName, err)
	}
	return out, nil
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Validate checks the document's semantics and returns *InvalidError.
func (d *Document) Validate() error {
	var errs []FieldError
	add := func(field, problem, fix string) { errs = append(errs, FieldError{field, problem, fix}) }

	if d.APIVersion != APIVersion {
		add("apiVersion", fmt.Sprintf("unknown version %q", d.APIVersion), "set apiVersion: "+APIVersion)
	}
	if d.Kind != Kind {
		add("kind", fmt.Sprintf("unknown kind %q", d.Kind), "set kind: "+Kind)
	}
	if len(d.ClusterName) > 63 || !dnsLabel.MatchString(d.ClusterName) {
		add("clusterName", fmt.Sprintf("%q is not a DNS label", d.ClusterName), "set the name of the workload cluster (lower-case letters, digits, '-')")
	}
	if d.ControlPlaneEndpoint != "" {
		if _, _, err := splitHostPort(d.ControlPlaneEndpoint); err != nil {
			add("controlPlaneEndpoint", err.Error(), "set host:port of the cluster's load balancer, e.g. 127.0.200.1:6443")
		}
	}
	errs = append(errs, d.validateComponents()...)
	errs = append(errs, d.validateEtcd()...)
	errs = append(errs, d.validateCAs()...)
	errs = append(errs, d.validateExtraArgs()...)
	errs = append(errs, d.validateCertSANs()...)
	if d.Tunables.NodeMonitorGracePeriod != "" {
		if p, err := time.ParseDuration(d.Tunables.NodeMonitorGracePeriod); err != nil || p <= 0 {
			add("tunables.nodeMonitorGracePeriod", fmt.Sprintf("%q is not a positive duration", d.Tunables.NodeMonitorGracePeriod), "use a Go duration such as 20s or remove the field")
		}
	}
	if d.Tunables.CertificateValidityDays < 0 {
		add("tunables.certificateValidityDays", fmt.Sprintf("%d is negative", d.Tunables.CertificateValidityDays), "use a positive number of days or remove the field")
	}
	if v := d.Tunables.CertificateValidity; v != "" {
		if p, err := time.ParseDuration(v); err != nil || p < time.Minute {
			add("tunables.certificateValidity", fmt.Sprintf("%q is not a duration of at least a minute", v), "use a Go duration such as 720h or remove the field to use certificateValidityDays")
		}
	}
	if d.Tunables.ServiceClusterIPRange != "" {
		if _, n, err := net.ParseCIDR(d.Tunables.ServiceClusterIPRange); err != nil || n.IP.To4() == nil {
			add("tunables.serviceClusterIPRange", fmt.Sprintf("%q is not an IPv4 CIDR", d.Tunables.ServiceClusterIPRange), "use a CIDR such as 10.96.0.0/12 or remove the field")
		}
	}
	if d.Tunables.PodCIDR != "" {
		if _, _, err := net.ParseCIDR(d.Tunables.PodCIDR); err != nil {
			add("tunables.podCIDR", fmt.Sprintf("%q is not a CIDR", d.Tunables.PodCIDR), "use a CIDR such as 192.168.0.0/16 or remove the field")
		}
	}
	if d.Tunables.DNSDomain != "" {
		if msgs := validation.IsDNS1123Subdomain(d.Tunables.DNSDomain); len(msgs) > 0 {
			add("tunables.dnsDomain", fmt.Sprintf("%q is not a DNS domain: %s", d.Tunables.DNSDomain, strings.Join(msgs, "; ")), "use a domain such as cluster.local or remove the field")
		}
	}
	if len(errs) > 0 {
		return &InvalidError{Errors: errs}
	}
	return nil
}

var versionRE = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$`)

func (d *Document) validateComponents() []FieldError {
	var errs []FieldError
	if len(d.Components) == 0 {
		errs = append(errs, FieldError{"components", "no component listed", "list at least one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler"})
	}
	seen := map[Component]bool{}
	for i, c := range d.Components {
		field := fmt.Sprintf("components[%d]", i)
		switch {
		case !slices.Contains(allComponents, c):
			errs = append(errs, FieldError{field, fmt.Sprintf("unknown component %q", c), "use one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler"})
		case seen[c]:
			errs = append(errs, FieldError{field, fmt.Sprintf("component %q listed twice", c), "list each component once"})
		}
		seen[c] = true
	}
	if d.RunsKubernetes() && !versionRE.MatchString(d.Versions.Kubernetes) {
		errs = append(errs, FieldError{"versions.kubernetes", fmt.Sprintf("%q is not a version like v1.36.3", d.Versions.Kubernetes), "set the Kubernetes version of the components to run"})
	}
	if d.Runs(Etcd) && !versionRE.MatchString(d.Versions.Etcd) {
		errs = append(errs, FieldError{"versions.etcd", fmt.Sprintf("%q is not a version like v3.6.16", d.Versions.Etcd), "set the etcd version to run"})
	}
	return errs
}

func (d *Document) validateEtcd() []FieldError {
	var errs []FieldError
	add := func(field, problem, fix string) { errs = append(errs, FieldError{field, problem, fix}) }
	local, ext := d.Etcd.Local, d.Etcd.External
	switch {
	case d.Runs(Etcd) && local == nil:
		add("etcd.local", "components include etcd but etcd.local is missing", "set etcd.local.mode to new or existing")
	case !d.Runs(Etcd) && local != nil:
		add("etcd.local", "etcd.local is set but components do not include etcd", "add etcd to components or remove etcd.local")
	case local != nil && ext != nil:
		add("etcd", "both local and external are set", "keep etcd.local for a stacked member or etcd.external, not both")
	case d.Runs(KubeAPIServer) && local == nil && ext == nil:
		add("etcd", "kube-apiserver needs etcd but neither etcd.local nor etcd.external is set", "run a local member or set etcd.external")
	}
	if local != nil {
		switch local.Mode {
		case EtcdModeNew:
		case EtcdModeExisting:
			if len(local.ExistingEndpoints) == 0 && local.InitialCluster == "" {
				add("etcd.local.existingEndpoints", "mode existing needs the endpoints of running members or an initial cluster", "list the client URLs of existing members")
			}
		default:
			add("etcd.local.mode", fmt.Sprintf("unknown mode %q", local.Mode), "use new (bootstrap a new cluster) or existing (join)")
		}
		for i, ep := range local.ExistingEndpoints {
			if err := checkURL(ep); err != nil {
				add(fmt.Sprintf("etcd.local.existingEndpoints[%d]", i), err.Error(), "use an https://host:port client URL")
			}
		}
		if local.InitialCluster != "" {
			if err := checkInitialCluster(local.InitialCluster); err != nil {
				add("etcd.local.initialCluster", err.Error(), "use name=https://host:2380,... as etcd's --initial-cluster")
			}
		}
		if r := local.Restore; r != nil {
			checkRestore(r, local.Mode, add)
		}
		if local.QuotaBackendBytes < 0 {
			add("etcd.local.quotaBackendBytes", fmt.Sprintf("%d is negative", local.QuotaBackendBytes), "set etcd's backend quota in bytes, e.g. 8589934592 for 8 GiB, or remove the field for etcd's default of 2 GiB")
		}
	}
	if ext != nil {
		if len(ext.Endpoints) == 0 {
			add("etcd.external.endpoints", "no endpoint", "list the client URLs of the external etcd cluster")
		}
		for i, ep := range ext.Endpoints {
			if err := checkURL(ep); err != nil {
				add(fmt.Sprintf("etcd.external.endpoints[%d]", i), err.Error(), "use an https://host:port client URL")
			}
		}
		if _, err := certs.CertPool([]byte(ext.CACert)); err != nil {
			add("etcd.external.caCert", "not a PEM certificate", "set the external etcd cluster's CA certificate (the <cluster>-etcd Secret's tls.crt)")
		}
		if _, err := certs.ParseKeyPair([]byte(ext.ClientCert), []byte(ext.ClientKey)); err != nil {
			add("etcd.external.clientCert", "client certificate and key do not form a valid pair: "+err.Error(), "set the apiserver-etcd-client certificate and key")
		}
	}
	return errs
}

func (d *Document) validateCAs() []FieldError {
	var errs []FieldError
	c := d.Certificates
	need := func(field string, kp *CertKey, needed bool, why string) {
		if kp == nil {
			if needed {
				errs = append(errs, FieldError{field, "missing; " + why, "copy the CA certificate and key from the cluster's Secrets"})
			}
			return
		}
		if _, err := certs.ParseKeyPair([]byte(kp.Cert), []byte(kp.Key)); err != nil {
			errs = append(errs, FieldError{field, "not a valid PEM certificate and key: " + err.Error(), "copy the CA certificate and key from the cluster's Secrets"})
		}
	}
	need("certificates.clusterCA", c.ClusterCA, d.RunsKubernetes(), "Kubernetes components and the Node need the cluster CA")
	need("certificates.etcdCA", c.EtcdCA, d.Runs(Etcd), "a local etcd member issues its certificates from the etcd CA")
	bundle := func(field, trust string, ca *CertKey, caField string) {
		if trust == "" || ca == nil {
			return
		}
		if kp, err := certs.ParseKeyPair([]byte(ca.Cert), []byte(ca.Key)); err == nil {
			if err := certs.CheckBundle([]byte(trust), kp); err != nil {
				errs = append(errs, FieldError{field, "not a bundle of authorities that holds " + caField + ": " + err.Error(), "leave it empty to trust " + caField + " alone"})
			}
		}
	}
	bundle("certificates.etcdTrust", c.EtcdTrust, c.EtcdCA, "certificates.etcdCA")
	bundle("certificates.clusterTrust", c.ClusterTrust, c.ClusterCA, "certificates.clusterCA")
	need("certificates.clusterSigner", c.ClusterSigner, false, "")
	if c.ClusterSigner != nil && c.ClusterCA != nil {
		bundle("certificates.clusterTrust", cmp.Or(c.ClusterTrust, c.ClusterCA.Cert), c.ClusterSigner, "certificates.clusterSigner")
	}
	bundle("certificates.frontProxyTrust", c.FrontProxyTrust, c.FrontProxyCA, "certificates.frontProxyCA")
	need("certificates.frontProxyCA", c.FrontProxyCA, d.Runs(KubeAPIServer), "kube-apiserver needs the front-proxy CA")
	needSA := d.Runs(KubeAPIServer) || d.Runs(KubeControllerManager)
	switch {
	case c.ServiceAccount == nil && needSA:
		errs = append(errs, FieldError{"certificates.serviceAccount", "missing; kube-apiserver and kube-controller-manager need the service-account key pair", "copy tls.key and tls.crt of the <cluster>-sa Secret"})
	case c.ServiceAccount != nil:
		if !isPEM(c.ServiceAccount.PrivateKey) || !isPEM(c.ServiceAccount.PublicKey) {
			errs = append(errs, FieldError{"certificates.serviceAccount", "privateKey and publicKey must both be PEM", "copy tls.key and tls.crt of the <cluster>-sa Secret"})
		}
	}
	return errs
}

// MissingBinaryError says a binary the document needs is not installed.
type MissingBinaryError struct {
	Name, Version, Path string
}

func (e *MissingBinaryError) Error() string {
	return fmt.Sprintf("binary %s %s not found at %s: build it with `make binaries` (for this version, e.g. KUBE_VERSION/ETCD_VERSION=%s) or request a version that is installed", e.Name, e.Version, e.Path, e.Version)
}

// Binaries returns the paths under binDir of the binaries the document needs.
func (d *Document) Binaries(binDir string) map[string]string {
	out := map[string]string{}
	if d.Runs(Etcd) {
		out["etcd"] = filepath.Join(binDir, "etcd-"+d.Versions.Etcd)
	}
	if d.RunsKubernetes() {
		out["kube"] = filepath.Join(binDir, "kube-"+d.Versions.Kubernetes)
	}
	return out
}

// CheckBinaries returns a *MissingBinaryError for the first binary the
// document needs that is not an executable file under binDir.
func (d *Document) CheckBinaries(binDir string) error {
	for _, name := range []string{"etcd", "kube"} {
		p, ok := d.Binaries(binDir)[name]
		if !ok {
			continue
		}
		version := d.Versions.Etcd
		if name == "kube" {
			version = d.Versions.Kubernetes
		}
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return &MissingBinaryError{Name: name, Version: version, Path: p}
		}
	}
	return nil
}

// RequiredBinaries reads only what a document asks the machine image for:
// its components and their versions, nothing of its key material. An
// infrastructure provider that runs cloud-config checks its image with it
// (CheckBinaries) before it boots a machine, without reading the rest;
// the agent validates the whole document. A document it cannot read
// names nothing to check.
func RequiredBinaries(data []byte) *Document {
	var public struct {
		Components []Component `json:"components"`
		Versions   Versions    `json:"versions"`
	}
	_ = yaml.Unmarshal(data, &public)
	return &Document{Components: public.Components, Versions: public.Versions}
}

// IsMissingBinary reports whether err is (or wraps) a *MissingBinaryError.
func IsMissingBinary(err error) bool {
	var m *MissingBinaryError
	return errors.As(err, &m)
}

func isPEM(s string) bool {
	return strings.Contains(s, "-----BEGIN ")
}

func splitHostPort(hp string) (string, int, error) {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, fmt.Errorf("%q is not host:port", hp)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 || host == "" {
		return "", 0, fmt.Errorf("%q is not host:port with a port in 1-65535", hp)
	}
	return host, p, nil
}

func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("%q is not an https:// URL", s)
	}
	if _, _, err := splitHostPort(u.Host); err != nil {
		return err
	}
	return nil
}

func checkInitialCluster(s string) error {
	for _, part := range strings.Split(s, ",") {
		name, u, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			return fmt.Errorf("entry %q is not name=peerURL", part)
		}
		if err := checkURL(u); err != nil {
			return err
		}
	}
	return nil
}

// checkRestore checks etcd.local.restore.
func checkRestore(r *EtcdRestore, mode EtcdMode, add func(field, problem, fix string)) {
	if mode != EtcdModeNew {
		add("etcd.local.restore", "a restore is set, but mode is "+string(mode)+": only a new cluster starts from a snapshot", "set mode new, or remove etcd.local.restore")
	}
	if u, err := url.Parse(r.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		add("etcd.local.restore.url", "not an http(s) URL", "give the presigned URL of the snapshot object")
	}
	if r.CA != "" {
		if _, err := certs.CertPool([]byte(r.CA)); err != nil {
			add("etcd.local.restore.ca", err.Error(), "give the PEM certificates of the store's CA")
		}
	}
	if r.Size <= 0 || len(r.SHA256) != 64 {
		add("etcd.local.restore", "size and sha256 are required", "copy both from the snapshot's manifest")
	}
	if r.Revision <= 0 || r.BumpRevision <= 0 {
		add("etcd.local.restore.bumpRevision", "revision and bumpRevision must be positive", "copy revision from the manifest, and bump it by 1000000000")
	}
}
