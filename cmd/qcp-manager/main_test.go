package main

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/qcp-dev/qcp/internal/controllers/process"
	"github.com/qcp-dev/qcp/internal/hostnet"
)

// TestProcessFlagsOnlyWithItsControllers: the process provider's flags are
// required, and defaulted, only when its controllers run.
func TestProcessFlagsOnlyWithItsControllers(t *testing.T) {
	controlPlaneOnly := controlPlaneOptions{controllers: map[string]bool{"controlplane": true}}
	got, err := completeProcessOptions(process.Options{}, networkLoopback, controlPlaneOnly)
	if err != nil || got.MachineRoot != "" || got.BinDir != "" || got.AgentPath != "" {
		t.Errorf("--controllers=controlplane without process flags: %+v, %v; want them left alone and no error", got, err)
	}
	if _, err := completeProcessOptions(process.Options{}, networkLoopback, controlPlaneOptions{}); err == nil || !strings.Contains(err.Error(), "--machine-root is required") {
		t.Errorf("every controller without --machine-root: %v; want --machine-root required", err)
	}
	t.Setenv("QCP_BIN_DIR", t.TempDir())
	got, err = completeProcessOptions(process.Options{MachineRoot: "/m"}, networkLoopback, controlPlaneOptions{})
	if err != nil || got.BinDir != os.Getenv("QCP_BIN_DIR") || !strings.HasSuffix(got.AgentPath, "/qcp-agent") {
		t.Errorf("every controller with --machine-root: %+v, %v; want the bin and agent defaults", got, err)
	}
}

// TestMachineNetworkFlags: --machine-network=namespaces gives the process
// provider a network on its address range (by default one that cannot
// collide with a real network), and each mode refuses the other's range,
// naming the flag that fixes it.
func TestMachineNetworkFlags(t *testing.T) {
	if err := hostnet.Available(); err != nil {
		t.Skipf("network namespaces cannot be made here: %v", err)
	}
	t.Setenv("QCP_BIN_DIR", t.TempDir())
	base := process.Options{MachineRoot: "/m"}
	got, err := completeProcessOptions(base, networkNamespaces, controlPlaneOptions{})
	if err != nil || got.Network == nil || got.Network.Prefix != hostnet.DefaultPrefix || len(got.Network.Bridge) > 15 {
		t.Errorf("--machine-network=namespaces: %+v, %v; want a network on %s with a bridge name of at most 15 bytes", got.Network, err, hostnet.DefaultPrefix)
	}
	own := netip.MustParsePrefix("198.18.7.0/24")
	other, err := completeProcessOptions(process.Options{MachineRoot: "/m", AddressRange: own}, networkNamespaces, controlPlaneOptions{})
	if err != nil || other.Network.Prefix != own || other.Network.Bridge == got.Network.Bridge {
		t.Errorf("--machine-network=namespaces --address-range=%s: %+v, %v; want that range on a bridge of its own", own, other.Network, err)
	}
	got, err = completeProcessOptions(base, networkLoopback, controlPlaneOptions{})
	if err != nil || got.Network != nil {
		t.Errorf("--machine-network=loopback: %+v, %v; want no network", got.Network, err)
	}
	for _, c := range []struct {
		network string
		prefix  netip.Prefix
		want    string
	}{
		{networkNamespaces, process.DefaultAddressRange, "cannot be a loopback prefix"},
		{networkLoopback, own, "--machine-network=namespaces"},
		{"bridge", netip.Prefix{}, "choose auto, loopback or namespaces"},
	} {
		_, err := completeProcessOptions(process.Options{MachineRoot: "/m", AddressRange: c.prefix}, c.network, controlPlaneOptions{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--machine-network=%s --address-range=%s: %v; want an error saying %q", c.network, c.prefix, err, c.want)
		}
	}
}

// TestMachineNetworkAuto: --machine-network=auto, the default, makes each
// machine a network host of its own where namespaces can be made and the
// address range is not a loopback one; otherwise it falls back to loopback
// addresses and says why, for the machines' OwnNetwork condition.
func TestMachineNetworkAuto(t *testing.T) {
	loopback := process.DefaultAddressRange
	for _, c := range []struct {
		name        string
		prefix      netip.Prefix
		unavailable error
		network     string
		why         string
	}{
		{"as root, no range", netip.Prefix{}, nil, networkNamespaces, ""},
		{"as root, a private range", netip.MustParsePrefix("198.18.9.0/24"), nil, networkNamespaces, ""},
		{"as root, a loopback range", loopback, nil, networkLoopback, "--address-range=" + loopback.String() + " is a loopback prefix"},
		{"without root", netip.Prefix{}, errors.New("creating network namespaces needs root"), networkLoopback, "cannot make network namespaces here (creating network namespaces needs root)"},
	} {
		network, why := autoMachineNetwork(c.prefix, c.unavailable)
		if network != c.network || !strings.Contains(why, c.why) || (c.why == "") != (why == "") {
			t.Errorf("%s: %s, %q; want %s, saying %q", c.name, network, why, c.network, c.why)
		}
	}
	t.Setenv("QCP_BIN_DIR", t.TempDir())
	got, err := completeProcessOptions(process.Options{MachineRoot: "/m", AddressRange: loopback}, networkAuto, controlPlaneOptions{})
	if err != nil || got.Network != nil || !strings.Contains(got.LoopbackReason, "is a loopback prefix") {
		t.Errorf("auto with a loopback range: network %+v, reason %q, %v; want loopback addresses and why", got.Network, got.LoopbackReason, err)
	}
	got, err = completeProcessOptions(process.Options{MachineRoot: "/m"}, networkLoopback, controlPlaneOptions{})
	if err != nil || got.LoopbackReason != "qcp-manager runs with --machine-network=loopback" {
		t.Errorf("--machine-network=loopback: reason %q, %v; want the flag named", got.LoopbackReason, err)
	}
	if hostnet.Available() == nil {
		got, err = completeProcessOptions(process.Options{MachineRoot: "/m"}, networkAuto, controlPlaneOptions{})
		if err != nil || got.Network == nil || got.Network.Prefix != hostnet.DefaultPrefix || got.LoopbackReason != "" {
			t.Errorf("auto as root: network %+v, reason %q, %v; want namespaces on %s", got.Network, got.LoopbackReason, err, hostnet.DefaultPrefix)
		}
	}
}

// TestClientCachesTemplates: the manager's client serves unstructured
// reads, the infrastructure templates every round reads, from its cache
// (engine.GetTemplate falls back to a live read when the cache lacks one).
func TestClientCachesTemplates(t *testing.T) {
	if o := clientOptions(); o.Cache == nil || !o.Cache.Unstructured {
		t.Errorf("manager client options %+v: unstructured objects are read live, want them cached", o.Cache)
	}
}
