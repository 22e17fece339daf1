// Package testenv starts real servers for tests and for the load tool:
// redis-server on a free port of the loopback interface, with no persistence
// and a data directory of its own; in-process nats-servers; and fleets of
// processes that a test can kill -9 (a NATS JetStream cluster, Redis with
// Sentinel, a Redis Cluster).
//
// The Start* helpers take a testing.TB: what they start is killed, and
// waited for, in t.Cleanup, and a missing binary fails the test with a
// message saying how to install it (integration tests are never skipped
// silently: CI must run them). LaunchRedis is the same redis-server
// launcher without a testing.TB, returning errors.
package testenv

import (
	"fmt"
	"os/exec"
	"strconv"
	"testing"
)

// Redis is a real redis-server on 127.0.0.1. Its methods are safe for
// concurrent use, although a test normally drives it from one goroutine.
type Redis struct {
	// Addr is the server's host:port on 127.0.0.1. It stays the same across
	// Stop and Start.
	Addr string

	d *daemon
}

// LaunchRedis starts a redis-server (with extraArgs appended to its command
// line) on a free 127.0.0.1 port, working in dir (which must exist), and
// waits until it answers PING. The server keeps nothing on disk (--save ""
// --appendonly no); its output goes to redis-<n>.log in dir. Close kills it.
//
// When redis-server is not on PATH the error wraps exec.ErrNotFound.
func LaunchRedis(dir string, extraArgs ...string) (*Redis, error) {
	return launchRedis(dir, 1, func([]int) []string { return extraArgs })
}

// launchRedis is LaunchRedis for a server that needs nports free ports: the
// first is the client port, the others go where extra puts them.
func launchRedis(dir string, nports int, extra func(ports []int) []string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("testenv: %w", err)
	}
	d, err := launch(nports, func(ports []int) (*daemon, error) {
		return &daemon{
			name: "redis",
			bin:  bin,
			dir:  dir,
			addr: loopback(ports[0]),
			args: append([]string{
				"--port", strconv.Itoa(ports[0]),
				"--bind", "127.0.0.1",
				"--save", "",
				"--appendonly", "no",
				"--dir", dir,
				"--daemonize", "no",
			}, extra(ports)...),
			ready: ping,
		}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("testenv: start redis-server: %w", err)
	}
	return &Redis{Addr: d.addr, d: d}, nil
}

// StartRedis starts a redis-server (with extraArgs appended to its command
// line) on a free 127.0.0.1 port for the duration of t and waits until it
// answers PING. The server keeps nothing on disk (--save "" --appendonly no)
// and works in t.TempDir(). It is killed, and waited for, in t.Cleanup.
//
// When redis-server is not on PATH, StartRedis fails t (it never skips).
func StartRedis(t testing.TB, extraArgs ...string) *Redis {
	t.Helper()
	lookBin(t, "redis-server", "`apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS)")
	r, err := LaunchRedis(t.TempDir(), extraArgs...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(r.Close)
	return r
}

// URL is the server's address as a redis:// URL for database 0, the form
// redis.ParseURL and the throttler's configuration take.
func (r *Redis) URL() string {
	return "redis://" + r.Addr + "/0"
}

// Close kills the server and waits for the process to exit. Closing a
// stopped or closed server does nothing.
func (r *Redis) Close() {
	r.d.kill()
}

// Stop kills the server (SIGKILL: an outage, not a clean shutdown) and waits
// until the process is gone and its port refuses connections. Stopping a
// stopped server does nothing.
func (r *Redis) Stop(t testing.TB) {
	t.Helper()
	if err := r.d.stop(); err != nil {
		t.Fatalf("testenv: redis: %v", err)
	}
}

// Start starts the server again on the same port after Stop (an outage that
// ends) and waits until it answers PING. The data set starts empty. Starting a
// running server does nothing.
func (r *Redis) Start(t testing.TB) {
	t.Helper()
	if err := r.d.restart(); err != nil {
		t.Fatalf("testenv: restart redis-server: %v", err)
	}
}
