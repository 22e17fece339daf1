package service_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/testenv"
)

// TestRecordsOfDelayedAndExpiringJobs: on a lane that keeps results, a
// delayed job has a record at once (scheduled) and then delivered; a
// delayed job cancelled while it waits is never delivered when it comes
// due; a job not started by its expiry is recorded expired, never
// delivered; a resubmission of a delayed job's Idempotency-Key answers the
// first job.
func TestRecordsOfDelayedAndExpiringJobs(t *testing.T) {
	t.Parallel()
	svc, calls := startRecords(t)
	base := "http://" + svc.Addr() + "/v1/lanes/demo/jobs"

	submit := func(id string, header, value string) api.Accepted {
		t.Helper()
		req, _ := http.NewRequest("POST", base, nil)
		req.Header.Set("Content-Type", "text/plain")
		req.Header.Set("Idempotency-Key", id)
		req.Header.Set(header, value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var acc api.Accepted
		if err := json.NewDecoder(resp.Body).Decode(&acc); err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submit %s: %d %v", id, resp.StatusCode, err)
		}
		return acc
	}
	if acc := submit("later", "Throttle-Delay", "2s"); acc.State != api.StateScheduled {
		t.Fatalf("delayed job answered %+v, want scheduled", acc)
	}
	if acc := submit("dropped", "Throttle-Delay", "2s"); acc.State != api.StateScheduled {
		t.Fatalf("delayed job answered %+v, want scheduled", acc)
	}
	// A witness due after the job cancelled below: once it is delivered,
	// the cancelled job has come due and been dropped.
	submit("witness", "Throttle-Delay", "2500ms")
	for _, id := range []string{"later", "dropped"} {
		if code, rec := getRecord(t, svc.Addr(), "demo", id); code != http.StatusOK || rec.State != api.StateScheduled {
			t.Fatalf("record of %s right after submission: %d %+v", id, code, rec)
		}
	}
	if acc := submit("later", "Throttle-Delay", "1s"); !acc.Duplicate || acc.ID != "later" || acc.State != api.StateScheduled {
		t.Fatalf("resubmission of a delayed job: %+v, want the first one, duplicate", acc)
	}
	c := callJob(t, "DELETE", base+"/dropped", "", "")
	var rec api.JobRecord
	if err := json.Unmarshal(c.body, &rec); err != nil || c.code != http.StatusOK || rec.State != api.StateCancelled {
		t.Fatalf("cancel of a scheduled job: %d %q", c.code, c.body)
	}
	// Expires before the lane can start it: the lane is held.
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo", `{"paused":true}`, nil); code != http.StatusOK {
		t.Fatalf("pause: %d", code)
	}
	expires := time.Now().Add(time.Second)
	if acc := submit("stale", "Throttle-Expires", expires.UTC().Format(time.RFC3339Nano)); acc.State != api.StateQueued {
		t.Fatalf("expiring job answered %+v, want queued", acc)
	}
	time.Sleep(time.Until(expires)) // the property is the expiry's time passing
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo", `{"paused":false}`, nil); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	testenv.Eventually(t, 20*time.Second, "the delayed job delivered and the stale one expired", func() bool {
		_, later := getRecord(t, svc.Addr(), "demo", "later")
		_, stale := getRecord(t, svc.Addr(), "demo", "stale")
		return later.State == api.StateDelivered && stale.State == api.StateExpired
	})
	testenv.Eventually(t, 20*time.Second, "the witness delivered", func() bool {
		_, w := getRecord(t, svc.Addr(), "demo", "witness")
		return w.State == api.StateDelivered
	})
	if _, rec := getRecord(t, svc.Addr(), "demo", "dropped"); rec.State != api.StateCancelled || len(rec.Attempts) != 0 {
		t.Fatalf("the cancelled delayed job: %+v", rec)
	}
	if _, rec := getRecord(t, svc.Addr(), "demo", "stale"); rec.FinishedAt == nil || len(rec.Attempts) != 0 || rec.Reason != "expired" {
		t.Fatalf("the expired job's record: %+v", rec)
	}
	if got := calls.Load(); got != 2 {
		t.Fatalf("target called %d times, want 2 (the delayed job and the witness; never the cancelled or the expired one)", got)
	}
}

