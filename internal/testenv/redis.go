// Package testenv starts real servers for tests: redis-server on a free port
// of the loopback interface, with no persistence and a data directory of its
// own, killed when the test ends.
//
// A missing binary fails the test with a message saying how to install it:
// integration tests are never skipped silently (CI must run them).
package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// startTimeout bounds how long a redis-server may take to answer PING.
	startTimeout = 10 * time.Second
	// stopTimeout bounds how long a killed redis-server may keep its port.
	stopTimeout = 10 * time.Second
	// pollEvery is the pause between two readiness probes.
	pollEvery = 10 * time.Millisecond
	// startAttempts is how often StartRedis picks a new port when the one it
	// picked was taken by someone else before redis-server could bind it.
	startAttempts = 5
)

// Redis is a real redis-server started for one test. Its methods are safe for
// concurrent use, although a test normally drives it from one goroutine.
type Redis struct {
	// Addr is the server's host:port on 127.0.0.1. It stays the same across
	// Stop and Start.
	Addr string

	bin   string   // path of redis-server
	dir   string   // --dir and log file location
	extra []string // more redis-server arguments (e.g. --cluster-enabled yes)

	mu   sync.Mutex
	proc *process // nil while stopped
	runs int      // how many processes were started, to name log files
}

// process is one running redis-server and the goroutine waiting for it.
type process struct {
	cmd     *exec.Cmd
	log     string
	exited  chan struct{} // closed once cmd.Wait returned
	waitErr error         // valid after exited is closed
}

// StartRedis starts a redis-server (with extraArgs appended to its command
// line) on a free 127.0.0.1 port for the duration
// of t and waits until it answers PING. The server keeps nothing on disk
// (--save "" --appendonly no) and works in t.TempDir(). It is killed, and
// waited for, in t.Cleanup.
//
// When redis-server is not on PATH, StartRedis fails t (it never skips).
func StartRedis(t testing.TB, extraArgs ...string) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testenv: redis-server not found on PATH (%v); the Redis integration tests need it: "+
			"install it with `apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS)", err)
	}
	r := &Redis{bin: bin, dir: t.TempDir(), extra: extraArgs}
	t.Cleanup(r.kill)

	var lastErr error
	for range startAttempts {
		port, err := freePort()
		if err != nil {
			t.Fatalf("testenv: pick a free port: %v", err)
		}
		r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = r.start(); lastErr == nil {
			return r
		}
		if !errors.Is(lastErr, errAddrInUse) {
			break
		}
	}
	t.Fatalf("testenv: start redis-server: %v", lastErr)
	return nil
}

// URL is the server's address as a redis:// URL for database 0, the form
// redis.ParseURL and the throttler's configuration take.
func (r *Redis) URL() string {
	return "redis://" + r.Addr + "/0"
}

// Stop kills the server (SIGKILL: an outage, not a clean shutdown) and waits
// until the process is gone and its port refuses connections. Stopping a
// stopped server does nothing.
func (r *Redis) Stop(t testing.TB) {
	t.Helper()
	r.kill()
	deadline := time.Now().Add(stopTimeout)
	for {
		c, err := net.DialTimeout("tcp", r.Addr, 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("testenv: redis at %s still accepts connections %v after it was killed", r.Addr, stopTimeout)
		}
		time.Sleep(pollEvery)
	}
}

// Start starts the server again on the same port after Stop (an outage that
// ends) and waits until it answers PING. The data set starts empty. Starting a
// running server does nothing.
func (r *Redis) Start(t testing.TB) {
	t.Helper()
	var err error
	deadline := time.Now().Add(startTimeout)
	for {
		// The port was ours a moment ago; another process may still hold it
		// briefly, so a bind failure is retried until the deadline.
		err = r.start()
		if err == nil || !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			break
		}
		time.Sleep(pollEvery)
	}
	if err != nil {
		t.Fatalf("testenv: restart redis-server: %v", err)
	}
}

// errAddrInUse marks a start that failed because the port was taken.
var errAddrInUse = errors.New("address already in use")

// start launches redis-server on r.Addr and waits for PING. On failure the
// process is gone when start returns.
func (r *Redis) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		return nil
	}
	_, port, err := net.SplitHostPort(r.Addr)
	if err != nil {
		return err
	}
	r.runs++
	logPath := filepath.Join(r.dir, fmt.Sprintf("redis-%d.log", r.runs))
	// Output goes to a file, not a pipe: exec then needs no copying
	// goroutine, and the log is there to quote when the server fails.
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(r.bin, append([]string{
		"--port", port,
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", r.dir,
		"--daemonize", "no",
	}, r.extra...)...)
	cmd.Dir = r.dir
	dieWithParent(cmd)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return err
	}
	p := &process{cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-p.exited:
			out := readLog(p.log)
			err := fmt.Errorf("redis-server on %s exited (%v): %s", r.Addr, p.waitErr, out)
			if strings.Contains(out, "already in use") {
				err = fmt.Errorf("%w: %w", errAddrInUse, err)
			}
			return err
		default:
		}
		if ping(r.Addr) == nil {
			r.proc = p
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-p.exited
			return fmt.Errorf("redis-server on %s did not answer PING within %v: %s", r.Addr, startTimeout, readLog(p.log))
		}
		time.Sleep(pollEvery)
	}
}

// kill kills the running process, if any, and waits for it to exit.
func (r *Redis) kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return
	}
	_ = r.proc.cmd.Process.Kill()
	<-r.proc.exited
	r.proc = nil
}

// ping sends an inline PING over a fresh connection and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		// For instance "-LOADING ..." while the server starts.
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// freePort asks the kernel for a free TCP port on 127.0.0.1. The port is free
// when freePort returns; StartRedis retries if someone takes it meanwhile.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, fmt.Errorf("listener address %v is not TCP", l.Addr())
	}
	return addr.Port, nil
}

// readLog returns the tail of a server log for an error message.
func readLog(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	const keep = 2000
	s := strings.TrimSpace(string(b))
	if len(s) > keep {
		s = "…" + s[len(s)-keep:]
	}
	return s
}
