package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// net/http keeps idle client connections' loops briefly after a test.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// recorder is an HTTP target that records each arrival.
type recorder struct {
	mu       sync.Mutex
	arrivals []arrival
	srv      *httptest.Server
}

type arrival struct {
	id   string
	at   time.Time
	body string
	ct   string
}

func newRecorder(t *testing.T) *recorder {
	r := &recorder{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.arrivals = append(r.arrivals, arrival{req.Header.Get("Idempotency-Key"), time.Now(), string(b), req.Header.Get("Content-Type")})
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *recorder) snapshot() []arrival {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]arrival(nil), r.arrivals...)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testConfig(t *testing.T, dataDir, target string, rate float64, burst int) config.Config {
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.NATS.DataDir = dataDir
	cfg.Dispatch.AllowNetworks = []string{"127.0.0.0/8"}
	cfg.Lanes = []config.Lane{{
		Name: "demo", Rate: rate, Burst: burst, MaxInflight: 16, MaxBacklog: 100000, MaxBody: 1 << 20,
		Target: config.Target{HTTP: &config.HTTPTarget{URL: target, Method: "POST", Timeout: config.Duration(5 * time.Second)}},
	}}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// start runs a service until the returned stop is called (or the test ends).
func start(t *testing.T, cfg config.Config) (*service.Service, func()) {
	t.Helper()
	svc := service.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-errc:
		cancel()
		t.Fatalf("service did not start: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("service not ready after 20s")
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return svc, stop
}

type accepted struct {
	ID    string `json:"id"`
	Lane  string `json:"lane"`
	State string `json:"state"`
	ETA   int64  `json:"eta_ms"`
}

func submit(t *testing.T, client *http.Client, addr, lane, id, body string) (int, accepted, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/"+lane+"/jobs", bytes.NewBufferString(body))
	req.Header.Set("Content-Type", "text/plain")
	if id != "" {
		req.Header.Set("Idempotency-Key", id)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	defer resp.Body.Close()
	var a accepted
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusAccepted {
		if err := json.Unmarshal(raw, &a); err != nil {
			t.Fatalf("202 body %q: %v", raw, err)
		}
	}
	return resp.StatusCode, a, resp.Header
}

// TestBurstBecomesSteadyStream is the walking skeleton's promise: 100 jobs
// at once on a 20/s burst-10 lane: 10 admitted, 90 queued, all delivered
// once, in order, the queued ones over 4.5 s.
func TestBurstBecomesSteadyStream(t *testing.T) {
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL+"/hook", 20, 10)
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	states := map[string]int{}
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("job-%03d", i)
		code, a, h := submit(t, client, svc.Addr(), "demo", ids[i], fmt.Sprintf("payload %d", i))
		if code != http.StatusAccepted || a.ID != ids[i] || a.Lane != "demo" {
			t.Fatalf("job %d: status %d, %+v", i, code, a)
		}
		if h.Get("X-RateLimit-Limit") != "10" || h.Get("RateLimit-Policy") == "" {
			t.Fatalf("job %d: rate-limit headers missing: %v", i, h)
		}
		states[a.State]++
		if i < 10 && a.State != "admitted" {
			t.Fatalf("job %d: state %s, want admitted", i, a.State)
		}
		if i >= 10 && (a.State != "queued" || a.ETA <= 0) {
			t.Fatalf("job %d: %+v, want queued with an ETA", i, a)
		}
	}
	if states["admitted"] != 10 || states["queued"] != 90 {
		t.Fatalf("states %v, want 10 admitted and 90 queued", states)
	}
	waitFor(t, 15*time.Second, "100 deliveries", func() bool { return len(rec.snapshot()) >= 100 })
	time.Sleep(200 * time.Millisecond) // a duplicate would show up now
	got := rec.snapshot()
	if len(got) != 100 {
		t.Fatalf("%d deliveries, want exactly 100", len(got))
	}
	seen := map[string]bool{}
	for _, a := range got {
		if seen[a.id] {
			t.Fatalf("job %s delivered twice", a.id)
		}
		seen[a.id] = true
	}
	// Order: the 10 admitted (dispatched together, so they may race each
	// other on the wire) come first; the 90 queued follow in submit order.
	for i, a := range got {
		if i < 10 {
			if a.id >= "job-010" {
				t.Fatalf("arrival %d is %s, want one of the 10 admitted", i, a.id)
			}
			continue
		}
		if a.id != ids[i] {
			t.Fatalf("arrival %d is %s, want %s", i, a.id, ids[i])
		}
		if want := fmt.Sprintf("payload %d", i); a.body != want || a.ct != "text/plain" {
			t.Fatalf("arrival %d body %q type %q, want %q text/plain", i, a.body, a.ct, want)
		}
	}
	// No 1-s window holds more than burst + rate = 30 arrivals.
	for i := range got {
		n := 0
		for j := i; j < len(got) && got[j].at.Sub(got[i].at) < time.Second; j++ {
			n++
		}
		if n > 30 {
			t.Fatalf("%d arrivals in the second after arrival %d", n, i)
		}
	}
	rel := make([]time.Duration, len(got))
	for i, a := range got {
		rel[i] = a.at.Sub(got[0].at)
	}
	buckettest.CheckWindows(t, rel, bucket.Limit{Rate: 20, Burst: 10}, 5*time.Millisecond)
	// The 90 queued drain at exactly 20/s: 4.5 s after the burst, ± 3%.
	span := got[99].at.Sub(got[0].at)
	if span < 4365*time.Millisecond || span > 4635*time.Millisecond {
		t.Fatalf("the burst took %v to drain, want 4.5s ± 3%%", span)
	}
	t.Logf("100 jobs: 10 admitted, 90 queued, drained in %v", span)
}

// TestRestartMidDrainLosesNothing stops the service while 50 jobs wait and
// starts it again on the same data directory.
func TestRestartMidDrainLosesNothing(t *testing.T) {
	rec := newRecorder(t)
	dir := t.TempDir()
	cfg := testConfig(t, dir, rec.srv.URL+"/hook", 50, 5)
	svc, stop := start(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for i := 0; i < 60; i++ {
		if code, _, _ := submit(t, client, svc.Addr(), "demo", fmt.Sprintf("r-%02d", i), "x"); code != http.StatusAccepted {
			t.Fatalf("job %d: status %d", i, code)
		}
	}
	waitFor(t, 5*time.Second, "some deliveries", func() bool { return len(rec.snapshot()) >= 15 })
	stop()
	before := len(rec.snapshot())
	if before >= 60 {
		t.Fatalf("all %d delivered before the stop; the test did not stop mid-drain", before)
	}
	svc2, _ := start(t, cfg)
	defer func() {
		t.Logf("deliveries: %d", len(rec.snapshot()))
		resp, err := http.Get("http://" + svc2.Addr() + "/v1/lanes")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Logf("%s", b)
		}
	}()
	waitFor(t, 10*time.Second, "60 deliveries after restart", func() bool { return len(rec.snapshot()) >= 60 })
	time.Sleep(200 * time.Millisecond)
	seen := map[string]int{}
	for _, a := range rec.snapshot() {
		seen[a.id]++
	}
	for i := 0; i < 60; i++ {
		id := fmt.Sprintf("r-%02d", i)
		if seen[id] != 1 {
			t.Errorf("job %s delivered %d times, want 1 (graceful stop)", id, seen[id])
		}
	}
	t.Logf("%d delivered before the stop, the rest after the restart", before)
}
