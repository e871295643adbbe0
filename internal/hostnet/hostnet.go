// Package hostnet gives process machines a network of their own on one
// host, as VMs have: each machine is a network namespace with one address,
// joined by a veth pair to a bridge the host also sits on, and partitions
// between machines are policy-routing rules inside their namespaces
// (netfilter is not needed). Nothing is routed off the host: the bridge
// carries only the range's own addresses, and no namespace has a route
// beyond them.
//
// It drives iproute2's ip, which every Linux host QCP's process provider
// runs on has; it needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), which
// Available reports.
package hostnet

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultPrefix is the range a Network uses unless told another:
// 198.18.0.0/15 is set aside for benchmarking networks (RFC 2544), so it
// cannot collide with a real network a host is on.
var DefaultPrefix = netip.MustParsePrefix("198.18.0.0/16")

// Network is one bridge and the namespaces attached to it.
type Network struct {
	// Bridge is the bridge's interface name (at most 15 bytes).
	Bridge string
	// Prefix is the range; the host takes its first address on the
	// bridge (HostAddr), the machines the others.
	Prefix netip.Prefix
}

// ForRange is the Network of prefix, on a bridge named after it, so that
// each range gets a bridge of its own and finds it again after a restart.
func ForRange(prefix netip.Prefix) *Network {
	sum := sha256.Sum256([]byte(prefix.Masked().String()))
	return &Network{Bridge: "qcpbr" + hex.EncodeToString(sum[:])[:8], Prefix: prefix}
}

// HostAddr is the host's own address on the bridge: the range's first.
func (n Network) HostAddr() netip.Addr { return n.Prefix.Masked().Addr().Next() }

// Available reports why namespaces cannot be made here (nil if they can):
// ip is missing, or the process is not root.
func Available() error {
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("iproute2's ip is not installed: %w", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("creating network namespaces needs root")
	}
	return nil
}

// ip runs ip with args and returns its error with ip's own message.
func ip(args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// exists reports whether ip's "show" of args lists something.
func exists(args ...string) bool {
	out, err := exec.Command("ip", args...).Output()
	return err == nil && len(bytes.TrimSpace(out)) > 0
}

// Ensure creates the bridge with the host's address, and brings it up; an
// existing one is kept.
func (n Network) Ensure() error {
	if !n.Prefix.IsValid() || !n.Prefix.Addr().Is4() || n.Prefix.Bits() > 30 {
		return fmt.Errorf("address range %s: want an IPv4 prefix of /30 or wider", n.Prefix)
	}
	if !exists("link", "show", "dev", n.Bridge) {
		if err := ip("link", "add", n.Bridge, "type", "bridge"); err != nil {
			return err
		}
	}
	host := netip.PrefixFrom(n.HostAddr(), n.Prefix.Bits()).String()
	if !exists("addr", "show", "dev", n.Bridge, "to", host) {
		if err := ip("addr", "add", host, "dev", n.Bridge); err != nil {
			return err
		}
	}
	return ip("link", "set", n.Bridge, "up")
}

// Remove deletes the bridge (the namespaces' veth pairs go with their
// namespaces, Detach).
func (n Network) Remove() error {
	if !exists("link", "show", "dev", n.Bridge) {
		return nil
	}
	return ip("link", "del", n.Bridge)
}

// localRulePref is where Attach moves the namespace's lookup of its local
// table: a packet for one of the namespace's own addresses matches that
// lookup first, so the cuts (Cut, at lower preferences) must come before
// it to see incoming packets at all.
const localRulePref = 1000

// Attach creates namespace ns with addr on its eth0, joined to the bridge
// by a veth pair whose host end is hostIf (at most 15 bytes), and its
// loopback up. The namespace reaches the range on-link and nothing else.
// An ns that exists already is left as it is.
func (n Network) Attach(ns, hostIf string, addr netip.Addr) error {
	if !n.Prefix.Contains(addr) || addr == n.HostAddr() {
		return fmt.Errorf("address %s: want one of %s other than the host's %s", addr, n.Prefix, n.HostAddr())
	}
	if nsExists(ns) {
		return nil
	}
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", hostIf, "master", n.Bridge, "up"},
		{"-n", ns, "addr", "add", netip.PrefixFrom(addr, n.Prefix.Bits()).String(), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "rule", "add", "pref", strconv.Itoa(localRulePref), "table", "local"},
		{"-n", ns, "rule", "del", "pref", "0"},
	}
	for _, args := range steps {
		if err := ip(args...); err != nil {
			return errors.Join(err, n.Detach(ns, hostIf))
		}
	}
	return nil
}

// nsExists reports whether the named namespace exists.
func nsExists(ns string) bool {
	_, err := os.Stat("/run/netns/" + ns)
	return err == nil
}

// Detach deletes namespace ns and its veth pair (by its host end hostIf,
// at once: a namespace's own links go only once the kernel has finished
// tearing it down, a moment after), its rules with it.
func (n Network) Detach(ns, hostIf string) error {
	var errs []error
	if exists("link", "show", "dev", hostIf) {
		errs = append(errs, ip("link", "del", hostIf))
	}
	if nsExists(ns) {
		errs = append(errs, ip("netns", "del", ns))
	}
	return errors.Join(errs...)
}

// Ports lists the host ends of the veth pairs attached to the bridge, one
// for each namespace on the network; none while there is no bridge.
func (n Network) Ports() ([]string, error) {
	if !exists("link", "show", "dev", n.Bridge) {
		return nil, nil
	}
	out, err := exec.Command("ip", "-o", "link", "show", "master", n.Bridge).Output()
	if err != nil {
		return nil, fmt.Errorf("listing the links of bridge %s: %w", n.Bridge, err)
	}
	var ports []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// "12: qcpv0123456789@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> …"
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			ports = append(ports, name)
		}
	}
	return ports, nil
}

