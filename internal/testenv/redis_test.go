package testenv_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/testenv"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// roundTrip sends one inline command and returns the first reply line.
func roundTrip(t *testing.T, addr, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatalf("write %q: %v", cmd, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read reply to %q: %v", cmd, err)
	}
	return strings.TrimSpace(line)
}

func TestRedisStartStopRestart(t *testing.T) {
	r := testenv.StartRedis(t)
	if !strings.HasPrefix(r.Addr, "127.0.0.1:") {
		t.Fatalf("Addr = %q, want a 127.0.0.1 address", r.Addr)
	}
	if want := "redis://" + r.Addr + "/0"; r.URL() != want {
		t.Fatalf("URL() = %q, want %q", r.URL(), want)
	}
	if got := roundTrip(t, r.Addr, "SET k v"); got != "+OK" {
		t.Fatalf("SET answered %q", got)
	}
	// No persistence: the test servers must never write snapshots.
	if got := roundTrip(t, r.Addr, "CONFIG GET save"); got != "*2" {
		t.Fatalf("CONFIG GET save answered %q", got)
	}

	r.Stop(t)
	if c, err := net.DialTimeout("tcp", r.Addr, time.Second); err == nil {
		c.Close()
		t.Fatal("port still accepts connections after Stop")
	}
	r.Stop(t) // stopping twice is harmless

	addr := r.Addr
	r.Start(t)
	if r.Addr != addr {
		t.Fatalf("restarted on %s, want the same address %s", r.Addr, addr)
	}
	if got := roundTrip(t, r.Addr, "PING"); got != "+PONG" {
		t.Fatalf("PING after restart answered %q", got)
	}
	// An outage loses the data set (nothing is saved).
	if got := roundTrip(t, r.Addr, "EXISTS k"); got != ":0" {
		t.Fatalf("EXISTS k after restart answered %q, want :0", got)
	}
	r.Start(t) // starting a running server is harmless
}

func TestRedisServersAreIndependent(t *testing.T) {
	a, b := testenv.StartRedis(t), testenv.StartRedis(t)
	if a.Addr == b.Addr {
		t.Fatalf("two servers share %s", a.Addr)
	}
	roundTrip(t, a.Addr, "SET k a")
	if got := roundTrip(t, b.Addr, "EXISTS k"); got != ":0" {
		t.Fatalf("EXISTS k on the second server answered %q", got)
	}
}

func TestLaunchRedisWithoutTesting(t *testing.T) {
	dir := t.TempDir()
	r, err := testenv.LaunchRedis(dir, "--maxmemory", "10mb")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := roundTrip(t, r.Addr, "CONFIG GET maxmemory"); got != "*2" {
		t.Fatalf("CONFIG GET maxmemory answered %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "redis-1.log")); err != nil {
		t.Fatalf("no log in the given directory: %v", err)
	}
	r.Close()
	if c, err := net.DialTimeout("tcp", r.Addr, time.Second); err == nil {
		c.Close()
		t.Fatal("port still accepts connections after Close")
	}
	r.Close() // closing twice is harmless
}

func TestLaunchRedisWithoutBinaryWrapsErrNotFound(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	r, err := testenv.LaunchRedis(t.TempDir())
	if !errors.Is(err, exec.ErrNotFound) {
		t.Fatalf("LaunchRedis = %v, %v; want an error wrapping exec.ErrNotFound", r, err)
	}
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, so a test can watch StartRedis fail.
type fatalRecorder struct {
	*testing.T
	msg     string
	skipped bool
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalRecorder) Skip(...any)          { f.skipped = true; runtime.Goexit() }
func (f *fatalRecorder) Skipf(string, ...any) { f.skipped = true; runtime.Goexit() }
func (f *fatalRecorder) SkipNow()             { f.skipped = true; runtime.Goexit() }

func TestStartRedisWithoutBinaryFailsWithInstallHint(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	rec := &fatalRecorder{T: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		testenv.StartRedis(rec)
		t.Error("StartRedis returned without redis-server on PATH")
	}()
	<-done
	if rec.skipped {
		t.Fatal("StartRedis skipped the test; it must fail it")
	}
	if !strings.Contains(rec.msg, "apt-get install redis-server") {
		t.Fatalf("failure message %q does not say how to install redis-server", rec.msg)
	}
}
