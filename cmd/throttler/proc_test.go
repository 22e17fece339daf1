package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/testenv"
)

// Helpers for tests that run real throttler processes.

// proc is one running `throttler serve`.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	logs *testenv.LogBuffer
	addr string
	done chan struct{}
}

// laneYAML is the config of one lane for procConfig.
type laneYAML struct {
	rate        float64
	burst       int
	maxInflight int
	target      string
	extra       string // more YAML lines for the lane, indented by 4
}

// procConfig writes a config file for one instance and returns its path and
// HTTP address. natsURL "" means embedded (data in dir); redisURL "" means
// the in-memory pacer.
func procConfig(t *testing.T, dir, natsURL, redisURL string, l laneYAML) (string, string) {
	t.Helper()
	addr := freePort(t)
	if l.maxInflight == 0 {
		l.maxInflight = 16
	}
	y := fmt.Sprintf(`listen: %s
shutdown_timeout: 5s
nats:
  url: %q
  data_dir: %s
redis:
  url: %q
dispatch:
  allow_networks: [127.0.0.0/8]
lanes:
  - name: demo
    rate: %g
    burst: %d
    max_inflight: %d
    target:
      http:
        url: %s
        timeout: 5s
%s`, addr, natsURL, filepath.Join(dir, "data"), redisURL, l.rate, l.burst, l.maxInflight, l.target, l.extra)
	path := filepath.Join(dir, fmt.Sprintf("throttler-%s.yaml", strings.ReplaceAll(addr, ":", "-")))
	if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, addr
}

// startProc runs `throttler serve --config path` and waits for /readyz.
func startProc(t *testing.T, path, addr string) *proc {
	t.Helper()
	return startBinary(t, binary, path, addr)
}

// startBinary is startProc with the throttler binary at bin.
func startBinary(t *testing.T, bin, path, addr string) *proc {
	t.Helper()
	return startBinaryEnv(t, bin, path, addr, nil)
}

// startBinaryEnv is startBinary with env added to the test's environment.
func startBinaryEnv(t *testing.T, bin, path, addr string, env []string) *proc {
	t.Helper()
	p := &proc{t: t, cmd: exec.Command(bin, "serve", "--config", path), logs: &testenv.LogBuffer{}, addr: addr, done: make(chan struct{})}
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stderr = p.logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("logs of %s:\n%s", addr, tail(p.logs.String(), 60))
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := pollClient.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case <-p.done:
			t.Fatalf("throttler on %s exited at start:\n%s", addr, p.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("throttler on %s not ready in 20s:\n%s", addr, p.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill9 kills the process without warning and waits for it.
func (p *proc) kill9() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits up to 15 s for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if !p.cmd.ProcessState.Success() {
			p.t.Errorf("throttler on %s: %v after SIGTERM", p.addr, p.cmd.ProcessState)
		}
	case <-time.After(15 * time.Second):
		p.t.Fatalf("throttler on %s still running 15 s after SIGTERM", p.addr)
	}
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// arrivals is an HTTP target that records each job id and arrival time.
type arrivals struct {
	mu   sync.Mutex
	ids  []string
	at   []time.Time
	srv  *httptest.Server
	code func(id string) int // nil: 200
}

func newArrivals(t *testing.T) *arrivals {
	a := &arrivals{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		id := r.Header.Get("Idempotency-Key")
		a.mu.Lock()
		a.ids = append(a.ids, id)
		a.at = append(a.at, time.Now())
		code := a.code
		a.mu.Unlock()
		if code != nil {
			w.WriteHeader(code(id))
		}
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ids)
}

// perID counts deliveries of each id.
func (a *arrivals) perID() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := map[string]int{}
	for _, id := range a.ids {
		m[id]++
	}
	return m
}

// post submits one job and returns the status code (0 on a transport error).
func post(client *http.Client, addr, id string) int {
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/demo/jobs", strings.NewReader(`{"job":"`+id+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// pollClient is the HTTP client of the tests' reads and polls: a read
// never hangs past its timeout, so a poll's deadline holds.
var pollClient = &http.Client{Timeout: 5 * time.Second}

// poll is testenv.Eventually, the suite's one polling helper.
var poll = testenv.Eventually

// settled waits until the lane demo, as the instance at addr reads it from
// the shared JetStream, holds nothing: no job stored (waiting or in flight)
// and none waiting for a retry. Nothing is left then that could be
// delivered again, so delivery counts taken after it are final.
func settled(t *testing.T, addr string) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	poll(t, 15*time.Second, "the lane to settle on "+addr, func() bool {
		resp, err := client.Get("http://" + addr + "/v1/lanes")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out struct {
			Lanes []struct {
				Backlog  uint64 `json:"backlog"`
				Retrying uint64 `json:"retrying"`
				InFlight int    `json:"in_flight"`
			} `json:"lanes"`
		}
		if json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Lanes) == 0 {
			return false
		}
		l := out.Lanes[0]
		return l.Backlog == 0 && l.Retrying == 0 && l.InFlight == 0
	})
}
