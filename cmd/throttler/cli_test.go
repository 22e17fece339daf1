package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/client"
	"github.com/throttler/throttler/internal/testenv"
)

// cliServer starts the real binary with two keyed-auth lanes: demo (its
// target takes everything) and failing (its target refuses every job for
// good, so they become dead letters). Keys: "ops-secret" (admin) and
// "viewer-secret" (read).
func cliServer(t *testing.T) string {
	t.Helper()
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
	t.Cleanup(ok.Close)
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "refused", http.StatusUnprocessableEntity)
	}))
	t.Cleanup(refuse.Close)
	hash := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	return serveEmbedded(t, fmt.Sprintf(`auth:
  keys:
    - {id: ops, sha256: %s, scopes: [admin]}
    - {id: viewer, sha256: %s, scopes: [read]}
lanes:
  - name: demo
    max_bytes: 64MiB
    rate: 20/s
    burst: 5
    target: {http: {url: %s, timeout: 5s}}
  - name: failing
    max_bytes: 64MiB
    rate: 500/s
    burst: 50
    target: {http: {url: %s, timeout: 5s}}
  - name: hooks
    max_bytes: 64MiB
    rate: 50/s
    burst: 5
    per_key: {rate: 5/s, burst: 2}
    target: {http: {url: %s, timeout: 5s, forward_headers: [X-Api-Key], job_urls: ["https://hooks.example.com/r/"]}}
`, hash("ops-secret"), hash("viewer-secret"), ok.URL, refuse.URL, ok.URL))
}

// serveEmbedded runs the binary on a config of the embedded nats-server
// (its data in a temporary directory, streams of 64 MiB) followed by rest
// (auth, lanes), and returns its base URL.
func serveEmbedded(t *testing.T, rest string) string {
	t.Helper()
	dir := t.TempDir()
	addr := freePort(t)
	y := fmt.Sprintf(`listen: %s
shutdown_timeout: 5s
nats: {data_dir: %s}
dispatch: {allow_networks: [127.0.0.0/8]}
retries: {max_bytes: 64MiB}
dead_letters: {max_bytes: 64MiB}
`, addr, filepath.Join(dir, "data")) + rest
	path := filepath.Join(dir, "throttler.yaml")
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	startProc(t, path, addr)
	return "http://" + addr
}