// TestWaitedDelayedJob: a delayed submission with ?wait= is held as an
// immediate one is: until its job, once due, is delivered (200 with the
// target's answer and the Throttle-* headers), with Throttle-Delay or
// Throttle-Not-Before, with or without an Idempotency-Key. A wait shorter
// than the delay runs out: 202, Location, state scheduled.
func TestWaitedDelayedJob(t *testing.T) {
	t.Parallel()
	svc, calls := startRecords(t)
	base := "http://" + svc.Addr() + "/v1/lanes/demo/jobs"

	for _, tt := range []struct {
		name    string
		headers func() []string
	}{
		{"Throttle-Delay with an Idempotency-Key", func() []string { return []string{"Throttle-Delay", "1s", "Idempotency-Key", "waited"} }},
		{"Throttle-Not-Before without one", func() []string {
			return []string{"Throttle-Not-Before", time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)}
		}},
	} {
		start := time.Now()
		c := asKey(t, "", "POST", base+"?wait=15s", "hello", tt.headers()...)
		took := time.Since(start)
		if c.code != http.StatusOK || string(c.body) != `{"echo":"hello"}` || c.header.Get("Throttle-Target-Status") != "201" ||
			c.header.Get("Throttle-Job-State") != string(api.StateDelivered) || c.header.Get("Throttle-Job-Id") == "" {
			t.Fatalf("%s: waited delayed job answered %d %v %q after %v; want 200 with the target's answer", tt.name, c.code, c.header, c.body, took)
		}
		if took < 900*time.Millisecond {
			t.Fatalf("%s: answered after %v, before the job was due", tt.name, took)
		}
		if code, rec := getRecord(t, svc.Addr(), "demo", c.header.Get("Throttle-Job-Id")); code != http.StatusOK || rec.State != api.StateDelivered {
			t.Fatalf("%s: record %d %+v", tt.name, code, rec)
		}
	}

	start := time.Now()
	c := asKey(t, "", "POST", base+"?wait=500ms", "short", "Throttle-Delay", "3s", "Idempotency-Key", "short")
	var acc api.Accepted
	if err := json.Unmarshal(c.body, &acc); err != nil || c.code != http.StatusAccepted || acc.State != api.StateScheduled ||
		c.header.Get("Location") != "/v1/lanes/demo/jobs/short" {
		t.Fatalf("a wait shorter than the delay: %d %v %q", c.code, c.header, c.body)
	}
	if took := time.Since(start); took < 450*time.Millisecond || acc.ETAMillis > 2600 {
		t.Fatalf("a wait shorter than the delay answered after %v, eta %dms: the wait was not honoured", took, acc.ETAMillis)
	}
	testenv.Eventually(t, 20*time.Second, "the short wait's job delivered", func() bool {
		_, rec := getRecord(t, svc.Addr(), "demo", "short")
		return rec.State == api.StateDelivered
	})
	if got := calls.Load(); got != 3 {
		t.Fatalf("target called %d times, want 3", got)
	}
}

// TestWaitRunsOut: a waited submission whose wait runs out answers 202
// with what holds when it answers, not at intake: a job in flight says
// in_flight (not admitted), and a queued job's eta_ms is the wait left,
// the time the request was held taken off.
func TestWaitRunsOut(t *testing.T) {
	t.Parallel()
	svc, _ := startRecords(t)
	base := "http://" + svc.Addr() + "/v1/lanes/demo/jobs"
	accepted := func(c jobCall) api.Accepted {
		t.Helper()
		var acc api.Accepted
		if err := json.Unmarshal(c.body, &acc); err != nil || c.code != http.StatusAccepted {
			t.Fatalf("want 202 with the job, got %d %q", c.code, c.body)
		}
		return acc
	}

	// The target takes 1.5 s to answer: the wait runs out while the
	// attempt runs.
	if acc := accepted(callJob(t, "POST", base+"?wait=700ms", "slow", "slow")); acc.State != api.StateInFlight || acc.ETAMillis != 0 {
		t.Fatalf("a wait that ran out during the attempt answered %+v, want in_flight with eta 0", acc)
	}

	// One start every 2.5 s: the burst's job goes at once, the next waits
	// about 2.5 s, of which the request is held for 1 s.
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo", `{"rate":0.4,"burst":1}`, nil); code != http.StatusOK {
		t.Fatalf("PATCH rate: %d", code)
	}
	accepted(callJob(t, "POST", base, "first", "first"))
	c := callJob(t, "POST", base+"?wait=1s", "second", "second")
	answered := time.Now()
	acc := accepted(c)
	if acc.State != api.StateQueued {
		t.Fatalf("a queued job's wait ran out: %+v, want queued", acc)
	}
	var rec api.JobRecord
	testenv.Eventually(t, 20*time.Second, "the waited job started", func() bool {
		_, rec = getRecord(t, svc.Addr(), "demo", "second")
		return rec.StartedAt != nil
	})
	predicted := answered.Add(time.Duration(acc.ETAMillis) * time.Millisecond)
	if off := rec.StartedAt.Sub(predicted); off.Abs() > 500*time.Millisecond {
		t.Fatalf("eta_ms %d said the job starts at %v; it started at %v (%v off): the eta did not count the time held",
			acc.ETAMillis, predicted.Format(time.RFC3339Nano), rec.StartedAt.Format(time.RFC3339Nano), off)
	}
}
