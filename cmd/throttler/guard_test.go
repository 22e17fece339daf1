package main

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/testenv"
)

// TestSecondMemoryPacerRefused runs the real binary: two instances without
// Redis on one nats-server would each drain every lane at its full rate, so
// the second refuses to start with an error that says what to do. After the
// first is killed with SIGKILL (its claim is neither refreshed nor deleted),
// a new instance starts once the claim has expired, about 10 s later, and
// says in its log why it waited. Parallel: it checks outcomes, and the
// wait for the claim's expiry overlaps the other tests.
func TestSecondMemoryPacerRefused(t *testing.T) {
	t.Parallel()
	natsURL := testenv.StartNATS(t).ClientURL()
	dir := t.TempDir()
	lane := laneYAML{rate: 10, burst: 1, target: "http://127.0.0.1:1/never"}
	pathA, addrA := procConfig(t, dir, natsURL, "", lane)
	a := startProc(t, pathA, addrA)

	pathB, _ := procConfig(t, dir, natsURL, "", lane)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "serve", "--config", pathB)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr testenv.LogBuffer
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("second instance: %v, want exit code 1; stderr:\n%s", err, stderr.String())
	}
	msg := stderr.String()
	for _, want := range []string{"already uses this JetStream with the in-memory pacer", "configure redis.url on every instance", "host "} {
		if !strings.Contains(msg, want) {
			t.Fatalf("stderr does not say %q:\n%s", want, msg)
		}
	}
	t.Logf("second instance refused after %v", time.Since(start).Round(time.Millisecond))

	a.kill9()
	start = time.Now()
	pathC, addrC := procConfig(t, dir, natsURL, "", lane)
	c := startProc(t, pathC, addrC) // waits up to 20 s
	waited := time.Since(start)
	t.Logf("instance after the SIGKILL ready in %v", waited.Round(time.Millisecond))
	if !strings.Contains(c.logs.String(), "waiting for it to be refreshed") {
		t.Errorf("no log line saying why the start waited:\n%s", tail(c.logs.String(), 20))
	}
	c.stop()
}
