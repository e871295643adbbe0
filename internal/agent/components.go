package agent

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/qcp-dev/qcp/internal/bootstrap"
)

// Process is one component's command line.
type Process struct {
	Name bootstrap.Component
	Path string
	Args []string
	// DynamicArgs, when set, are computed again at every start and go
	// into Args at index DynamicAt: a setting changed while the machine
	// runs (etcd's quota) takes effect at the next restart, and still
	// before the document's extraArgs.
	DynamicArgs func() []string
	DynamicAt   int
	// Nice is the component's scheduling niceness (0 to 19).
	Nice int
}

// CommandLine is the arguments the component starts with now.
func (p Process) CommandLine() []string {
	if p.DynamicArgs == nil {
		return p.Args
	}
	at := min(max(p.DynamicAt, 0), len(p.Args))
	return slices.Concat(p.Args[:at], p.DynamicArgs(), p.Args[at:])
}

// componentNice is the niceness of every component but etcd. etcd's raft
// heartbeats and commits must get the CPU the moment they need it: one
// starved for 100 ms stalls every write, and one starved for an election
// timeout loses its leader. An API server, a controller manager and a
// scheduler are throughput work that can wait a few milliseconds. A machine
// whose API server starts (several CPU-seconds of work) would otherwise
// take the cores from its own etcd and, on a shared host, from every other
// member. Raising the others' niceness needs no privilege; lowering etcd's
// would.
const componentNice = 10

// process is c's command line: the agent's own arguments, then the
// document's extraArgs for c. They go last so that a user's flag wins where
// the binary takes the last value; the flags the agent cannot give up are
// rejected when the document is parsed.
func (a *machineCtx) process(c bootstrap.Component, path string, own []string) Process {
	p := Process{Name: c, Path: path, Args: append(own, a.doc.ExtraFlags(c)...)}
	if c != bootstrap.Etcd {
		p.Nice = componentNice
	}
	return p
}

func (a *machineCtx) url(scheme string, port int) string {
	return fmt.Sprintf("%s://%s:%d", scheme, a.machine.Address, port)
}

