package hostnet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inNS runs f on a thread inside namespace ns: the sockets f creates live
// there.
func inNS(t *testing.T, ns string, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		t.Fatalf("entering %s: %v", ns, err)
	}
	defer func() {
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			panic(fmt.Sprintf("leaving %s: %v", ns, err)) // the thread must not serve others in ns
		}
	}()
	f()
}

// dial connects to addr from namespace ns ("" for the host) and reports
// whether it got through within a second.
func dial(t *testing.T, ns, addr string) error {
	t.Helper()
	var err error
	connect := func() {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
		}
	}
	if ns == "" {
		connect()
	} else {
		inNS(t, ns, connect)
	}
	return err
}

// TestNetwork: two namespaces on a bridge reach each other and the host;
// a cut in one drops its traffic with the other (both ways, or only what
// it sends) and leaves the host's; healing restores it; detaching and
// removing leave no namespace or link behind.
func TestNetwork(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("network namespaces cannot be made here: %v", err)
	}
	id := rand.IntN(1 << 16)
	n := Network{Bridge: fmt.Sprintf("qcpt%x", id), Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(id >> 8), 0}), 24)}
	if err := n.Ensure(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Remove(); err != nil {
			t.Error(err)
		}
	})
	if err := n.Ensure(); err != nil {
		t.Fatalf("ensuring an existing network: %v", err)
	}
	a, b := fmt.Sprintf("qcpt%x-a", id), fmt.Sprintf("qcpt%x-b", id)
	addrA, addrB := n.HostAddr().Next(), n.HostAddr().Next().Next()
	for _, m := range []struct {
		ns, hostIf string
		addr       netip.Addr
	}{{a, fmt.Sprintf("qcpt%xa", id), addrA}, {b, fmt.Sprintf("qcpt%xb", id), addrB}} {
		if err := n.Attach(m.ns, m.hostIf, m.addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := n.Detach(m.ns, m.hostIf); err != nil {
				t.Error(err)
			}
			if nsExists(m.ns) || exists("link", "show", "dev", m.hostIf) {
				t.Errorf("namespace %s or link %s left behind", m.ns, m.hostIf)
			}
		})
	}
	if err := n.Attach("qcpt-outside", "qcptout", netip.MustParseAddr("127.0.0.9")); err == nil || nsExists("qcpt-outside") {
		t.Error("attached an address outside the range")
	}

	var ln net.Listener
	inNS(t, b, func() {
		var err error
		if ln, err = net.Listen("tcp", net.JoinHostPort(addrB.String(), "2380")); err != nil {
			t.Fatal(err)
		}
	})
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	target := ln.Addr().String()
	within := func(what string, f func() error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		for err := f(); err != nil; err = f() {
			if ctx.Err() != nil {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	reaches := func(ns string) func() error { return func() error { return dial(t, ns, target) } }
	cut := func(ns string) func() error {
		return func() error {
			if err := dial(t, ns, target); err == nil {
				return errors.New("got through")
			}
			return nil
		}
	}
	within("a peer reaching b", reaches(a))
	within("the host reaching b", reaches(""))

	if err := Cut(b, addrA, Both); err != nil {
		t.Fatal(err)
	}
	if err := Cut(b, addrA, Both); err != nil {
		t.Fatalf("cutting twice: %v", err)
	}
	within("a cut off from b", cut(a))
	within("the host still reaching b", reaches(""))
	if err := Heal(b, addrA); err != nil {
		t.Fatal(err)
	}
	within("a reaching b after healing", reaches(a))

	// A one-way cut in a: what a sends to b is dropped; b and the host
	// are not cut off from each other.
	if err := Cut(a, addrB, Outgoing); err != nil {
		t.Fatal(err)
	}
	within("a's packets to b dropped", cut(a))
	within("the host still reaching b", reaches(""))
	if err := Heal(a, addrB); err != nil {
		t.Fatal(err)
	}
	within("a reaching b after healing the one-way cut", reaches(a))

	// HealAll removes every cut of a namespace, whoever it was made with,
	// and leaves other namespaces' alone.
	if err := Cut(b, addrA, Both); err != nil {
		t.Fatal(err)
	}
	if err := Cut(b, n.HostAddr(), Outgoing); err != nil {
		t.Fatal(err)
	}
	if err := Cut(a, addrB, Outgoing); err != nil {
		t.Fatal(err)
	}
	if cuts, err := Cuts(b); err != nil || len(cuts) != 3 {
		t.Fatalf("b's cuts: %q, %v; want 3 rules (two with a, one to the host)", cuts, err)
	}
	within("the host cut off from b", cut(""))
	if err := HealAll(b); err != nil {
		t.Fatal(err)
	}
	if cuts, err := Cuts(b); err != nil || len(cuts) != 0 {
		t.Fatalf("b's cuts after HealAll: %q, %v; want none", cuts, err)
	}
	within("the host reaching b after HealAll", reaches(""))
	within("a's own cut kept by b's HealAll", cut(a))
	if err := HealAll(a); err != nil {
		t.Fatal(err)
	}
	within("a reaching b after HealAll", reaches(a))

	if got, err := HostAddrOf(a); err != nil || got != n.HostAddr() {
		t.Errorf("HostAddrOf(%s) = %v, %v; want the bridge's %v", a, got, err, n.HostAddr())
	}

	ports, err := n.Ports()
	if slices.Sort(ports); err != nil || !slices.Equal(ports, []string{fmt.Sprintf("qcpt%xa", id), fmt.Sprintf("qcpt%xb", id)}) {
		t.Errorf("the bridge's ports: %q, %v; want a's and b's host ends", ports, err)
	}
	if err := n.Detach(b, fmt.Sprintf("qcpt%xb", id)); err != nil {
		t.Fatal(err)
	}
	if ports, err := n.Ports(); err != nil || !slices.Equal(ports, []string{fmt.Sprintf("qcpt%xa", id)}) {
		t.Errorf("the bridge's ports once b is detached: %q, %v; want a's host end alone", ports, err)
	}
}

// TestForRange: each range gets a bridge of its own whose name fits an
// interface name, the same one every time.
func TestForRange(t *testing.T) {
	p, q := netip.MustParsePrefix("198.18.0.0/16"), netip.MustParsePrefix("198.18.23.0/24")
	np, nq := ForRange(p), ForRange(q)
	if np.Prefix != p || np.Bridge == nq.Bridge || len(np.Bridge) > 15 || ForRange(p).Bridge != np.Bridge {
		t.Errorf("ForRange(%s) = %+v, ForRange(%s) = %+v; want the range, distinct stable bridge names of at most 15 bytes", p, np, q, nq)
	}
}

// TestSetHostnameRefusesTheHost: a process that shares its launcher's UTS
// namespace (or cannot say it does not) is never renamed.
func TestSetHostnameRefusesTheHost(t *testing.T) {
	before, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if err := SetHostname(); err != nil {
		t.Errorf("without %s: %v, want nothing done", HostnameEnv, err)
	}
	env, err := HostnameEnviron("renamed-by-a-test")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	if err := SetHostname(); err == nil {
		t.Error("renamed the launcher's own UTS namespace")
	}
	t.Setenv(LauncherUTSEnv, "")
	if err := SetHostname(); err == nil {
		t.Error("renamed a UTS namespace without knowing the launcher's")
	}
	if after, _ := os.Hostname(); after != before {
		t.Fatalf("the host was renamed from %q to %q", before, after)
	}
}
