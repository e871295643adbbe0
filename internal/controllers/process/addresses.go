package process

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Addresses hands out loopback addresses to machines and load balancers.
// Each allocation is a file named for the address under Dir, created with
// O_EXCL and holding the owner's key, so an address is never shared by two
// live owners and stays the same across manager restarts.
type Addresses struct {
	Dir    string
	Prefix netip.Prefix

	mu sync.Mutex
}

// ErrAddressesExhausted means every address of the range is in use.
var ErrAddressesExhausted = errors.New("no free loopback address")

// Allocate returns key's address, allocating the lowest free one if key has
// none yet.
func (a *Addresses) Allocate(key string) (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := os.MkdirAll(a.Dir, 0o700); err != nil {
		return netip.Addr{}, fmt.Errorf("creating the address directory: %w", err)
	}
	owners, err := a.owners()
	if err != nil {
		return netip.Addr{}, err
	}
	for addr, owner := range owners {
		if owner == key {
			return addr, nil
		}
	}
	// Skip the network address (x.y.0.0) and the range's first address,
	// which loopback tools often use for themselves.
	for addr := a.Prefix.Masked().Addr().Next().Next(); a.Prefix.Contains(addr); addr = addr.Next() {
		if _, used := owners[addr]; used || addr.As4()[3] == 0 || addr.As4()[3] == 255 {
			continue
		}
		f, err := os.OpenFile(filepath.Join(a.Dir, addr.String()), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("reserving %s: %w", addr, err)
		}
		_, werr := f.WriteString(key)
		if err := errors.Join(werr, f.Close()); err != nil {
			return netip.Addr{}, fmt.Errorf("reserving %s: %w", addr, err)
		}
		return addr, nil
	}
	return netip.Addr{}, fmt.Errorf("%w in %s: delete unused machines or give the manager a larger --address-range", ErrAddressesExhausted, a.Prefix)
}

// Release frees key's address, if it has one.
func (a *Addresses) Release(key string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	owners, err := a.owners()
	if err != nil {
		return err
	}
	for addr, owner := range owners {
		if owner == key {
			if err := os.Remove(filepath.Join(a.Dir, addr.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("releasing %s: %w", addr, err)
			}
		}
	}
	return nil
}

func (a *Addresses) owners() (map[netip.Addr]string, error) {
	entries, err := os.ReadDir(a.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading allocated addresses: %w", err)
	}
	owners := map[netip.Addr]string{}
	for _, e := range entries {
		addr, err := netip.ParseAddr(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(a.Dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("reading the owner of %s: %w", addr, err)
		}
		owners[addr] = strings.TrimSpace(string(data))
	}
	return owners, nil
}
