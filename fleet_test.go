package throttler_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/testenv"
)

// TestLocalFleet runs deploy/local/fleet.sh as docs/RECIPES.md shows it, on
// free ports: it starts nats-server, redis-server, the sink and two
// instances, shows that both instances share one limit, and stops
// everything it started.
func TestLocalFleet(t *testing.T) {
	t.Parallel()
	env := []string{"FLEET_BIN=" + testenv.LocalBin(t), "FLEET_PREBUILT=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "THROTTLER_") && !strings.HasPrefix(kv, "FLEET_") {
			env = append(env, kv)
		}
	}
	var ports []int
	for _, name := range []string{"FLEET_HTTP1", "FLEET_HTTP2", "FLEET_NATS", "FLEET_REDIS", "FLEET_SINK"} {
		ports = append(ports, freePort(t))
		env = append(env, fmt.Sprintf("%s=%d", name, ports[len(ports)-1]))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "deploy/local/fleet.sh")
	cmd.Env = env
	// On a timeout, SIGTERM: the script's trap stops what it started.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	begin := time.Now()
	raw, err := cmd.CombinedOutput()
	out := string(raw)
	if err != nil {
		t.Fatalf("fleet.sh: %v\n%s", err, out)
	}
	t.Logf("fleet.sh took %v:\n%s", time.Since(begin).Round(100*time.Millisecond), out)

	number := func(re string) []float64 {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("fleet.sh printed no line matching %q", re)
		}
		var fs []float64
		for _, s := range m[1:] {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatal(err)
			}
			fs = append(fs, f)
		}
		return fs
	}
	took := number(`fleet: sent 60 jobs at once, 30 to each instance, in ([0-9.]+) s`)[0]
	admitted := number(`fleet: admitted (\d+) via 127\.0\.0\.1:\d+ \+ (\d+) via 127\.0\.0\.1:\d+ = (\d+):`)
	// One bucket for both: at most its burst of 10, plus a token per 50 ms
	// the sending took (two buckets would admit about 20).
	if total, most := admitted[2], 10+took/0.05+2; total < 1 || total > most || admitted[0]+admitted[1] != total {
		t.Errorf("admitted %v in %.2f s; want 1 to %.0f in total", admitted, took, most)
	}
	// After the admitted jobs, one shared rate of 20/s.
	span := number(`fleet: the sink received 60 jobs in ([0-9.]+) s`)[0]
	if least := (60 - admitted[2] - 1) / 20 * 0.8; span < least {
		t.Errorf("the sink received 60 jobs in %.1f s with %v admitted; one limit of 20/s takes at least %.1f s", span, admitted[2], least)
	}
	delivered := number(`fleet: delivered by 127\.0\.0\.1:\d+: (\d+), by 127\.0\.0\.1:\d+: (\d+)`)
	if delivered[0]+delivered[1] != 60 {
		t.Errorf("delivered %v, want 60 in total", delivered)
	}
	if !strings.HasSuffix(out, "fleet: stopped\n") {
		t.Errorf("the output does not end with the stop")
	}
	// Everything it started has stopped.
	for _, p := range ports {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), time.Second); err == nil {
			c.Close()
			t.Errorf("port %d still answers after fleet.sh ended", p)
		}
	}
}

// TestLocalScriptsBuild: deploy/local's scripts, unless told that their
// binaries are prebuilt (as TestLocalFleet and internal/fleet's
// TestLocalCluster do, to share the test run's binaries), build throttler
// and nats-server from go.mod into their bin directory with one go build;
// told so, they refuse a bin directory without both. The go command here is a script that
// records its arguments.
func TestLocalScriptsBuild(t *testing.T) {
	tools := t.TempDir()
	argsFile := filepath.Join(t.TempDir(), "args")
	shim := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + argsFile + "\n"
	if err := os.WriteFile(filepath.Join(tools, "go"), []byte(shim), 0o755); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	script := func(prebuilt string) (string, error) {
		cmd := exec.Command("bash", "-c", `prefix=fleet bin=$1 prebuilt=$2; source deploy/local/lib.sh; build_binaries`, "-", bin, prebuilt)
		cmd.Env = append(os.Environ(), "PATH="+tools+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := script(""); err != nil {
		t.Fatalf("build_binaries: %v\n%s", err, out)
	}
	args, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := "build\n-o\n" + bin + "/\n./cmd/throttler\ngithub.com/nats-io/nats-server/v2\n"; string(args) != want {
		t.Errorf("go called with\n%s\nwant\n%s", args, want)
	}
	os.Remove(argsFile)
	if out, err := script("1"); err == nil || !strings.Contains(out, bin+"/throttler is missing") {
		t.Errorf("prebuilt, with an empty bin: %v\n%s", err, out)
	}
	if _, err := os.Stat(argsFile); err == nil {
		t.Errorf("prebuilt, the script ran go")
	}
}
