package bootstrap

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// ownedFlag is a flag the agent sets and a document may not: the machine
// would stop working, or stop being what the rest of QCP believes it is,
// if it changed. These are the flags that carry the machine's identity,
// data directory or etcd membership, the address and port the agent
// probes and advertises, and paths into the PKI the agent issues.
type ownedFlag struct {
	// name is the flag without dashes; a trailing * matches every flag
	// with that prefix.
	name string
	// instead names the document field that sets the flag, if there is one.
	instead string
}

// ownedFlags is the deny list of extraArgs, per component. The first entry
// that matches a flag decides, so an exact name may precede a prefix.
var ownedFlags = map[Component][]ownedFlag{
	Etcd: {
		{name: "name"}, {name: "data-dir"}, {name: "wal-dir"},
		// etcd ignores every command-line flag when given a config file.
		{name: "config-file"},
		{name: "initial-cluster-token", instead: "clusterName"},
		{name: "initial-cluster*"}, {name: "discovery*"},
		{name: "listen-*"}, {name: "advertise-client-urls"}, {name: "initial-advertise-peer-urls"},
		{name: "cert-file"}, {name: "key-file"}, {name: "trusted-ca-file"}, {name: "client-cert-auth"}, {name: "auto-tls"},
		{name: "peer-cert-file"}, {name: "peer-key-file"}, {name: "peer-trusted-ca-file"}, {name: "peer-client-cert-auth"}, {name: "peer-auto-tls"},
	},
	KubeAPIServer: {
		{name: "advertise-address"}, {name: "bind-address"}, {name: "secure-port"},
		{name: "etcd-servers", instead: "etcd.external.endpoints"},
		{name: "etcd-cafile"}, {name: "etcd-certfile"}, {name: "etcd-keyfile"},
		{name: "tls-cert-file"}, {name: "tls-private-key-file"}, {name: "client-ca-file"},
		{name: "kubelet-client-certificate"}, {name: "kubelet-client-key"},
		{name: "proxy-client-cert-file"}, {name: "proxy-client-key-file"}, {name: "requestheader-client-ca-file"},
		{name: "service-account-key-file"}, {name: "service-account-signing-key-file"},
		// A service-account key rotation waits out the tokens' lifetime.
		{name: "service-account-max-token-expiration"}, {name: "service-account-extend-token-expiration"},
		// The first address of the range is in the serving certificate.
		{name: "service-cluster-ip-range", instead: "the Cluster's spec.clusterNetwork.services.cidrBlocks"},
	},
	KubeControllerManager: {
		{name: "kubeconfig"}, {name: "authentication-kubeconfig"}, {name: "authorization-kubeconfig"},
		{name: "bind-address"}, {name: "secure-port"},
		{name: "tls-cert-file"}, {name: "tls-private-key-file"}, {name: "client-ca-file"}, {name: "requestheader-client-ca-file"},
		{name: "cluster-signing-cert-file"}, {name: "cluster-signing-key-file"}, {name: "root-ca-file"}, {name: "service-account-private-key-file"},
		{name: "cluster-name", instead: "clusterName"},
		{name: "node-monitor-grace-period", instead: "tunables.nodeMonitorGracePeriod"},
		{name: "service-cluster-ip-range", instead: "the Cluster's spec.clusterNetwork.services.cidrBlocks"},
		{name: "cluster-cidr", instead: "the Cluster's spec.clusterNetwork.pods.cidrBlocks"},
		{name: "allocate-node-cidrs", instead: "the Cluster's spec.clusterNetwork.pods.cidrBlocks"},
	},
	KubeScheduler: {
		// A configuration file would replace the kubeconfig below.
		{name: "config"},
		{name: "kubeconfig"}, {name: "authentication-kubeconfig"}, {name: "authorization-kubeconfig"},
		{name: "bind-address"}, {name: "secure-port"},
		{name: "tls-cert-file"}, {name: "tls-private-key-file"}, {name: "client-ca-file"}, {name: "requestheader-client-ca-file"},
	},
}

// owner returns the entry of ownedFlags that matches flag name, if any.
// Kubernetes components read '_' in a flag name as '-', so --bind_address
// is --bind-address; the match does too, so that spelling cannot slip by.
func owner(c Component, name string) (ownedFlag, bool) {
	name = strings.ReplaceAll(name, "_", "-")
	for _, f := range ownedFlags[c] {
		prefix, isPrefix := strings.CutSuffix(f.name, "*")
		if isPrefix && strings.HasPrefix(name, prefix) || !isPrefix && name == f.name {
			return f, true
		}
	}
	return ownedFlag{}, false
}

