package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IdleHTTP()...)
}

// TestDelay is the backoff rule, step by step: at least Retry-After; the
// 2nd, 3rd, 4th consecutive 429 ×2, ×4, ×8; capped at MaxDelay; ±20 %
// jitter that never goes below Retry-After.
func TestDelay(t *testing.T) {
	p := DefaultRetryPolicy()
	const (
		none = 0.5 // the jitter source's middle: no jitter
		low  = 0.0 // -20 %
		high = 0.999999
	)
	s := time.Second
	for _, tc := range []struct {
		name       string
		retryAfter time.Duration
		streak     int
		rnd        float64
		want       time.Duration
	}{
		{"first 429 waits Retry-After", 2 * s, 1, none, 2 * s},
		{"second ×2", 2 * s, 2, none, 4 * s},
		{"third ×4", 2 * s, 3, none, 8 * s},
		{"fourth ×8", 2 * s, 4, none, 16 * s},
		{"fifth ×16", 2 * s, 5, none, 32 * s},
		{"capped at 60s", 10 * s, 4, none, 60 * s},
		{"cap with +20%", 10 * s, 5, high, 72 * s},
		{"cap with -20%", 10 * s, 5, low, 48 * s},
		{"+20% jitter", 2 * s, 2, high, 4800 * time.Millisecond},
		{"-20% jitter", 2 * s, 2, low, 3200 * time.Millisecond},
		{"never below Retry-After", 2 * s, 1, low, 2 * s},
		{"no Retry-After: 1s", 0, 1, none, s},
		{"503 (streak 0) waits Retry-After", 3 * s, 0, none, 3 * s},
		{"Retry-After over the cap is honoured", 90 * s, 3, none, 90 * s},
		{"a long streak stays capped", s, 40, none, 60 * s},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := p.delay(tc.retryAfter, tc.streak, func() float64 { return tc.rnd })
			if d := got - tc.want; d < -time.Millisecond || d > time.Millisecond {
				t.Fatalf("delay(%v, %d, %v) = %v, want %v", tc.retryAfter, tc.streak, tc.rnd, got, tc.want)
			}
		})
	}
}

// throttling answers 429 (or status) with Retry-After seconds for the
// first n requests, then 202.
type throttling struct {
	n, status, retryAfter int
	calls                 atomic.Int32
	mu                    sync.Mutex
	keys                  []string
}

func (th *throttling) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	i := int(th.calls.Add(1))
	th.mu.Lock()
	th.keys = append(th.keys, r.Header.Get("Idempotency-Key"))
	th.mu.Unlock()
	if i <= th.n {
		w.Header().Set("Retry-After", strconv.Itoa(th.retryAfter))
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(th.status)
		_ = json.NewEncoder(w).Encode(api.Problem{Type: "urn:throttler:problem:backlog-full", Title: http.StatusText(th.status),
			Status: th.status, Field: "max_backlog", Lane: "demo", RetryAfterSeconds: int64(th.retryAfter)})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(api.Accepted{ID: r.Header.Get("Idempotency-Key"), Lane: "demo", State: api.StateQueued})
}

// recordSleep returns a sleep that records each wait and returns at once.
func recordSleep(waits *[]time.Duration) func(context.Context, time.Duration) error {
	return func(ctx context.Context, d time.Duration) error {
		*waits = append(*waits, d)
		return ctx.Err()
	}
}

// TestRetriesThenTypedError: consecutive 429s are waited out ×2, ×4, ×8
// (injected sleep, no jitter); after 5 retries the call fails with an
// *Error that carries the status, the problem and Retry-After. Every
// attempt sends the same Idempotency-Key.
func TestRetriesThenTypedError(t *testing.T) {
	th := &throttling{n: 100, status: 429, retryAfter: 2}
	srv := httptest.NewServer(th)
	defer srv.Close()
	var waits []time.Duration
	c, err := New(srv.URL, WithSleep(recordSleep(&waits)), WithJitterSource(func() float64 { return 0.5 }))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Submit(context.Background(), "demo", []byte("x"), nil)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err %v (%T), want *Error", err, err)
	}
	if e.StatusCode != 429 || e.Problem == nil || e.Problem.Field != "max_backlog" || e.RetryAfter != 2*time.Second || e.Attempts != 6 {
		t.Fatalf("error %+v, problem %+v", e, e.Problem)
	}
	if !errors.Is(err, ErrThrottled) || errors.Is(err, ErrNotFound) {
		t.Fatalf("errors.Is: throttled %v, not found %v", errors.Is(err, ErrThrottled), errors.Is(err, ErrNotFound))
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second}
	if len(waits) != len(want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}
	for i := range want {
		if waits[i] != want[i] {
			t.Fatalf("waits %v, want %v", waits, want)
		}
	}
	if got := th.calls.Load(); got != 6 {
		t.Fatalf("%d requests, want 6", got)
	}
	for _, k := range th.keys {
		if k == "" || k != th.keys[0] {
			t.Fatalf("idempotency keys of the attempts differ: %q", th.keys)
		}
	}
}

