package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func sha256Hex(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// status sends one request with an optional API key.
func status(t *testing.T, method, url, secret string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader("{}"))
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSIGHUPReloadsKeys: the real binary with auth.keys_file; after the
// file changes, SIGHUP makes the new key work and the old one fail, without
// a restart.
func TestSIGHUPReloadsKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.yaml")
	write := func(id, secret string) {
		t.Helper()
		y := fmt.Sprintf("- {id: %s, sha256: %s, scopes: [read]}\n", id, sha256Hex(secret))
		if err := os.WriteFile(keys+".tmp", []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(keys+".tmp", keys); err != nil {
			t.Fatal(err)
		}
	}
	write("first", "first-secret")
	path, addr := procConfig(t, dir, "", "", laneYAML{rate: 5, burst: 1, target: "http://127.0.0.1:1/never",
		extra: "auth:\n  keys_file: " + keys + "\n"})
	p := startProc(t, path, addr)
	lanes := "http://" + addr + "/v1/lanes"
	if c := status(t, "GET", lanes, ""); c != 401 {
		t.Fatalf("no key: %d", c)
	}
	if c := status(t, "GET", lanes, "first-secret"); c != 200 {
		t.Fatalf("first key: %d", c)
	}
	write("second", "second-secret\n") // hashed as `… | tee secret | sha256sum` does
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "the second key to work", func() bool { return status(t, "GET", lanes, "second-secret") == 200 })
	if c := status(t, "GET", lanes, "first-secret"); c != 401 {
		t.Fatalf("first key after SIGHUP: %d", c)
	}
	if !strings.Contains(p.logs.String(), `"msg":"reload: API keys replaced"`) {
		t.Fatalf("no reload log:\n%s", p.logs.String())
	}
	p.stop()
}

// TestNonLoopbackNeedsKeys: a non-loopback listen without keys refuses to
// start, naming auth; with auth.anonymous it starts and warns.
func TestNonLoopbackNeedsKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	free := freePort(t)
	port := free[strings.LastIndex(free, ":"):] // ":12345"
	y := func(extra string) string {
		p := filepath.Join(dir, fmt.Sprintf("c%d.yaml", len(extra)))
		os.WriteFile(p, []byte(fmt.Sprintf(`listen: 0.0.0.0%s
nats: {data_dir: %s}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
  - name: demo
    rate: 5
    target: {http: {url: "http://127.0.0.1:1/never"}}
%s`, port, filepath.Join(dir, "data"), extra)), 0o644)
		return p
	}
	path := y("")
	if msg := serveFails(t, path); !strings.Contains(msg, path+": auth: listen 0.0.0.0"+port+" is not a loopback address") {
		t.Fatalf("stderr does not name the file and auth:\n%s", msg)
	}
	p := startProc(t, y("auth: {anonymous: true}\n"), "127.0.0.1"+port)
	if !strings.Contains(p.logs.String(), `"level":"WARN","msg":"auth.anonymous: no API keys on a non-loopback listen`) {
		t.Fatalf("no warning:\n%s", p.logs.String())
	}
	// Anonymous: the Host must be loopback (or auth.hosts).
	req, _ := http.NewRequest("GET", "http://127.0.0.1"+port+"/v1/lanes", nil)
	req.Host = "rebind.attacker.example" + port
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("rebound Host: %d", resp.StatusCode)
	}
	p.stop()
}

// TestBadRedisURLIsNotPrinted: a redis.url the process refuses is printed
// without its password.
func TestBadRedisURLIsNotPrinted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path, _ := procConfig(t, dir, "", "redis://user:hunter2-redis@127.0.0.1:1/not-a-db", laneYAML{rate: 5, burst: 1, target: "http://127.0.0.1:1/never"})
	msg := serveFails(t, path)
	if strings.Contains(msg, "hunter2-redis") || !strings.Contains(msg, "redis.url") {
		t.Fatalf("stderr:\n%s", msg)
	}
	path, _ = procConfig(t, dir, "", "http://user:hunter2-redis@127.0.0.1:1/0", laneYAML{rate: 5, burst: 1, target: "http://127.0.0.1:1/never"})
	msg = serveFails(t, path)
	if strings.Contains(msg, "hunter2-redis") || !strings.Contains(msg, "redis.url: \"http://user:***@127.0.0.1:1/0\"") {
		t.Fatalf("stderr:\n%s", msg)
	}
}