var flagName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func (d *Document) validateExtraArgs() []FieldError {
	var errs []FieldError
	add := func(field, problem, fix string) { errs = append(errs, FieldError{field, problem, fix}) }
	// Known components in start order, then unknown keys sorted, so the
	// same document always gets the same message.
	keys := make([]Component, 0, len(d.ExtraArgs))
	for _, c := range allComponents {
		if _, ok := d.ExtraArgs[c]; ok {
			keys = append(keys, c)
		}
	}
	var unknown []Component
	for c := range d.ExtraArgs {
		if !slices.Contains(allComponents, c) {
			unknown = append(unknown, c)
		}
	}
	sort.Slice(unknown, func(i, j int) bool { return unknown[i] < unknown[j] })
	for _, c := range unknown {
		add("extraArgs."+string(c), fmt.Sprintf("unknown component %q", c), "use one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler")
	}
	for _, c := range keys {
		field := "extraArgs." + string(c)
		if !d.Runs(c) && len(d.ExtraArgs[c]) > 0 {
			add(field, fmt.Sprintf("flags are set for %s but components do not include it", c), fmt.Sprintf("add %s to components or remove %s", c, field))
		}
		for i, a := range d.ExtraArgs[c] {
			errs = append(errs, checkArg(c, fmt.Sprintf("%s[%d]", field, i), a)...)
		}
	}
	return errs
}

// CheckArg checks one extra flag for component c as a document's
// validation does; each error's Field is "name" or "value". The control
// plane's admission webhook uses it, so that a flag the agent owns is
// refused when the spec is written, not when a machine is created.
func CheckArg(c Component, a Arg) []FieldError {
	errs := checkArg(c, "", a)
	for i := range errs {
		errs[i].Field = strings.TrimPrefix(errs[i].Field, ".")
	}
	return errs
}

func checkArg(c Component, field string, a Arg) []FieldError {
	var errs []FieldError
	add := func(field, problem, fix string) { errs = append(errs, FieldError{field, problem, fix}) }
	switch {
	case a.Name == "":
		add(field+".name", "empty", "set the flag's name without leading dashes, e.g. log-level")
	case strings.HasPrefix(a.Name, "-"):
		add(field+".name", fmt.Sprintf("%q starts with '-'", a.Name), fmt.Sprintf("write the name without dashes (%q); qcp-agent passes --name=value", strings.TrimLeft(a.Name, "-")))
	case !flagName.MatchString(a.Name):
		add(field+".name", fmt.Sprintf("%q is not a flag name", a.Name), "use letters, digits, '-', '_' and '.' only, and put the value in value")
	default:
		if f, ok := owner(c, a.Name); ok {
			fix := "remove it (qcp-agent sets it from the machine and the certificates it issues, as docs/bootstrap-format.md lists)"
			if f.instead != "" {
				fix = "remove it and set " + f.instead + " instead"
			}
			add(field+".name", fmt.Sprintf("flag --%s of %s is owned by qcp-agent", a.Name, c), fix)
		}
	}
	// exec cannot pass a NUL byte; the component would never start.
	if strings.ContainsRune(a.Value, 0) {
		add(field+".value", "contains a NUL byte", "remove it")
	}
	return errs
}

func (d *Document) validateCertSANs() []FieldError {
	var errs []FieldError
	if len(d.CertSANs) > 0 && !d.Runs(KubeAPIServer) {
		errs = append(errs, FieldError{"certSANs", "set but components do not include kube-apiserver, whose serving certificate they are for", "add kube-apiserver to components or remove certSANs"})
	}
	for i, san := range d.CertSANs {
		if net.ParseIP(san) == nil && !isDNSName(san) {
			errs = append(errs, FieldError{fmt.Sprintf("certSANs[%d]", i), fmt.Sprintf("%q is neither an IP address nor a DNS name", san), "use an IP address such as 192.0.2.10 or a lower-case DNS name such as api.example.com (a leading *. is allowed)"})
		}
	}
	return errs
}

// isDNSName reports whether s is a lower-case DNS name, optionally a
// wildcard (*.example.com) as certificates allow.
func isDNSName(s string) bool {
	s = strings.TrimPrefix(s, "*.")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if len(label) > 63 || !dnsLabel.MatchString(label) {
			return false
		}
	}
	return true
}
