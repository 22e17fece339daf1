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
	// startTimeout bounds how long a server may take to become ready.
	startTimeout = 10 * time.Second
	// stopTimeout bounds how long a killed server may keep its port.
	stopTimeout = 10 * time.Second
	// pollEvery is the pause between two checks of a condition
	// (Eventually, readiness probes).
	pollEvery = 10 * time.Millisecond
	// startAttempts is how often a launch picks a new port when the one it
	// picked was taken by someone else before the server could bind it.
	startAttempts = 5
	// logTailBytes is how much of a server log an error or a failed test
	// quotes.
	logTailBytes = 2000
	// fleetTimeout bounds how long a fleet may take to form or to fail
	// over.
	fleetTimeout = 30 * time.Second
)

// errAddrInUse marks a start that failed because a port was taken.
var errAddrInUse = errors.New("address already in use")

// daemon is a server process on fixed loopback ports that can be killed and
// started again on the same ports. Its methods are safe for concurrent use.
type daemon struct {
	name  string   // names the log files: <name>-<run>.log
	bin   string   // executable
	dir   string   // working directory and log files
	addr  string   // host:port probed by ready and by stop
	args  []string // command line after bin
	ready func(addr string) error

	mu   sync.Mutex
	proc *process // nil while stopped
	runs int      // how many processes were started, to name log files
	log  string   // log file of the latest run
}

// process is one running server and the goroutine waiting for it.
type process struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait returned
	waitErr error         // valid after exited is closed
}

// start launches the process and waits until ready answers. On failure the
// process is gone when start returns; a port taken by someone else gives an
// error wrapping errAddrInUse. Starting a running daemon does nothing.
func (d *daemon) start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc != nil {
		return nil
	}
	d.runs++
	d.log = filepath.Join(d.dir, fmt.Sprintf("%s-%d.log", d.name, d.runs))
	// Output goes to a file, not a pipe: exec then needs no copying
	// goroutine, and the log is there to quote when the server fails.
	logFile, err := os.Create(d.log)
	if err != nil {
		return fmt.Errorf("%s: %w", d.name, err)
	}
	defer logFile.Close() // the child has its own descriptor
	cmd := exec.Command(d.bin, d.args...)
	cmd.Dir = d.dir
	dieWithParent(cmd)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", d.name, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-p.exited:
			out := readLog(d.log)
			err := fmt.Errorf("%s on %s exited (%v): %s", d.name, d.addr, p.waitErr, out)
			if strings.Contains(strings.ToLower(out), "address already in use") {
				err = fmt.Errorf("%w: %w", errAddrInUse, err)
			}
			return err
		default:
		}
		if d.ready(d.addr) == nil {
			d.proc = p
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-p.exited
			return fmt.Errorf("%s on %s not ready within %v: %s", d.name, d.addr, startTimeout, readLog(d.log))
		}
		time.Sleep(pollEvery)
	}
}

// restart starts the daemon again on its ports after a kill. The ports were
// its own a moment ago; another process may still hold one briefly, so a
// bind failure is retried until startTimeout.
func (d *daemon) restart() error {
	deadline := time.Now().Add(startTimeout)
	for {
		err := d.start()
		if err == nil || !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(pollEvery)
	}
}

// kill kills the running process, if any (SIGKILL: an outage, not a clean
// shutdown), and waits for it to exit.
func (d *daemon) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return
	}
	_ = d.proc.cmd.Process.Kill()
	<-d.proc.exited
	d.proc = nil
}

// stop kills the process and waits until its address refuses connections.
func (d *daemon) stop() error {
	d.kill()
	return waitClosed(d.addr)
}

// running reports whether the process runs (it was started and not killed).
func (d *daemon) running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc != nil
}

// logTail is the end of the latest run's log.
func (d *daemon) logTail() string {
	d.mu.Lock()
	path := d.log
	d.mu.Unlock()
	if path == "" {
		return "(never started)"
	}
	return readLog(path)
}

// launch starts a daemon on fresh free ports: ports picks them, build makes
// the daemon for them. A port taken before the server could bind it is
// retried with new ones, up to startAttempts times.
func launch(nports int, build func(ports []int) (*daemon, error)) (*daemon, error) {
	var lastErr error
	for range startAttempts {
		ports, err := freePorts(nports)
		if err != nil {
			return nil, err
		}
		d, err := build(ports)
		if err != nil {
			return nil, err
		}
		if lastErr = d.start(); lastErr == nil {
			return d, nil
		}
		if !errors.Is(lastErr, errAddrInUse) {
			break
		}
	}
	return nil, lastErr
}

// waitClosed waits until addr refuses connections, up to stopTimeout.
func waitClosed(addr string) error {
	deadline := time.Now().Add(stopTimeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return nil
		}
		c.Close()
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still accepts connections %v after its server was killed", addr, stopTimeout)
		}
		time.Sleep(pollEvery)
	}
}

// freePorts picks n distinct free TCP ports on 127.0.0.1, below the
// ephemeral range when it can (PickPort says why). They are free when
// freePorts returns; launch retries if someone takes one meanwhile.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		// Every listener stays open until all ports are picked, so that
		// no port is picked twice.
		l, err := listenFree()
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// loopback is host:port on 127.0.0.1.
func loopback(port int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// readLog returns the tail of a server log for an error message.
func readLog(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	s := strings.TrimSpace(string(b))
	if len(s) > logTailBytes {
		s = "…" + s[len(s)-logTailBytes:]
	}
	return s
}

// lookBin finds a server binary on PATH or fails t with how to install it.
func lookBin(t testing.TB, name, install string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("testenv: %s not found on PATH (%v); the integration tests need it: install it with %s", name, err, install)
	}
	return bin
}

// logsOnFailure makes t print the end of every daemon's log when it fails.
// It is registered before the daemons' kills, so it runs after them (the
// logs are complete) and before t.TempDir is removed.
func logsOnFailure(t testing.TB, daemons func() []*daemon) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, d := range daemons() {
			t.Logf("testenv: %s on %s, log tail:\n%s", d.name, d.addr, d.logTail())
		}
	})
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

// waitFor polls check until it returns nil, failing t with its last error
// after fleetTimeout.
func waitFor(t testing.TB, what string, check func() error) {
	t.Helper()
	if err := poll(fleetTimeout, check); err != nil {
		t.Fatalf("testenv: waited %v for %s: %v", fleetTimeout, what, err)
	}
}

// mkdir makes the directory root/name.
func mkdir(t testing.TB, root, name string) string {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return dir
}
