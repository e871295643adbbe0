package process

import (
	"net/netip"
	"testing"
)

func TestAddressesAreUniqueStableAndReusedAfterRelease(t *testing.T) {
	dir := t.TempDir()
	a := &Addresses{Dir: dir, Prefix: netip.MustParsePrefix("127.30.0.0/30")}
	m1, err := a.Allocate("ns/m1")
	if err != nil {
		t.Fatal(err)
	}
	m2, err := a.Allocate("ns/m2")
	if err != nil {
		t.Fatal(err)
	}
	if m1 == m2 {
		t.Fatalf("two machines share %s", m1)
	}
	// A new allocator over the same directory (a restarted manager) gives
	// each owner the address it had.
	restarted := &Addresses{Dir: dir, Prefix: a.Prefix}
	if again, _ := restarted.Allocate("ns/m1"); again != m1 {
		t.Errorf("m1 got %s after restart, had %s", again, m1)
	}
	if _, err := restarted.Allocate("ns/m3"); err == nil {
		t.Error("allocated beyond a /30 with two addresses in use")
	}
	if err := restarted.Release("ns/m1"); err != nil {
		t.Fatal(err)
	}
	m3, err := restarted.Allocate("ns/m3")
	if err != nil {
		t.Fatal(err)
	}
	if m3 != m1 {
		t.Errorf("released %s was not reused; got %s", m1, m3)
	}
	if m1 != netip.MustParseAddr("127.30.0.2") || m2 != netip.MustParseAddr("127.30.0.3") {
		t.Errorf("allocated %s and %s, want the lowest free addresses .2 and .3", m1, m2)
	}
}
