package ingest

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/queue"
)

// fakeScheduler records the delayed jobs it is given.
type fakeScheduler struct {
	mu   sync.Mutex
	jobs []queue.Job
}

func (s *fakeScheduler) Schedule(_ context.Context, job queue.Job) (queue.PubResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jobs = append(s.jobs, job)
	return queue.PubResult{Seq: uint64(len(s.jobs))}, nil
}

func (s *fakeScheduler) stored() []queue.Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]queue.Job(nil), s.jobs...)
}

// postJob submits one job to lane demo with hdr.
func postJob(t *testing.T, f *fixture, hdr map[string]string) (*httptest.ResponseRecorder, api.Accepted, api.Problem) {
	t.Helper()
	req := httptest.NewRequest("POST", "/v1/lanes/demo/jobs", strings.NewReader(`{"n":1}`))
	req.RemoteAddr = "127.0.0.1:5555"
	req.Host = "localhost:8080"
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, req)
	var a api.Accepted
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

// TestScheduleHeadersRefused: a delay, not-before or expiry that cannot be
// used is a 400 problem naming its header, and nothing is stored, neither
// delayed nor queued.
func TestScheduleHeadersRefused(t *testing.T) {
	sched := &fakeScheduler{}
	f := newFixture(t, func(c *Config) { c.Scheduler = sched })
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		name  string
		hdr   map[string]string
		field string
	}{
		{"DelayNotDuration", map[string]string{"Throttle-Delay": "soon"}, "Throttle-Delay"},
		{"DelayNegative", map[string]string{"Throttle-Delay": "-1s"}, "Throttle-Delay"},
		{"DelayOverMax", map[string]string{"Throttle-Delay": "721h"}, "Throttle-Delay"},
		{"NotBeforeNotRFC3339", map[string]string{"Throttle-Not-Before": "tomorrow"}, "Throttle-Not-Before"},
		{"NotBeforeOverMax", map[string]string{"Throttle-Not-Before": time.Now().Add(31 * 24 * time.Hour).UTC().Format(time.RFC3339)}, "Throttle-Not-Before"},
		{"Both", map[string]string{"Throttle-Delay": "1s", "Throttle-Not-Before": future}, "Throttle-Not-Before"},
		{"ExpiresPast", map[string]string{"Throttle-Expires": "2020-01-01T00:00:00Z"}, "Throttle-Expires"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, _, p := postJob(t, f, tc.hdr)
			if rec.Code != 400 || p.Field != tc.field || p.Type != ProblemBadHeader {
				t.Fatalf("status %d field %q type %q (%s), want 400 on %s", rec.Code, p.Field, p.Type, p.Detail, tc.field)
			}
		})
	}
	if n := len(sched.stored()); n != 0 || f.pub.n.Load() != 0 {
		t.Fatalf("%d delayed and %d queued jobs stored by refused requests", n, f.pub.n.Load())
	}
}

// TestDelayedJobAnsweredScheduled: a delayed submission is stored through
// the scheduler, not the queue, and answered 202 "scheduled" with the
// delay as its eta_ms; a job with an expiry only is queued with it.
func TestDelayedJobAnsweredScheduled(t *testing.T) {
	sched := &fakeScheduler{}
	f := newFixture(t, func(c *Config) { c.Scheduler = sched })
	before := time.Now()
	expires := before.Add(time.Hour).UTC().Truncate(time.Second)
	rec, a, _ := postJob(t, f, map[string]string{"Throttle-Delay": "90s", "Throttle-Expires": expires.Format(time.RFC3339), "Idempotency-Key": "d-1"})
	if rec.Code != 202 || a.State != api.StateScheduled || a.ID != "d-1" {
		t.Fatalf("status %d answer %+v", rec.Code, a)
	}
	if a.ETAMillis < 89_000 || a.ETAMillis > 90_000 {
		t.Fatalf("eta_ms %d, want the delay of 90 s", a.ETAMillis)
	}
	got := sched.stored()
	if len(got) != 1 || f.pub.n.Load() != 0 {
		t.Fatalf("%d delayed and %d queued jobs stored", len(got), f.pub.n.Load())
	}
	if j := got[0]; j.NotBefore.Before(before.Add(90*time.Second)) || j.NotBefore.After(time.Now().Add(90*time.Second)) || !j.Expires.Equal(expires) {
		t.Fatalf("stored not-before %v expires %v", j.NotBefore, j.Expires)
	}
	// A not-before in the past is now: queued as usual.
	rec, a, _ = postJob(t, f, map[string]string{"Throttle-Not-Before": "2020-01-01T00:00:00Z"})
	if rec.Code != 202 || a.State == api.StateScheduled || len(sched.stored()) != 1 || f.pub.n.Load() != 1 {
		t.Fatalf("past not-before: status %d answer %+v", rec.Code, a)
	}
}

// TestBatchSchedule: batch items carry delay, not_before and expires; a bad
// one refuses the batch with its JSON pointer and nothing is stored; good
// ones are answered "scheduled" beside the queued ones.
func TestBatchSchedule(t *testing.T) {
	sched := &fakeScheduler{}
	f := newFixture(t, func(c *Config) { c.Scheduler = sched })
	rec, _, p := postBatch(t, f, "demo", `[{"payload":1},{"payload":2,"delay":"soon"}]`, nil)
	if rec.Code != 400 || p.Field != "/1/delay" {
		t.Fatalf("status %d field %q (%s), want 400 on /1/delay", rec.Code, p.Field, p.Detail)
	}
	rec, _, p = postBatch(t, f, "demo", `[{"payload":1,"expires":"2020-01-01T00:00:00Z"}]`, nil)
	if rec.Code != 400 || p.Field != "/0/expires" {
		t.Fatalf("status %d field %q (%s), want 400 on /0/expires", rec.Code, p.Field, p.Detail)
	}
	if len(sched.stored()) != 0 || f.pub.n.Load() != 0 {
		t.Fatal("a refused batch stored jobs")
	}
	exp := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	rec, a, _ := postBatch(t, f, "demo", `[{"payload":1,"expires":"`+exp+`"},{"payload":2,"delay":"10s"},{"payload":3,"not_before":"`+
		time.Now().Add(20*time.Second).UTC().Format(time.RFC3339Nano)+`"}]`, nil)
	if rec.Code != 202 || len(a.Results) != 3 {
		t.Fatalf("status %d %+v", rec.Code, a)
	}
	if a.Results[0].State == api.StateScheduled || a.Results[1].State != api.StateScheduled || a.Results[2].State != api.StateScheduled {
		t.Fatalf("states %+v", a.Results)
	}
	if e := a.Results[1].ETAMillis; e < 9_000 || e > 10_000 {
		t.Fatalf("item 1 eta_ms %d, want its delay of 10 s", e)
	}
	if len(sched.stored()) != 2 || len(f.pub.batched) != 1 || f.pub.batched[0].Expires.IsZero() {
		t.Fatalf("%d delayed, %d queued (expires %v)", len(sched.stored()), len(f.pub.batched), f.pub.batched)
	}
}
