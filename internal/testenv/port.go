package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
)

// PickPort returns a TCP port on 127.0.0.1 that is free now, for a server
// (a process, an embedded listener) that binds it a moment later. It is
// taken below the kernel's ephemeral range when it can be: a port the
// kernel hands out for port 0 lies in that range, where any outgoing
// connection of a parallel test may take it before the server binds it (a
// throttler process once exited with "address already in use"). Below the
// range only another explicit pick can take it, one chance in thousands.
func PickPort() (int, error) {
	ln, err := listenFree()
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// listenFree listens on a free port of 127.0.0.1 below the ephemeral range
// when it can (PickPort), else on one the kernel picks.
func listenFree() (net.Listener, error) {
	if lo := ephemeralLow(); lo > 11000 {
		for range 100 {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 10000+rand.IntN(lo-10000)))
			if err == nil {
				return ln, nil
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pick a free port: %w", err)
	}
	return ln, nil
}

// FreePort is PickPort for a test: it fails the test when no port is free.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := PickPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// FreeAddr is FreePort as 127.0.0.1:port.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return loopback(FreePort(t))
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux),
// 0 when unknown.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return 0
	}
	return lo
}

// ClosedAddr is a 127.0.0.1 address that refuses every connection for the
// rest of the test: a TCP socket is bound to it and never listens, so a
// connection gets "connection refused", and no other server can take the
// port meanwhile (a port freed after a listen could be taken by any
// parallel test's server, and a dial then reached it or was reset).
func ClosedAddr(t testing.TB) string {
	t.Helper()
	// Close-on-exec: the processes parallel tests start must not hold it.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("closed address: socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("closed address: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("closed address: getsockname: %v", err)
	}
	return loopback(sa.(*syscall.SockaddrInet4).Port)
}
