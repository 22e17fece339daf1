package main

import (
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// TestSecondSignalExitsAtOnce: the first SIGTERM starts a graceful stop
// that waits for an in-flight delivery (shutdown_timeout 60 s); a second one
// ends the process at once, exit status 2.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(target.Close)
	t.Cleanup(func() { close(release) }) // runs first: the held request ends
	path, addr := procConfig(t, t.TempDir(), "", "", laneYAML{rate: 10, burst: 1, target: target.URL})
	setShutdownTimeout(t, path, "60s")
	p := startProc(t, path, addr)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	if code := post(client, addr, "slow-1"); code != http.StatusAccepted {
		t.Fatalf("status %d", code)
	}
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not reach the target")
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	poll(t, 10*time.Second, "the graceful stop to begin", func() bool {
		return strings.Contains(p.logs.String(), "finishing in-flight dispatches")
	})
	select {
	case <-p.done:
		t.Fatal("the process exited with a delivery in flight and 60 s of shutdown_timeout left")
	default:
	}
	second := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		t.Fatal("still running 3 s after the second SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 2 {
		t.Fatalf("exit status %d after the second signal, want 2", code)
	}
	if !strings.Contains(p.logs.String(), "second signal, exiting now") {
		t.Fatalf("no word of the second signal:\n%s", tail(p.logs.String(), 20))
	}
	if took := time.Since(second); took > 2*time.Second {
		t.Errorf("exited %v after the second signal", took)
	}
}

// setShutdownTimeout rewrites shutdown_timeout in the config file at path.
func setShutdownTimeout(t *testing.T, path, d string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "shutdown_timeout: 5s", "shutdown_timeout: "+d, 1)
	if s == string(b) {
		t.Fatal("no shutdown_timeout line to change")
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSignedWebhooksEndToEnd: signing_secrets in the config file (two, a
// rotation) give every delivery webhook-id,
// webhook-timestamp and webhook-signature headers that the official
// Standard Webhooks library verifies with either secret, on the first
// attempt and on a retry alike; the id is the job id.
func TestSignedWebhooksEndToEnd(t *testing.T) {
	t.Parallel()
	secret := func() string {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			t.Fatal(err)
		}
		return "whsec_" + base64.StdEncoding.EncodeToString(key)
	}
	current, previous := secret(), secret()
	var verifiers []*standardwebhooks.Webhook
	for _, s := range []string{current, previous} {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		verifiers = append(verifiers, wh)
	}
	type delivery struct {
		id   string
		errs []error
	}
	var mu sync.Mutex
	var got []delivery
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		d := delivery{id: r.Header.Get("webhook-id")}
		for _, wh := range verifiers {
			d.errs = append(d.errs, wh.Verify(body, r.Header))
		}
		mu.Lock()
		got = append(got, d)
		first := len(got) == 1
		mu.Unlock()
		if first {
			w.WriteHeader(http.StatusInternalServerError) // one retry, signed afresh
		}
	}))
	t.Cleanup(target.Close)
	path, addr := procConfig(t, t.TempDir(), "", "", laneYAML{rate: 20, burst: 5, target: target.URL,
		extra: "        signing_secrets: [\"" + current + "\", \"" + previous + "\"]\n" +
			"    retry:\n      max_attempts: 3\n      backoff_base: 50ms\n"})
	startProc(t, path, addr)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for _, id := range []string{"evt-1", "evt-2", "evt-3"} {
		if code := post(client, addr, id); code != http.StatusAccepted {
			t.Fatalf("%s: status %d", id, code)
		}
	}
	poll(t, 15*time.Second, "4 deliveries (3 jobs, one retried)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 4
	})
	mu.Lock()
	defer mu.Unlock()
	ids := map[string]int{}
	for _, d := range got {
		ids[d.id]++
		for i, err := range d.errs {
			if err != nil {
				t.Errorf("delivery of %q: secret %d of the rotation does not verify: %v", d.id, i, err)
			}
		}
	}
	if ids["evt-1"]+ids["evt-2"]+ids["evt-3"] != 4 || ids["evt-1"] == 0 || ids["evt-2"] == 0 || ids["evt-3"] == 0 {
		t.Fatalf("webhook-id per delivery: %v, want the job ids, one of them twice", ids)
	}
}
