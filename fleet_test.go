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
)

// TestLocalFleet runs deploy/local/fleet.sh as docs/RECIPES.md shows it, on
// free ports: it starts nats-server, redis-server, the sink and two
// instances, shows that both instances share one limit, and stops
// everything it started.
func TestLocalFleet(t *testing.T) {
	t.Parallel()
	env := []string{"FLEET_BIN=" + prebuiltBin(t), "FLEET_PREBUILT=1"}
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

// TestLocalCluster runs deploy/local/cluster.sh as docs/OPERATIONS.md
// shows it: three NATS nodes, a Redis master with a replica and three
// sentinels, three instances and the sink, on ports from a random base. It
// kills the lane's stream leader and the Redis master mid-drain; every job
// arrives, the sentinels promote the replica, the node rejoins, and
// everything the script started stops.
func TestLocalCluster(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"redis-server", "redis-sentinel", "redis-cli", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("deploy/local/cluster.sh needs %s on PATH (apt-get install redis-server redis-sentinel curl)", tool)
		}
	}
	bin := prebuiltBin(t)
	var out string
	var base int
	for attempt := 0; ; attempt++ {
		// Bases 20000–31000 (ports up to 31900) stay below Linux's
		// ephemeral range (32768 and up), where every other test's free
		// ports and outgoing connections land: a port the script found
		// free was once taken by one of those before nats-server bound it.
		base = 20000 + 1000*int(time.Now().UnixNano()%12)
		env := []string{"CLUSTER_BIN=" + bin, "CLUSTER_PREBUILT=1", fmt.Sprintf("CLUSTER_BASE=%d", base)}
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "THROTTLER_") && !strings.HasPrefix(kv, "CLUSTER_") {
				env = append(env, kv)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		cmd := exec.CommandContext(ctx, "deploy/local/cluster.sh")
		cmd.Env = env
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 30 * time.Second
		begin := time.Now()
		raw, err := cmd.CombinedOutput()
		cancel()
		out = string(raw)
		if err != nil && strings.Contains(out, "is in use: choose another CLUSTER_BASE") && attempt < 3 {
			continue
		}
		if err != nil {
			t.Fatalf("cluster.sh: %v\n%s", err, out)
		}
		t.Logf("cluster.sh took %v:\n%s", time.Since(begin).Round(100*time.Millisecond), out)
		break
	}
	for _, re := range []string{
		`cluster: sent 90 jobs, 30 to each instance: all accepted`,
		`cluster: killed \(SIGKILL\) nats-[123], the leader of the lane's stream, and the Redis master, after \d+ arrivals`,
		`cluster: the sink received all 90 jobs in (\d+) arrivals`,
		fmt.Sprintf(`cluster: the sentinels promoted 127\.0\.0\.1:%d `, base+380),
		`cluster: nats-[123] restarted and caught up`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("cluster.sh printed no line matching %q", re)
		}
	}
	if m := regexp.MustCompile(`received all 90 jobs in (\d+) arrivals`).FindStringSubmatch(out); m != nil {
		// A job in flight when the leader died may come twice: at most
		// max_inflight (16) per instance.
		if n, _ := strconv.Atoi(m[1]); n > 90+3*16 {
			t.Errorf("%d arrivals for 90 jobs", n)
		}
	}
	if !strings.HasSuffix(out, "cluster: stopped\n") {
		t.Errorf("the output does not end with the stop")
	}
	for _, off := range []int{81, 82, 83, 222, 223, 224, 622, 623, 624, 822, 823, 824, 379, 380, 501, 502, 503, 900} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", base+off), time.Second); err == nil {
			c.Close()
			t.Errorf("port %d still answers after cluster.sh ended", base+off)
		}
	}
}

// TestLocalScriptsBuild: deploy/local's scripts, unless told that their
// binaries are prebuilt (as TestLocalFleet and TestLocalCluster do, to
// share the test run's binaries), build throttler and nats-server from
// go.mod into their bin directory with one go build; told so, they refuse
// a bin directory without both. The go command here is a script that
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
