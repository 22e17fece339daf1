package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/testenv"
)

// binary is the throttler the tests that run real processes start: the
// one the test packages share (testenv.ThrottlerBinary), built at most
// once per content of the sources. TestVersionOfMakeBuild builds its own
// with make.
var binary string

// Tests that check outcomes, or bound a time with a margin far beyond a
// stall (a second signal exits within 2 s), call t.Parallel (a refusal, a
// start after a lease expired, nothing lost across a restart: they wait on
// processes and servers, not on the CPU); those that measure the real
// clock closely (a fleet's windows at the target) do not, so that go test
// runs them first, one at a time, before the parallel ones start.
func TestMain(m *testing.M) {
	var err error
	if binary, err = testenv.ThrottlerBinaryPath(); err != nil {
		fmt.Fprintf(os.Stderr, "building throttler: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, os.Getenv, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "throttler ") {
		t.Fatalf("version printed %q", out.String())
	}
}

func TestUsageErrors(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), nil, os.Getenv, &out, &out); !errors.Is(err, errUsage) {
		t.Fatalf("no args: %v", err)
	}
	if err := run(context.Background(), []string{"frobnicate"}, os.Getenv, &out, &out); !errors.Is(err, errUsage) || !strings.Contains(out.String(), "unknown command") {
		t.Fatalf("unknown command: %v %q", err, out.String())
	}
	// The load tool is a binary of its own (cmd/throttler-bench).
	out.Reset()
	if err := run(context.Background(), []string{"bench"}, os.Getenv, &out, &out); !errors.Is(err, errUsage) || !strings.Contains(out.String(), "unknown command") {
		t.Fatalf("bench: %v %q", err, out.String())
	}
}

// TestDepsLeaveOutTheLoadTool: the service binary links neither the load
// tool nor the peer libraries it measures against, nor the test helpers.
func TestDepsLeaveOutTheLoadTool(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("go list -deps: %v\n%s", err, exit.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/throttler/throttler/internal/service") {
		t.Fatalf("go list -deps does not list internal/service; the check would prove nothing:\n%s", out)
	}
	forbidden := []string{
		"go.uber.org/ratelimit",
		"github.com/go-redis/redis_rate",
		"github.com/throttler/throttler/internal/bench",
		"github.com/throttler/throttler/internal/testenv",
		"github.com/throttler/throttler/internal/servicetest",
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("cmd/throttler depends on %s", dep)
			}
		}
	}
}

// TestBadConfigExitsNonZero runs the real binary: a config error names the
// file and the field, and the exit code is 1.
func TestBadConfigExitsNonZero(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(path, []byte("lanes:\n  - name: demo\n    rate: -3\n    target: {http: {url: http://127.0.0.1:1/}}\n"), 0o644)
	if msg := serveFails(t, path); !strings.Contains(msg, path) || !strings.Contains(msg, "lanes[0].rate") {
		t.Fatalf("stderr %q does not name the file and the field", msg)
	}
}

// serveFails runs `throttler serve --config path`, expects exit code 1 and
// returns what it wrote to stderr.
func serveFails(t *testing.T, path string) string {
	t.Helper()
	cmd := exec.Command(binary, "serve", "--config", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want code 1; stderr:\n%s", err, stderr.String())
	}
	return stderr.String()
}

// freePort is a free port on 127.0.0.1 for a process to listen on later
// (testenv.FreeAddr says why it is not one the kernel picks).
func freePort(t *testing.T) string {
	t.Helper()
	return testenv.FreeAddr(t)
}

// TestServeAndSIGTERM starts the real binary on its embedded default, checks
// /healthz, /readyz and /metrics, then stops it with SIGTERM.
func TestServeAndSIGTERM(t *testing.T) {
	t.Parallel()
	path, addr := procConfig(t, t.TempDir(), "", "", laneYAML{rate: 5, burst: 2, target: "http://127.0.0.1:1/never"})
	p := startProc(t, path, addr)
	for _, path := range []string{"/healthz", "/metrics", "/v1/lanes"} {
		resp, err := pollClient.Get("http://" + addr + path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
	start := time.Now()
	p.stop()
	t.Logf("stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(p.logs.String(), `"msg":"stopped"`) {
		t.Fatalf("no clean-stop log line:\n%s", p.logs.String())
	}
}

// TestRefusedTargetNamesFileAndField: a target that resolves to a
// forbidden address fails the start with the file and the field named.
func TestRefusedTargetNamesFileAndField(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path, _ := procConfig(t, dir, "", "", laneYAML{rate: 5, burst: 1, target: "http://169.254.169.254/latest/meta-data"})
	msg := serveFails(t, path)
	if !strings.Contains(msg, path+": lanes[0]: target.http.url") || !strings.Contains(msg, "169.254.169.254") {
		t.Fatalf("stderr does not name the file, field and address:\n%s", msg)
	}
}

// TestDeadHelp: `throttler dead --help` prints the dead commands' usage
// and the global flags, as the other commands' --help does, not an
// "unknown subcommand" error.
func TestDeadHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "help"} {
		var out bytes.Buffer
		err := run(context.Background(), []string{"dead", arg}, func(string) string { return "" }, &out, &out)
		if !errors.Is(err, errUsage) || strings.Contains(out.String(), "unknown subcommand") ||
			!strings.Contains(out.String(), "throttler dead replay LANE [SEQ]") || !strings.Contains(out.String(), "-server") {
			t.Errorf("dead %s: %v\n%s", arg, err, out.String())
		}
	}
}
