package ingest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
)

func postBatch(t *testing.T, f *fixture, lane, body string, hdr map[string]string) (*httptest.ResponseRecorder, api.BatchAccepted, api.Problem) {
	t.Helper()
	req := httptest.NewRequest("POST", "/v1/lanes/"+lane+"/jobs:batch", strings.NewReader(body))
	req.RemoteAddr = "127.0.0.1:5555"
	req.Host = "localhost:8080"
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	var a api.BatchAccepted
	var p api.Problem
	if rec.Code >= 400 {
		if ct := rec.Header().Get("Content-Type"); ct != problemContentType {
			t.Fatalf("status %d with Content-Type %q: %s", rec.Code, ct, rec.Body)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("problem %s: %v", rec.Body, err)
		}
	} else if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
		t.Fatalf("answer %s: %v", rec.Body, err)
	}
	return rec, a, p
}

// TestBatchBadInputStoresNothing: any bad item refuses the whole batch with
// one problem whose field is a JSON pointer to it, and nothing is stored.
func TestBatchBadInputStoresNothing(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxBatchItems = 3; c.MaxBatchBytes = 600 })
	f.dir.maxBody = 8
	ok := `{"idempotency_key":"a","payload":{"n":1}}`
	for _, tc := range []struct {
		name, lane, body string
		hdr              map[string]string
		status           int
		field            string
	}{
		{"UnknownLane", "nope", `[` + ok + `]`, nil, 404, "lane"},
		{"NotJSONType", "demo", `[` + ok + `]`, map[string]string{"Content-Type": "text/plain"}, 415, "Content-Type"},
		{"NotAnArray", "demo", ok, nil, 400, "body"},
		{"Empty", "demo", `[]`, nil, 400, "body"},
		{"Unclosed", "demo", `[` + ok, nil, 400, "body"},
		{"Trailing", "demo", `[` + ok + `] x`, nil, 400, "body"},
		{"NotAnObject", "demo", `[` + ok + `, 3]`, nil, 400, "/1"},
		{"BadKey", "demo", `[` + ok + `,` + ok + `,` + ok + `,{"idempotency_key":"has space","payload":1}]`, nil, 413, "/3"},
		{"BadKeyInRange", "demo", `[` + ok + `,{"idempotency_key":"has space","payload":1}]`, nil, 400, "/1/idempotency_key"},
		{"NoPayload", "demo", `[{"idempotency_key":"b"}]`, nil, 400, "/0/payload"},
		{"BothPayloads", "demo", `[{"payload":1,"payload_base64":"eA=="}]`, nil, 400, "/0/payload_base64"},
		{"BadBase64", "demo", `[` + ok + `,{"payload_base64":"!!"}]`, nil, 400, "/1/payload_base64"},
		{"PayloadTooLarge", "demo", `[{"payload":"0123456789"}]`, nil, 413, "/0/payload"},
		{"UnknownField", "demo", `[{"payload":1,"paylod":2}]`, nil, 400, "/0/paylod"},
		{"WrongType", "demo", `[{"payload":1,"idempotency_key":5}]`, nil, 400, "/0/idempotency_key"},
		{"BadThrottleKey", "demo", `[{"payload":1,"throttle_key":"a.*"}]`, nil, 400, "/0/throttle_key"},
		{"BadContentType", "demo", `[{"payload":1,"content_type":"a\u0001"}]`, nil, 400, "/0/content_type"},
		{"TooManyBytes", "demo", `[` + strings.Repeat(" ", 600) + ok + `]`, nil, 413, "body"},
	} {
		rec, _, p := postBatch(t, f, tc.lane, tc.body, tc.hdr)
		if rec.Code != tc.status || p.Status != tc.status || p.Field != tc.field || p.Detail == "" || p.Type == "" {
			t.Errorf("%s: %d %+v, want %d naming %q", tc.name, rec.Code, p, tc.status, tc.field)
		}
	}
	if n := f.pub.n.Load(); n != 0 {
		t.Fatalf("refused batches stored %d jobs", n)
	}
}

// TestBatchAnswersEachItem: one result per item in order; a job the queue
// refuses gets its own problem and the others are stored; a repeated id is
// answered as a duplicate of its first item and published once; a
// non-JSON payload travels as base64 with its media type.
func TestBatchAnswersEachItem(t *testing.T) {
	f := newFixture(t, nil)
	body := `[
		{"idempotency_key":"a","payload":{"n":1}},
		{"idempotency_key":"full-1","payload":2},
		{"idempotency_key":"a","payload":{"n":"again"}},
		{"payload_base64":"AAEC/w==","content_type":"image/png","throttle_key":"cust-1"},
		{"idempotency_key":"b","payload":null}
	]`
	rec, a, _ := postBatch(t, f, "demo", body, nil)
	if rec.Code != http.StatusMultiStatus {
		t.Fatalf("status %d, want 207: %s", rec.Code, rec.Body)
	}
	if a.Lane != "demo" || a.Accepted != 4 || a.Failed != 1 || len(a.Results) != 5 {
		t.Fatalf("answer %+v", a)
	}
	r := a.Results
	if r[0].Status != 202 || r[0].ID != "a" || r[0].State != api.StateQueued || r[0].Duplicate {
		t.Errorf("item 0: %+v", r[0])
	}
	if r[1].Status != 429 || r[1].ID != "full-1" || r[1].Problem == nil || r[1].Problem.Field != "max_backlog" || r[1].Problem.Type != ProblemBacklogFull {
		t.Errorf("item 1: %+v", r[1])
	}
	if r[2].Status != 202 || r[2].ID != "a" || !r[2].Duplicate || r[2].State != r[0].State {
		t.Errorf("item 2: %+v, want a duplicate of item 0", r[2])
	}
	if r[3].Status != 202 || r[3].ID == "" || r[4].Status != 202 || r[4].ID != "b" {
		t.Errorf("items 3, 4: %+v %+v", r[3], r[4])
	}
	f.pub.mu.Lock()
	batched := append([]queue.Job(nil), f.pub.batched...)
	f.pub.mu.Unlock()
	if len(batched) != 3 {
		t.Fatalf("stored %d jobs, want 3 (a, the base64 one, b)", len(batched))
	}
	j0, j1, j2 := batched[0], batched[1], batched[2]
	if j0.ID != "a" || string(j0.Payload) != `{"n":1}` || j0.ContentType != "application/json" {
		t.Errorf("job a: %+v", j0)
	}
	if string(j1.Payload) != "\x00\x01\x02\xff" || j1.ContentType != "image/png" || j1.Key != "" {
		t.Errorf("base64 job: %+v (a lane without keys ignores throttle_key, as it ignores the header)", j1)
	}
	if j2.ID != "b" || string(j2.Payload) != "null" {
		t.Errorf("job b: %+v", j2)
	}
	if rec.Header().Get("X-RateLimit-Limit") == "" {
		t.Errorf("no rate-limit headers: %v", rec.Header())
	}
	// All stored: 202.
	rec, a, _ = postBatch(t, f, "demo", `[{"payload":1},{"payload":2}]`, nil)
	if rec.Code != http.StatusAccepted || a.Accepted != 2 || a.Failed != 0 {
		t.Fatalf("clean batch: %d %+v", rec.Code, a)
	}
}