// Command is name with args run inside namespace ns.
func Command(ns, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// Direction is which of a namespace's packets a cut drops.
type Direction string

const (
	// Both drops what the namespace sends to the peer and what it
	// receives from it.
	Both Direction = "both"
	// Outgoing drops only what the namespace sends to the peer. TCP
	// breaks both ways once the return path fails: the peer's segments
	// arrive but the namespace's acknowledgements never leave.
	Outgoing Direction = "outgoing"
)

// cutPref is the preference of every cut's rules: before the local table
// (localRulePref).
const cutPref = 100

// Cut drops, inside namespace ns, its traffic with peer (Both or
// Outgoing). It holds until Heal; cutting again is a no-op.
func Cut(ns string, peer netip.Addr, d Direction) error {
	for _, sel := range selectors(peer, d) {
		if ruleExists(ns, sel) {
			continue
		}
		if err := ip(append([]string{"-n", ns, "rule", "add", "pref", strconv.Itoa(cutPref)}, append(sel, "prohibit")...)...); err != nil {
			return err
		}
	}
	return nil
}

// Heal removes every cut of namespace ns with peer.
func Heal(ns string, peer netip.Addr) error {
	for _, sel := range selectors(peer, Both) {
		for ruleExists(ns, sel) {
			if err := ip(append([]string{"-n", ns, "rule", "del", "pref", strconv.Itoa(cutPref)}, sel...)...); err != nil {
				return err
			}
		}
	}
	return nil
}

// HealAll removes every cut of namespace ns, with whichever peer.
func HealAll(ns string) error {
	for exists("-n", ns, "rule", "show", "pref", strconv.Itoa(cutPref)) {
		if err := ip("-n", ns, "rule", "del", "pref", strconv.Itoa(cutPref)); err != nil {
			return err
		}
	}
	return nil
}

// Cuts lists the cut rules of namespace ns, as ip shows them.
func Cuts(ns string) ([]string, error) {
	out, err := exec.Command("ip", "-n", ns, "rule", "show", "pref", strconv.Itoa(cutPref)).Output()
	if err != nil {
		return nil, fmt.Errorf("listing the rules of namespace %s: %w", ns, err)
	}
	return strings.FieldsFunc(string(out), func(r rune) bool { return r == '\n' }), nil
}

// HostAddrOf is the host's address on the network namespace ns is attached
// to: the first of the range its eth0's address is in.
func HostAddrOf(ns string) (netip.Addr, error) {
	out, err := exec.Command("ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "eth0").Output()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("reading the address of namespace %s: %w", ns, err)
	}
	// "2: eth0    inet 198.18.0.5/24 brd … scope global eth0"
	fields := strings.Fields(string(out))
	for i, f := range fields {
		if f == "inet" && i+1 < len(fields) {
			p, err := netip.ParsePrefix(fields[i+1])
			if err != nil {
				return netip.Addr{}, fmt.Errorf("namespace %s: eth0's address %q: %w", ns, fields[i+1], err)
			}
			return Network{Prefix: p}.HostAddr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("namespace %s: eth0 has no IPv4 address", ns)
}

// Exists reports whether the named network namespace exists.
func Exists(ns string) bool { return nsExists(ns) }

// selectors are the rule selectors of a cut with peer.
func selectors(peer netip.Addr, d Direction) [][]string {
	out := [][]string{{"to", peer.String()}}
	if d == Both {
		out = append(out, []string{"from", peer.String()})
	}
	return out
}

// ruleExists reports whether namespace ns has a cut rule with sel.
func ruleExists(ns string, sel []string) bool {
	return exists(append([]string{"-n", ns, "rule", "show", "pref", strconv.Itoa(cutPref)}, sel...)...)
}

// HostnameEnv tells a process launched in a UTS namespace of its own the
// hostname to give it (SetHostname); LauncherUTSEnv names the UTS namespace
// of the process that launched it, which must not be renamed.
const (
	HostnameEnv    = "QCP_HOSTNAME"
	LauncherUTSEnv = "QCP_LAUNCHER_UTS"
)

// HostnameEnviron is what a launcher adds to the environment of a process
// it starts in a UTS namespace of its own, for SetHostname to name it
// hostname.
func HostnameEnviron(hostname string) ([]string, error) {
	own, err := os.Readlink("/proc/self/ns/uts")
	if err != nil {
		return nil, fmt.Errorf("reading this process's UTS namespace: %w", err)
	}
	return []string{HostnameEnv + "=" + hostname, LauncherUTSEnv + "=" + own}, nil
}

// SetHostname gives the calling process's UTS namespace the hostname
// HostnameEnv names, if it names one. It refuses to rename its launcher's
// (the host's) namespace: the process must run in one of its own.
func SetHostname() error {
	name := os.Getenv(HostnameEnv)
	if name == "" {
		return nil
	}
	own, err := os.Readlink("/proc/self/ns/uts")
	if err != nil {
		return fmt.Errorf("%s is set, but this process's UTS namespace cannot be told: %w", HostnameEnv, err)
	}
	if launcher := os.Getenv(LauncherUTSEnv); launcher == "" || launcher == own {
		return fmt.Errorf("%s is set, but this process may share its launcher's UTS namespace (%s=%q, its own %s): not renaming the host", HostnameEnv, LauncherUTSEnv, launcher, own)
	}
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("setting the hostname %q: %w", name, err)
	}
	return nil
}
