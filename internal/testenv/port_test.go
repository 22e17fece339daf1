package testenv

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestPickPortBelowEphemeralRange: a picked port lies below the kernel's
// ephemeral range (where no outgoing connection takes it) and can be bound.
func TestPickPortBelowEphemeralRange(t *testing.T) {
	// Not parallel: the package's other tests take random ports of the
	// same range, and one taken between the pick and the bind below
	// failed this test once (a pick is free when made, never reserved).
	lo := ephemeralLow()
	if lo == 0 {
		t.Fatal("no ephemeral port range in /proc/sys/net/ipv4/ip_local_port_range")
	}
	for range 20 {
		port := FreePort(t)
		if lo > 11000 && (port < 10000 || port >= lo) {
			t.Fatalf("port %d, want one in [10000, %d)", port, lo)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatalf("picked port %d cannot be bound: %v", port, err)
		}
		ln.Close()
	}
}

// TestFreePortsDistinctBelowEphemeralRange: the ports a daemon is launched
// on are distinct and, like PickPort's, below the ephemeral range.
func TestFreePortsDistinctBelowEphemeralRange(t *testing.T) {
	t.Parallel()
	lo := ephemeralLow()
	ports, err := freePorts(30)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d picked twice: %v", p, ports)
		}
		seen[p] = true
		if lo > 11000 && (p < 10000 || p >= lo) {
			t.Fatalf("port %d, want one in [10000, %d)", p, lo)
		}
	}
}

// TestClosedAddrRefuses: every dial to a ClosedAddr is refused, and no
// listener can take its port while the test runs.
func TestClosedAddrRefuses(t *testing.T) {
	t.Parallel()
	addr := ClosedAddr(t)
	for range 3 {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("dial %s connected", addr)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial %s: %v, want connection refused", addr, err)
		}
	}
	if ln, err := net.Listen("tcp", addr); err == nil {
		ln.Close()
		t.Fatalf("a listener took %s", addr)
	}
}