// etcdProcess builds etcd's command line; initialCluster and state come
// from joinEtcd for an existing cluster.
func (a *machineCtx) etcdProcess(initialCluster, state string) Process {
	peer := a.url("https", EtcdPeerPort)
	client := a.url("https", EtcdClientPort)
	own := []string{
		"--name=" + a.machine.Name,
		"--data-dir=" + filepath.Join(a.dir, "etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		// Plain HTTP metrics and /health on their own port, as kubeadm
		// does, so probes need no client certificate.
		"--listen-metrics-urls=" + a.url("http", EtcdMetricsPort),
		"--initial-cluster=" + initialCluster,
		"--initial-cluster-state=" + state,
		"--initial-cluster-token=" + a.doc.ClusterName,
		"--client-cert-auth=true",
		"--trusted-ca-file=" + a.pki.File("etcd/ca.crt"),
		"--cert-file=" + a.pki.File("etcd/server.crt"),
		"--key-file=" + a.pki.File("etcd/server.key"),
		"--peer-client-cert-auth=true",
		"--peer-trusted-ca-file=" + a.pki.File("etcd/ca.crt"),
		"--peer-cert-file=" + a.pki.File("etcd/peer.crt"),
		"--peer-key-file=" + a.pki.File("etcd/peer.key"),
		"--snapshot-count=10000",
		"--logger=zap",
		"--log-level=warn",
	}
	p := a.process(bootstrap.Etcd, a.bins["etcd"], own)
	// A restart with the same data directory ignores --initial-cluster*,
	// so the rest of the first command line stays valid.
	p.DynamicArgs, p.DynamicAt = a.etcdSettingsArgs, len(own)
	return p
}

func (a *machineCtx) etcdServers() string {
	if a.etcdEndpoint != "" {
		return a.etcdEndpoint
	}
	if ext := a.doc.Etcd.External; ext != nil {
		return strings.Join(ext.Endpoints, ",")
	}
	// Stacked: the local member first, then the members that existed when
	// this machine joined. kubeadm gives the API server only its local
	// member, so it fails every request from the moment that member is
	// removed until the load balancer notices; with the others listed, it
	// keeps serving while its machine is replaced.
	servers := []string{a.url("https", EtcdClientPort)}
	if local := a.doc.Etcd.Local; local != nil {
		for _, ep := range local.ExistingEndpoints {
			if !slices.Contains(servers, ep) {
				servers = append(servers, ep)
			}
		}
	}
	return strings.Join(servers, ",")
}

func (a *machineCtx) apiserverProcess() Process {
	f := a.pki.File
	own := []string{
		"kube-apiserver",
		"--advertise-address=" + a.machine.Address,
		"--bind-address=" + a.machine.Address,
		fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--allow-privileged=true",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--enable-bootstrap-token-auth=true",
		"--client-ca-file=" + f(ClusterTrustFile),
		"--tls-cert-file=" + f("apiserver.crt"),
		"--tls-private-key-file=" + f("apiserver.key"),
		"--etcd-cafile=" + f("etcd/ca.crt"),
		"--etcd-certfile=" + f("apiserver-etcd-client.crt"),
		"--etcd-keyfile=" + f("apiserver-etcd-client.key"),
		"--kubelet-client-certificate=" + f("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + f("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--proxy-client-cert-file=" + f("front-proxy-client.crt"),
		"--proxy-client-key-file=" + f("front-proxy-client.key"),
		"--requestheader-client-ca-file=" + f("front-proxy-ca.crt"),
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--service-account-issuer=https://kubernetes.default.svc." + a.doc.DNSDomain(),
		"--service-account-key-file=" + f(ServiceAccountTrustFile),
		"--service-account-signing-key-file=" + f(ServiceAccountKeyFile),
		// Bounded tokens, so that a service-account key rotation can know
		// when no token of the old key is left (ServiceAccountTokenMaxLifetime).
		"--service-account-max-token-expiration=" + ServiceAccountTokenMaxLifetime.String(),
		"--service-account-extend-token-expiration=false",
		"--service-cluster-ip-range=" + a.doc.ServiceClusterIPRange(),
		"--profiling=false",
	}
	p := a.process(bootstrap.KubeAPIServer, a.bins["kube"], own)
	p.DynamicArgs, p.DynamicAt = a.apiserverEtcdServers, len(own)
	return p
}

// apiserverEtcdServers is kube-apiserver's --etcd-servers, computed at each
// of its starts: etcdServers, and from its first restart on, beside them,
// every voter the local member lists. The first machine of a cluster knows
// only its own member at boot; an API server restarted once the others
// joined (an etcd CA rotation restarts it before its etcd) then keeps
// serving from them while its local member restarts.
func (a *machineCtx) apiserverEtcdServers() []string {
	servers := strings.Split(a.etcdServers(), ",")
	if a.apiserverStarted.Swap(true) && a.etcdEndpoint == "" && a.doc.Runs(bootstrap.Etcd) {
		urls, err := a.voterClientURLs([]string{a.url("https", EtcdClientPort)})
		if err != nil {
			a.log.Warn("kube-apiserver starts with the etcd members it knew: the local member did not list the others", "err", err)
		}
		for _, u := range urls {
			if !slices.Contains(servers, u) {
				servers = append(servers, u)
			}
		}
	}
	return []string{"--etcd-servers=" + strings.Join(servers, ",")}
}

func (a *machineCtx) controllerManagerProcess() Process {
	f := a.pki.File
	kc := f("controller-manager.conf")
	return a.process(bootstrap.KubeControllerManager, a.bins["kube"], append([]string{
		"kube-controller-manager",
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=" + a.machine.Address,
		fmt.Sprintf("--secure-port=%d", KCMPort),
		"--tls-cert-file=" + f("controller-manager-serving.crt"),
		"--tls-private-key-file=" + f("controller-manager-serving.key"),
		"--client-ca-file=" + f(ClusterTrustFile),
		"--requestheader-client-ca-file=" + f("front-proxy-ca.crt"),
		"--cluster-name=" + a.doc.ClusterName,
		"--cluster-signing-cert-file=" + f("ca.crt"),
		"--cluster-signing-key-file=" + f("ca.key"),
		"--root-ca-file=" + f(ClusterTrustFile),
		"--service-account-private-key-file=" + f(ServiceAccountKeyFile),
		"--use-service-account-credentials=true",
		"--leader-elect=true",
		"--node-monitor-grace-period=" + a.doc.NodeMonitorGracePeriod(),
		"--service-cluster-ip-range=" + a.doc.ServiceClusterIPRange(),
		"--controllers=" + kcmControllers(a.doc.Tunables.PodCIDR != ""),
		"--profiling=false",
	}, kcmNodeIPAM(a.doc.Tunables.PodCIDR)...))
}

// kcmControllers is kube-controller-manager's default set minus what needs
// kubelets or a cloud to do anything, plus the bootstrap-token controllers
// kubeadm enables; node IPAM only with a pod range to allocate from.
func kcmControllers(nodeIPAM bool) string {
	controllers := "*,bootstrapsigner,tokencleaner,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller,-persistentvolume-attach-detach-controller"
	if !nodeIPAM {
		controllers += ",-nodeipam"
	}
	return controllers
}

// kcmNodeIPAM are the flags that give each Node a slice of podCIDR, as
// kubeadm sets them when networking.podSubnet is set.
func kcmNodeIPAM(podCIDR string) []string {
	if podCIDR == "" {
		return nil
	}
	return []string{"--allocate-node-cidrs=true", "--cluster-cidr=" + podCIDR}
}

func (a *machineCtx) schedulerProcess() Process {
	f := a.pki.File
	kc := f("scheduler.conf")
	return a.process(bootstrap.KubeScheduler, a.bins["kube"], []string{
		"kube-scheduler",
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=" + a.machine.Address,
		fmt.Sprintf("--secure-port=%d", SchedulerPort),
		"--tls-cert-file=" + f("scheduler-serving.crt"),
		"--tls-private-key-file=" + f("scheduler-serving.key"),
		"--client-ca-file=" + f(ClusterTrustFile),
		"--requestheader-client-ca-file=" + f("front-proxy-ca.crt"),
		"--leader-elect=true",
		"--profiling=false",
	})
}
