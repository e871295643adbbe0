// Package testkit holds what tests in every package use to run QCP against
// real etcd: a launcher for etcd processes with TLS, a recording writer whose
// history porcupine checks, and an invariant monitor of the member list.
package testkit

import (
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"strconv"
	"testing"
)

// ipAllocator hands out loopback addresses for one test. Linux routes all of
// 127.0.0.0/8 to lo, so every member can listen on the standard ports
// 2379/2380 on an address of its own, as on a real machine. The second octet
// comes from the process ID (test binaries of different packages run in
// parallel) and the lower two from the test's name, so concurrent tests
// start far apart; a bind probe skips any address that is still in use.
// 127.0.x.y is left to other parts of QCP.
type ipAllocator struct {
	second byte
	next   uint16
}

func newIPAllocator(testName string) *ipAllocator {
	h := fnv.New32a()
	_, _ = h.Write([]byte(testName))
	return &ipAllocator{second: byte(64 + os.Getpid()%128), next: uint16(h.Sum32())}
}

// allocate returns the next free address. Addresses are never reused within
// a test, as a replaced machine gets a new IP: a stale peer URL then cannot
// be mistaken for the new member.
func (a *ipAllocator) allocate() (net.IP, error) {
	for range 1024 {
		n := a.next
		a.next++
		third, fourth := byte(n>>8), byte(n)
		if fourth == 0 || fourth == 255 {
			continue
		}
		ip := net.IPv4(127, a.second, third, fourth)
		if portsFree(ip) {
			return ip, nil
		}
	}
	return nil, fmt.Errorf("no free loopback address in 127.%d.0.0/16", a.second)
}

func portsFree(ip net.IP, ports ...int) bool {
	if len(ports) == 0 {
		ports = []int{2379, 2380}
	}
	for _, port := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	return true
}

// machinePorts are the ports a process machine (etcd, qcp-agent's etcd
// settings endpoint, kube-apiserver, qcp-agent's health endpoint,
// kube-controller-manager, kube-scheduler) or a load balancer listens on.
var machinePorts = []int{2379, 2380, 2381, 2382, 6443, 10248, 10257, 10259}

// ReserveAddress returns a loopback address for a process machine or load
// balancer of t, free on every port one listens on, and holds it until t
// ends. A bind probe alone would let two test processes that probe at once
// pick the same address before either binds it; the reservation is an
// abstract Unix socket named after the address, which no other process can
// bind while t holds it and which the kernel frees even if the test binary
// is killed.
func ReserveAddress(t testing.TB) string {
	t.Helper()
	ips := newIPAllocator(t.Name())
	for range 64 {
		ip, err := ips.allocate()
		if err != nil {
			t.Fatal(err)
		}
		lock, err := net.Listen("unix", "@qcp-test-address-"+ip.String())
		if err != nil {
			continue // another test holds it
		}
		if !portsFree(ip, machinePorts...) {
			_ = lock.Close()
			continue
		}
		t.Cleanup(func() { _ = lock.Close() })
		return ip.String()
	}
	t.Fatal("no loopback address could be reserved: 64 candidates were held by other tests or in use")
	return ""
}
