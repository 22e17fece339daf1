package ingest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/api"

	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidKey(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"order-1", true},
		{strings.Repeat("k", 255), true},
		{strings.Repeat("k", 256), false},
		{"has space", false},
		{"tab\there", false},
		{"ünicode", false},
		// The shape of the ids the throttler makes (queue.SeqID) is
		// another caller's job; near misses are anyone's.
		{"n2DFr7os7Ga.1", false},
		{"n2DFr7os7Ga.18446744073709551615", false},
		{"n2DFr7os7Ga.0", true},
		{"n2DFr7os7Ga.01", true},
		{"n2DFr7os7G.1", true},
		{"n2DFr7os7Ga-1", true},
		{"n2DFr7os7Ga.1x", true},
		// "<lane>-<number>" is the id of a job published on the lane
		// without a Nats-Msg-Id; another lane's, or with a leading
		// zero, is anyone's.
		{"demo-17", false},
		{"demo-0", true},
		{"demo-017", true},
		{"other-17", true},
	} {
		if err := validKey("demo", tc.key); (err == nil) != tc.ok {
			t.Errorf("validKey(%q) = %v, want ok=%v", tc.key, err, tc.ok)
		}
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1001 * time.Millisecond, 2},
		{1000 * time.Second, 1000}, {100 * time.Hour, 24 * 3600},
	} {
		if got := retryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("retryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestRateHeaders(t *testing.T) {
	h := http.Header{}
	setRateHeaders(h, httptest.NewRequest("POST", "/", nil), "demo", admission.Decision{Limit: bucket.Limit{Rate: 20, Burst: 10}, Remaining: 3, Reset: 1500 * time.Millisecond})
	want := map[string]string{
		"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "2",
		"RateLimit-Policy": `"demo";q=20;w=1`, "RateLimit": `"demo";r=3;t=2`,
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}

func TestProblemBody(t *testing.T) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/v1/lanes/x/jobs", nil)
	writeProblem(rec, req, api.Problem{Type: ProblemBacklogFull, Status: 429, Field: "max_backlog"}, 2500*time.Millisecond)
	if rec.Code != 429 || rec.Header().Get("Content-Type") != "application/problem+json" || rec.Header().Get("Retry-After") != "3" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	body := rec.Body.String()
	for _, want := range []string{`"type":"urn:throttler:problem:backlog-full"`, `"title":"Too Many Requests"`, `"status":429`, `"field":"max_backlog"`, `"instance":"/v1/lanes/x/jobs"`, `"retry_after_seconds":3`} {
		if !strings.Contains(body, want) {
			t.Errorf("body %s lacks %s", body, want)
		}
	}
}

// TestAppendAccepted: the hand-written 202 body is byte for byte what
// encoding/json writes.
func TestAppendAccepted(t *testing.T) {
	for _, a := range []api.Accepted{
		{ID: "order-1", Lane: "demo", State: api.StateAdmitted},
		{ID: `a"b\c<d>&e`, Lane: "l_2", State: api.StateQueued, ETAMillis: 1234, Duplicate: true},
		{ID: "ctl\x01\n\t\r", Lane: "x", State: api.StateQueued, ETAMillis: -1},
		{ID: "ünï", Lane: "demo", State: api.StateQueued},
	} {
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(a); err != nil {
			t.Fatal(err)
		}
		if got := appendAccepted(nil, a); string(got) != want.String() {
			t.Errorf("appendAccepted(%+v) = %s, want %s", a, got, want.String())
		}
	}
}

func TestAppendBatchAccepted(t *testing.T) {
	prob := &api.Problem{Type: ProblemBacklogFull, Title: "Too Many Requests", Status: 429, Detail: `lane "x" <full> & more`,
		Instance: "/v1/lanes/x/jobs:batch", Field: "max_backlog", Lane: "x", RetryAfterSeconds: 3}
	for _, a := range []api.BatchAccepted{
		{Lane: "demo", Accepted: 2, Results: []api.BatchResult{
			{Status: 202, ID: "order-1", State: api.StateAdmitted},
			{Status: 202, ID: `a"b\c<d>&e`, State: api.StateQueued, ETAMillis: 1234, Duplicate: true},
		}},
		{Lane: "x", Accepted: 1, Failed: 2, Results: []api.BatchResult{
			{Status: 429, ID: "ctl\x01\n\t\r", Problem: prob},
			{Status: 202, ID: "ünï", State: api.StateQueued, ETAMillis: -1},
			{Status: 429, ID: "dup", Duplicate: true, Problem: prob},
		}},
		{Lane: "empty", Results: []api.BatchResult{}},
		{Lane: "nil"},
	} {
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(a); err != nil {
			t.Fatal(err)
		}
		if got := appendBatchAccepted(nil, a); string(got) != want.String() {
			t.Errorf("appendBatchAccepted(%+v) =\n%s, want\n%s", a, got, want.String())
		}
	}
}