// TestRetryThenSuccess: a 503 then a 429 then a 202; the 503 waits its
// Retry-After, and the 429 after it is the first of a streak.
func TestRetryThenSuccess(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   []time.Duration
	}{
		{503, []time.Duration{3 * time.Second, 3 * time.Second}},
		{429, []time.Duration{3 * time.Second, 6 * time.Second}},
	} {
		th := &throttling{n: 2, status: tc.status, retryAfter: 3}
		srv := httptest.NewServer(th)
		var waits []time.Duration
		c, _ := New(srv.URL, WithSleep(recordSleep(&waits)), WithJitterSource(func() float64 { return 0.5 }))
		a, err := c.Submit(context.Background(), "demo", nil, &SubmitOptions{IdempotencyKey: "k-1"})
		srv.Close()
		if err != nil || a.ID != "k-1" {
			t.Fatalf("%d: %+v %v", tc.status, a, err)
		}
		if len(waits) != 2 || waits[0] != tc.want[0] || waits[1] != tc.want[1] {
			t.Fatalf("%d: waits %v, want %v", tc.status, waits, tc.want)
		}
	}
}

// TestNoWaitPastMaxRetryAfter: an answer asking for longer than
// MaxRetryAfter is returned at once; MaxRetries -1 retries nothing.
func TestNoWaitPastMaxRetryAfter(t *testing.T) {
	th := &throttling{n: 100, status: 429, retryAfter: 3600}
	srv := httptest.NewServer(th)
	defer srv.Close()
	var waits []time.Duration
	c, _ := New(srv.URL, WithSleep(recordSleep(&waits)))
	_, err := c.Submit(context.Background(), "demo", nil, nil)
	var e *Error
	if !errors.As(err, &e) || e.RetryAfter != time.Hour || e.Attempts != 1 || len(waits) != 0 {
		t.Fatalf("err %v, waits %v", err, waits)
	}
	th2 := &throttling{n: 100, status: 503, retryAfter: 1}
	srv2 := httptest.NewServer(th2)
	defer srv2.Close()
	c2, _ := New(srv2.URL, WithSleep(recordSleep(&waits)), WithRetry(RetryPolicy{MaxRetries: -1}))
	if _, err := c2.Submit(context.Background(), "demo", nil, nil); !errors.Is(err, ErrThrottled) || th2.calls.Load() != 1 {
		t.Fatalf("MaxRetries -1: %v after %d calls", err, th2.calls.Load())
	}
}

// TestCancelledWaitReturns: a context that ends during the wait ends the
// call with the context's error and the last answer.
func TestCancelledWaitReturns(t *testing.T) {
	th := &throttling{n: 100, status: 429, retryAfter: 30}
	srv := httptest.NewServer(th)
	defer srv.Close()
	c, _ := New(srv.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Submit(ctx, "demo", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrThrottled) {
		t.Fatalf("err %v", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("returned after %v", el)
	}
}

// TestRequestHeaders: what a submission puts on the wire.
func TestRequestHeaders(t *testing.T) {
	var got http.Header
	var path string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, path = r.Header.Clone(), r.URL.EscapedPath()
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"id":"a","lane":"x","state":"queued","eta_ms":5}`))
	}))
	defer srv.Close()
	c, _ := New(srv.URL+"/", WithAPIKey("s3cret"))
	_, err := c.Submit(context.Background(), "we/ird lane", []byte(`{}`), &SubmitOptions{IdempotencyKey: "order-7", Key: "customer-9", ContentType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"Idempotency-Key": "order-7", "Throttle-Key": "customer-9", "Authorization": "Bearer s3cret", "Content-Type": "application/json"} {
		if got.Get(k) != v {
			t.Errorf("%s: %q, want %q", k, got.Get(k), v)
		}
	}
	if path != "/v1/lanes/we%2Fird%20lane/jobs" {
		t.Errorf("path %q", path)
	}
	if _, err := New("127.0.0.1:8080"); err == nil {
		t.Error("a server without scheme was accepted")
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"":                              0,
		"5":                             5 * time.Second,
		"0.5":                           500 * time.Millisecond,
		"-3":                            0,
		"soon":                          0,
		"Thu, 01 Jan 2026 00:00:10 GMT": 10 * time.Second,
		"Wed, 31 Dec 2025 23:00:00 GMT": 0,
	} {
		if got := parseRetryAfter(in, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}
