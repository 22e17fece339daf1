package testenv

import (
	"net"
	"strconv"
	"testing"
)

// TestPickPortBelowEphemeralRange: a picked port lies below the kernel's
// ephemeral range (where no outgoing connection takes it) and can be bound.
func TestPickPortBelowEphemeralRange(t *testing.T) {
	t.Parallel()
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