// cli runs the real binary with args and env, and returns its exit code,
// stdout and stderr.
func cli(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

// want checks an exit code, and that stdout/stderr contain the given
// strings.
func want(t *testing.T, what string, code int, stdout, stderr string, wantCode int, inStdout, inStderr string) {
	t.Helper()
	if code != wantCode || !strings.Contains(stdout, inStdout) || !strings.Contains(stderr, inStderr) {
		t.Fatalf("%s: exit %d (want %d)\nstdout:\n%s\nstderr:\n%s\n(want %q on stdout, %q on stderr)",
			what, code, wantCode, stdout, stderr, inStdout, inStderr)
	}
}

// TestCLIAgainstServer runs every CLI command as a real process against a
// real server: output, flags and env, errors on stderr, exit codes.
func TestCLIAgainstServer(t *testing.T) {
	t.Parallel()
	url := cliServer(t)
	env := []string{"THROTTLER_SERVER=" + url, "THROTTLER_KEY=viewer-secret"}
	ops := append(env[:1:1], "THROTTLER_KEY=ops-secret")

	// Lanes: a table, JSON; no key → 4; --key wins over the env.
	code, out, errOut := cli(t, env, "lanes")
	want(t, "lanes", code, out, errOut, 0, "LANE", "")
	if !strings.Contains(out, "demo") || !strings.Contains(out, "failing") || errOut != "" {
		t.Fatalf("lanes table:\n%s\nstderr: %s", out, errOut)
	}
	code, out, errOut = cli(t, env, "lanes", "--json")
	var lanes api.Lanes
	if err := json.Unmarshal([]byte(out), &lanes); code != 0 || err != nil || len(lanes.Lanes) != 3 || lanes.Lanes[0].Name != "demo" {
		t.Fatalf("lanes --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	code, out, errOut = cli(t, []string{"THROTTLER_SERVER=" + url, "THROTTLER_KEY="}, "lanes")
	want(t, "lanes without a key", code, out, errOut, 4, "", "401")
	code, out, errOut = cli(t, env, "lanes", "--key", "wrong")
	want(t, "lanes --key wrong", code, out, errOut, 4, "", "throttler: GET /v1/lanes: 401")
	code, out, errOut = cli(t, nil, "lanes", "--server", url, "--key", "viewer-secret")
	want(t, "lanes with flags only", code, out, errOut, 0, "failing", "")
	code, out, errOut = cli(t, nil, "lanes", "--server", "http://127.0.0.1:1")
	want(t, "lanes of a server that is not there", code, out, errOut, 1, "", "connection refused")

	// lane set: scope, flags after the lane, bad input, unknown lane.
	code, out, errOut = cli(t, env, "lane", "set", "demo", "--rate", "50/s", "--burst", "10")
	want(t, "lane set with a read key", code, out, errOut, 4, "", "403")
	code, out, errOut = cli(t, ops, "lane", "set", "demo", "--rate", "50/s", "--burst", "10")
	want(t, "lane set", code, out, errOut, 0, "demo", "")
	if f := strings.Fields(strings.Split(out, "\n")[1]); len(f) < 3 || f[1] != "50" || f[2] != "10" {
		t.Fatalf("lane set printed:\n%s", out)
	}
	code, out, errOut = cli(t, ops, "lane", "set", "demo", "--rate", "fast")
	want(t, "lane set --rate fast", code, out, errOut, 2, "", "(field rate)")
	code, out, errOut = cli(t, ops, "lane", "set", "nope", "--burst", "2")
	want(t, "lane set of an unknown lane", code, out, errOut, 3, "", "404")
	code, out, errOut = cli(t, ops, "lane", "set", "demo")
	want(t, "lane set without a change", code, out, errOut, 2, "", "give --rate and/or --burst")
	code, out, errOut = cli(t, ops, "lane", "set", "demo", "--frobnicate")
	want(t, "lane set with an unknown flag", code, out, errOut, 2, "", "flag provided but not defined")
	code, out, errOut = cli(t, ops, "lane", "set", "--help")
	want(t, "lane set --help", code, out, errOut, 2, "", "outlives restarts")
	if strings.Contains(errOut, "until they restart") {
		t.Errorf("lane set --help says the change lasts until a restart; it is stored:\n%s", errOut)
	}

	// lane pause|resume: scope, the lane's row, unknown lane.
	code, out, errOut = cli(t, env, "lane", "pause", "demo")
	want(t, "lane pause with a read key", code, out, errOut, 4, "", "403")
	code, out, errOut = cli(t, ops, "lane", "pause", "demo")
	want(t, "lane pause", code, out, errOut, 0, "paused by ops", "")
	code, out, errOut = cli(t, ops, "lane", "pause", "demo", "--json")
	var held api.LaneStatus
	if err := json.Unmarshal([]byte(out), &held); code != 0 || err != nil || !held.PausedByOperator {
		t.Fatalf("lane pause --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	code, out, errOut = cli(t, ops, "lane", "resume", "demo")
	want(t, "lane resume", code, out, errOut, 0, "demo", "")
	if strings.Contains(out, "paused by") {
		t.Errorf("lane resume printed a held lane:\n%s", out)
	}
	code, out, errOut = cli(t, ops, "lane", "pause", "nope")
	want(t, "lane pause of an unknown lane", code, out, errOut, 3, "", "404")
	code, out, errOut = cli(t, ops, "lane", "resume")
	want(t, "lane resume without a lane", code, out, errOut, 2, "", "takes one LANE")

	code, out, errOut = cli(t, ops, "frobnicate")
	want(t, "unknown command", code, out, errOut, 2, "", "unknown command")

	// health: the container check (no key needed); a server that is not
	// there, or a URL that answers otherwise, exits 1.
	code, out, errOut = cli(t, nil, "health", "--url", url+"/readyz")
	want(t, "health of a ready server", code, out, errOut, 0, "ok:", "")
	code, out, errOut = cli(t, nil, "health", "--url", url+"/nope")
	want(t, "health of a URL that answers 404", code, out, errOut, 1, "", "answered 404")
	code, out, errOut = cli(t, nil, "health", "--url", "http://127.0.0.1:1/readyz")
	want(t, "health of a server that is not there", code, out, errOut, 1, "", "connection refused")

	// Keys of a keyed lane.
	code, out, errOut = cli(t, env, "keys", "hooks")
	want(t, "keys hooks", code, out, errOut, 0, "PER-KEY RATE/S", "")
	code, out, errOut = cli(t, env, "keys", "demo")
	want(t, "keys of a lane that is not keyed", code, out, errOut, 3, "", "not keyed")
	code, out, errOut = cli(t, ops, "keys", "set", "hooks", "cust-1", "--rate", "2/s", "--burst", "3")
	want(t, "keys set", code, out, errOut, 0, "cust-1", "")
	code, out, errOut = cli(t, env, "keys", "hooks", "cust-1", "--json")
	var ks api.KeyStatus
	if err := json.Unmarshal([]byte(out), &ks); code != 0 || err != nil || ks.Rate != 2 || ks.Burst != 3 || !ks.Overridden {
		t.Fatalf("keys hooks cust-1 --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	code, out, errOut = cli(t, env, "keys", "set", "hooks", "cust-1", "--pause")
	want(t, "keys set with a read key", code, out, errOut, 4, "", "403")
	// A key's own target: URL, header and secret; the secret and the
	// header's value are never printed.
	code, out, errOut = cli(t, ops, "keys", "set", "hooks", "cust-2", "--url", "https://hooks.example.com/r/cust-2", "--header", "X-Api-Key=hdr-value",
		"--signing-secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	want(t, "keys set --url --header --signing-secret", code, out, errOut, 0, "cust-2 target: url=https://hooks.example.com/r/cust-2 headers=X-Api-Key signing_secret_set=true", "")
	if strings.Contains(out, "hdr-value") || strings.Contains(out, "whsec_") {
		t.Errorf("keys set printed a header value or the secret:\n%s", out)
	}
	code, out, errOut = cli(t, ops, "keys", "set", "hooks", "cust-2", "--url", "https://hooks.example.com/elsewhere")
	want(t, "keys set --url outside job_urls", code, out, errOut, 2, "", "(field url)")
	code, out, errOut = cli(t, ops, "keys", "set", "hooks", "cust-2", "--url", "", "--header=", "--signing-secret", "")
	want(t, "keys set dropping the key's target", code, out, errOut, 0, "cust-2", "")
	if strings.Contains(out, "target:") {
		t.Errorf("keys set did not drop the key's target:\n%s", out)
	}

	// Dead letters: 30 jobs to the failing lane.
	c, err := client.New(url, client.WithAPIKey("ops-secret"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A paused key keeps its jobs: `keys LANE` lists it among the busiest.
	code, out, errOut = cli(t, ops, "keys", "set", "hooks", "cust-1", "--pause")
	want(t, "keys set --pause", code, out, errOut, 0, "cust-1", "")
	for i := range 4 {
		if _, err := c.Submit(ctx, "hooks", []byte("x"), &client.SubmitOptions{IdempotencyKey: fmt.Sprintf("held-%d", i), ThrottleKey: "cust-1"}); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut = cli(t, env, "keys", "hooks")
	want(t, "keys hooks with a backlog", code, out, errOut, 0, "BACKLOG", "")
	if !strings.Contains(out, "cust-1  4") {
		t.Errorf("keys hooks: want cust-1 with a backlog of 4 among the busiest keys:\n%s", out)
	}
	for i := range 30 {
		if _, err := c.Submit(ctx, "failing", fmt.Appendf(nil, "payload %d", i), &client.SubmitOptions{IdempotencyKey: fmt.Sprintf("job-%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	waitDead := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			d, err := c.ListDead(ctx, "failing", 0, 1000)
			if err == nil && len(d.Dead) == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %d dead letters: %+v %v", n, d, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitDead(30)
	code, out, errOut = cli(t, env, "dead", "ls", "failing")
	want(t, "dead ls", code, out, errOut, 0, "job-29", "")
	if lines := strings.Count(strings.TrimSpace(out), "\n"); lines != 30 {
		t.Fatalf("dead ls: %d rows, want 30:\n%s", lines, out)
	}
	code, out, errOut = cli(t, env, "dead", "ls", "failing", "--limit", "5", "--json")
	var page api.DeadLetters
	if err := json.Unmarshal([]byte(out), &page); code != 0 || err != nil || len(page.Dead) != 5 || page.Dead[0].Seq >= page.Dead[4].Seq {
		t.Fatalf("dead ls --limit 5 --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	seq := fmt.Sprint(page.Dead[0].Seq)
	code, out, errOut = cli(t, env, "dead", "show", "failing", seq)
	want(t, "dead show with a read key", code, out, errOut, 4, "", "403")
	code, out, errOut = cli(t, ops, "dead", "show", "failing", seq)
	// Jobs die in the order their deliveries end: the first may be any.
	var n int
	if _, err := fmt.Sscanf(page.Dead[0].ID, "job-%d", &n); err != nil {
		t.Fatalf("dead letter id %q: %v", page.Dead[0].ID, err)
	}
	want(t, "dead show", code, out, errOut, 0, fmt.Sprintf("payload %d\n", n), "")
	if !strings.Contains(out, "last status:") || !strings.Contains(out, "422") {
		t.Fatalf("dead show:\n%s", out)
	}
	code, out, errOut = cli(t, ops, "dead", "show", "failing", "999999")
	want(t, "dead show of a missing one", code, out, errOut, 3, "", "404")
	code, out, errOut = cli(t, ops, "dead", "show", "failing", "abc")
	want(t, "dead show abc", code, out, errOut, 2, "", "not a dead-letter sequence number")
	code, out, errOut = cli(t, ops, "dead", "show", "failing")
	want(t, "dead show without SEQ", code, out, errOut, 2, "", "usage")
	code, out, errOut = cli(t, ops, "dead", "frob", "failing")
	want(t, "dead frob", code, out, errOut, 2, "", "unknown subcommand")
	code, out, errOut = cli(t, ops, "dead", "replay", "failing", seq, "--throttle-key", "a/b")
	want(t, "dead replay SEQ with an invalid key", code, out, errOut, 2, "", "key: the key has a byte 0x2f")
	code, out, errOut = cli(t, ops, "dead", "replay", "failing", "--throttle-key", "k1")
	want(t, "dead replay all with a key", code, out, errOut, 2, "", "--throttle-key needs a SEQ")
	code, out, errOut = cli(t, ops, "dead", "replay", "failing", seq, "--throttle-key", "k1")
	want(t, "dead replay SEQ", code, out, errOut, 0, page.Dead[0].ID+") into lane failing, key k1", "")
	code, out, errOut = cli(t, ops, "dead", "purge", "failing", fmt.Sprint(page.Dead[1].Seq))
	want(t, "dead purge SEQ", code, out, errOut, 0, "deleted", "")
	waitDead(29) // 28 left, and job-00 dead again
	code, out, errOut = cli(t, ops, "dead", "replay", "failing", "--chunk", "7")
	want(t, "dead replay all", code, out, errOut, 0, "replayed 29 dead letters", "replayed 7 of 29")
	if n := strings.Count(errOut, "replayed "); n != 5 || !strings.Contains(errOut, "replayed 29 of 29 (100%)") {
		t.Fatalf("progress of 29 in chunks of 7: %d lines:\n%s", n, errOut)
	}
	waitDead(29)
	code, out, errOut = cli(t, ops, "dead", "purge", "failing", "--json")
	want(t, "dead purge", code, out, errOut, 0, `"purged": true`, "")
	code, out, errOut = cli(t, env, "dead", "ls", "failing", "--json")
	if code != 0 || strings.TrimSpace(out) != "{\n  \"dead\": []\n}" {
		t.Fatalf("dead ls after purge: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, ops, "dead", "ls", "nope")
	want(t, "dead ls of an unknown lane", code, out, errOut, 3, "", `no lane named "nope"`)

	// A replay of all says how many it passed over: two dead letters
	// past their Throttle-Expires stay dead, the third is replayed.
	expires := time.Now().Add(2 * time.Second)
	for i, exp := range []time.Time{expires, expires, {}} {
		if _, err := c.Submit(ctx, "failing", []byte("x"), &client.SubmitOptions{IdempotencyKey: fmt.Sprintf("exp-%d", i), Expires: exp}); err != nil {
			t.Fatal(err)
		}
	}
	waitDead(3)
	time.Sleep(time.Until(expires.Add(100 * time.Millisecond)))
	code, out, errOut = cli(t, ops, "dead", "replay", "failing", "--chunk", "1")
	want(t, "dead replay all with expired ones", code, out, errOut, 0, "replayed 1 dead letters", "")
	if !strings.Contains(out, "2 dead letters past their Throttle-Expires were not replayed") {
		t.Fatalf("dead replay all: the expired ones not counted:\n%s", out)
	}
	waitDead(3)
	code, out, errOut = cli(t, ops, "dead", "replay", "failing", "--json")
	if code != 0 || !strings.Contains(out, `"expired": 2`) || !strings.Contains(out, `"replayed": 1`) {
		t.Fatalf("dead replay all --json: exit %d\n%s%s", code, out, errOut)
	}
}

// TestCLIWatch: lanes --watch refreshes until interrupted, then exits 0.
func TestCLIWatch(t *testing.T) {
	t.Parallel()
	url := cliServer(t)
	cmd := exec.Command(binary, "lanes", "--watch", "--interval", "200ms", "--server", url, "--key", "viewer-secret")
	var stdout, stderr testenv.LogBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(stdout.String(), "LANE") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 3 refreshes in 30s:\n%s\nstderr: %s", stdout.String(), stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGINT: %v\nstderr: %s", err, stderr.String())
	}
}

// TestExitCodes: the documented mapping of errors to exit codes.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, 0},
		{errors.New("boom"), 1},
		{errUsage, 2},
		{usageError("bad"), 2},
		{&client.Error{StatusCode: 400}, 2},
		{&client.Error{StatusCode: 413}, 2},
		{&client.Error{StatusCode: 404}, 3},
		{&client.Error{StatusCode: 401}, 4},
		{&client.Error{StatusCode: 403}, 4},
		{&client.Error{StatusCode: 429}, 5},
		{&client.Error{StatusCode: 503}, 5},
		{&client.Error{StatusCode: 500}, 1},
		{fmt.Errorf("wrapped: %w", &client.Error{StatusCode: 404}), 3},
	} {
		if got := exitCode(tc.err); got != tc.code {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}
