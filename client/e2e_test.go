package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/client"
)

func start(t *testing.T, opts serverOptions) *server {
	t.Helper()
	s, err := startServer(opts, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

func newClient(t *testing.T, url string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// eventually polls cond every 20 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgainstServer drives every call of the client against a running
// throttler: submissions, duplicates, lanes, limits, dead letters, and the
// typed errors of refusals.
func TestAgainstServer(t *testing.T) {
	t.Parallel()
	s := start(t, serverOptions{})
	c := newClient(t, s.URL)
	ctx := context.Background()

	a, err := c.Submit(ctx, "demo", []byte(`{"order":1}`), &client.SubmitOptions{IdempotencyKey: "order-1", ContentType: "application/json"})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != "order-1" || a.Lane != "demo" || (a.State != api.StateAdmitted && a.State != api.StateQueued) || a.Duplicate {
		t.Fatalf("first submission: %+v", a)
	}
	again, err := c.Submit(ctx, "demo", []byte(`{"order":1}`), &client.SubmitOptions{IdempotencyKey: "order-1"})
	if err != nil || !again.Duplicate || again.ID != "order-1" {
		t.Fatalf("second submission: %+v %v", again, err)
	}
	auto, err := c.Submit(ctx, "demo", nil, nil)
	if err != nil || len(auto.ID) < 16 {
		t.Fatalf("submission without a key: %+v %v", auto, err)
	}
	eventually(t, 10*time.Second, "2 deliveries", func() bool { return s.delivered.Load() == 2 })

	// Refusals are typed: status, problem naming the field, sentinel.
	_, err = c.Submit(ctx, "nope", nil, nil)
	var e *client.Error
	if !errors.As(err, &e) || e.StatusCode != 404 || e.Problem == nil || e.Problem.Type != "urn:throttler:problem:unknown-lane" ||
		e.Problem.Field != "lane" || !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("unknown lane: %v", err)
	}
	_, err = c.Submit(ctx, "demo", nil, &client.SubmitOptions{IdempotencyKey: "has space"})
	if !errors.As(err, &e) || e.StatusCode != 400 || e.Problem.Field != "Idempotency-Key" || !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("bad idempotency key: %v", err)
	}

	var lanes []api.LaneStatus
	eventually(t, 10*time.Second, "2 delivered in GET /v1/lanes", func() bool {
		lanes, err = c.Lanes(ctx)
		return err == nil && len(lanes) == 3 && lanes[0].Delivered == 2
	})
	if lanes[0].Name != "demo" || lanes[0].Rate != 50 || lanes[0].Burst != 10 || lanes[1].Name != "failing" {
		t.Fatalf("lanes: %+v", lanes)
	}
	burst := 20
	st, err := c.SetLane(ctx, "demo", client.LaneChange{Rate: "120/min", Burst: &burst})
	if err != nil || st.Rate != 2 || st.Burst != 20 {
		t.Fatalf("set lane: %+v %v", st, err)
	}
	if st, err = c.SetLane(ctx, "demo", client.LaneChange{Rate: "0.5"}); err != nil || st.Rate != 0.5 || st.Burst != 20 {
		t.Fatalf("set a numeric rate: %+v %v", st, err)
	}
	_, err = c.SetLane(ctx, "demo", client.LaneChange{Rate: "fast"})
	if !errors.As(err, &e) || e.StatusCode != 400 || e.Problem.Field != "rate" {
		t.Fatalf("bad rate: %v", err)
	}

	// Dead letters: the failing lane's target refuses every job for good.
	for i := range 5 {
		if _, err := c.Submit(ctx, "failing", fmt.Appendf(nil, `{"n":%d}`, i), &client.SubmitOptions{IdempotencyKey: fmt.Sprintf("f-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var dead *api.DeadLetters
	eventually(t, 20*time.Second, "5 dead letters", func() bool {
		dead, err = c.ListDead(ctx, "failing", 0, 0)
		return err == nil && len(dead.Dead) == 5
	})
	page, err := c.ListDead(ctx, "failing", 0, 2)
	if err != nil || len(page.Dead) != 2 || page.NextAfter != page.Dead[1].Seq {
		t.Fatalf("first page: %+v %v", page, err)
	}
	if page, err = c.ListDead(ctx, "failing", page.NextAfter, 2); err != nil || len(page.Dead) != 2 || page.Dead[0].Seq != dead.Dead[2].Seq {
		t.Fatalf("second page: %+v %v", page, err)
	}
	one, err := c.GetDead(ctx, "failing", dead.Dead[0].Seq)
	// Jobs die in the order their deliveries end; each keeps its id and payload.
	var n int
	if err != nil || one.ID != dead.Dead[0].ID || fmt.Sprintf("f-%d", mustScan(t, one.ID, "f-%d", &n)) != one.ID ||
		string(one.Payload) != fmt.Sprintf(`{"n":%d}`, n) || one.LastStatus != 422 {
		t.Fatalf("one dead letter: %+v %v", one, err)
	}
	if _, err := c.GetDead(ctx, "failing", 999999); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("missing dead letter: %v", err)
	}
	id, err := c.ReplayDead(ctx, "failing", dead.Dead[0].Seq)
	if err != nil || id != one.ID {
		t.Fatalf("replay: %q %v", id, err)
	}
	if err := c.DeleteDead(ctx, "failing", dead.Dead[1].Seq); err != nil {
		t.Fatal(err)
	}
	// 3 left, plus the replayed one once it dies again: replay in chunks of 2.
	eventually(t, 20*time.Second, "the replayed job dead again", func() bool {
		d, err := c.ListDead(ctx, "failing", 0, 0)
		return err == nil && len(d.Dead) == 4
	})
	n1, err := c.ReplayAllDead(ctx, "failing", 2)
	if err != nil || n1 != 2 {
		t.Fatalf("replay 2: %d %v", n1, err)
	}
	eventually(t, 20*time.Second, "the 2 replayed jobs dead again", func() bool {
		d, err := c.ListDead(ctx, "failing", 0, 0)
		return err == nil && len(d.Dead) == 4
	})
	// All 4: the jobs that die again during the call are not replayed
	// again by it.
	n2, err := c.ReplayAllDead(ctx, "failing", 0)
	if err != nil || n2 != 4 {
		t.Fatalf("replay the rest: %d %v", n2, err)
	}
	eventually(t, 20*time.Second, "4 dead again", func() bool {
		d, err := c.ListDead(ctx, "failing", 0, 0)
		return err == nil && len(d.Dead) == 4
	})
	if err := c.PurgeDead(ctx, "failing"); err != nil {
		t.Fatal(err)
	}
	if d, err := c.ListDead(ctx, "failing", 0, 0); err != nil || len(d.Dead) != 0 {
		t.Fatalf("after purge: %+v %v", d, err)
	}
	if err := c.PurgeDead(ctx, "nope"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("purge of an unknown lane: %v", err)
	}
}

// TestWaitsOutAFullLane: a lane at its max_backlog answers 429 with
// Retry-After; the client waits at least that long (real clock) and the
// submission then succeeds.
func TestWaitsOutAFullLane(t *testing.T) {
	t.Parallel()
	s := start(t, serverOptions{slowBacklog: 2})
	ctx := context.Background()
	var waits []time.Duration
	c := newClient(t, s.URL, client.WithSleep(func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	// Fill the lane (2/s, burst 1, max_backlog 2), then submit through the
	// waiting client. The lane drains a job every 500 ms: on a loaded
	// machine it may have room again before the call, which is then
	// accepted at once and proves nothing; fill it again and retry (load
	// costs time, never the verdict).
	raw := newClient(t, s.URL, client.WithRetry(client.RetryPolicy{MaxRetries: -1}))
	var (
		a     *api.Accepted
		err   error
		el    time.Duration
		tries int
	)
	for len(waits) == 0 {
		if tries++; tries > 10 {
			t.Fatalf("accepted without a 429 in 10 tries (%+v); the lane drained before each call", a)
		}
		var full *client.Error
		for i := 0; full == nil; i++ {
			if i > 20 {
				t.Fatal("the slow lane never filled")
			}
			_, err := raw.Submit(ctx, "slow", nil, nil)
			if err != nil && !errors.As(err, &full) {
				t.Fatal(err)
			}
		}
		if full.StatusCode != 429 || full.RetryAfter < time.Second || full.Attempts != 1 || !errors.Is(full, client.ErrThrottled) {
			t.Fatalf("full lane: %+v", full)
		}
		start := time.Now()
		a, err = c.Submit(ctx, "slow", []byte(fmt.Sprintf("late-%d", tries)), nil)
		if err != nil {
			t.Fatalf("after waiting: %v (waits %v)", err, waits)
		}
		el = time.Since(start)
	}
	if waits[0] < time.Second {
		t.Fatalf("first wait %v, under the Retry-After of at least 1s", waits[0])
	}
	if el < waits[0] {
		t.Fatalf("the call took %v, less than its wait %v", el, waits[0])
	}
	t.Logf("accepted %s after %v (waits %v)", a.State, el.Round(time.Millisecond), waits)
}

// TestAPIKeys: the key goes in Authorization; no key, or a key without
// the scope, are typed errors.
func TestAPIKeys(t *testing.T) {
	t.Parallel()
	s := start(t, serverOptions{keys: map[string][]string{"ops": {"admin"}, "viewer": {"read"}}})
	ctx := context.Background()
	if _, err := newClient(t, s.URL).Lanes(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("no key: %v", err)
	}
	if _, err := newClient(t, s.URL, client.WithAPIKey("wrong")).Lanes(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("unknown key: %v", err)
	}
	viewer := newClient(t, s.URL, client.WithAPIKey("secret-viewer"))
	if _, err := viewer.Lanes(ctx); err != nil {
		t.Fatalf("read key: %v", err)
	}
	burst := 3
	var e *client.Error
	if _, err := viewer.SetLane(ctx, "demo", client.LaneChange{Burst: &burst}); !errors.As(err, &e) || e.StatusCode != 403 ||
		e.Problem.Field != "Authorization" || !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("read key changing a lane: %v", err)
	}
	ops := newClient(t, s.URL, client.WithAPIKey("secret-ops"))
	if st, err := ops.SetLane(ctx, "demo", client.LaneChange{Burst: &burst}); err != nil || st.Burst != 3 {
		t.Fatalf("admin key: %+v %v", st, err)
	}
	if _, err := ops.Submit(ctx, "demo", []byte("x"), nil); err != nil {
		t.Fatalf("admin submits: %v", err)
	}
}

// TestBatchAgainstServer submits a batch: one result per item, in order;
// a bad item refuses the whole batch with a problem naming it.
func TestBatchAgainstServer(t *testing.T) {
	t.Parallel()
	s := start(t, serverOptions{})
	c := newClient(t, s.URL)
	ctx := context.Background()
	res, err := c.SubmitBatch(ctx, "demo", []api.BatchItem{
		{IdempotencyKey: "b-1", Payload: json.RawMessage(`{"n":1}`)},
		{Payload: json.RawMessage(`"two"`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Results
	if len(r) != 2 || r[0].Status != 202 || r[0].ID != "b-1" || r[1].Status != 202 || len(r[1].ID) < 16 || res.Accepted != 2 || res.Failed != 0 {
		t.Fatalf("batch: %+v", res)
	}
	eventually(t, 10*time.Second, "2 deliveries", func() bool { return s.delivered.Load() == 2 })
	_, err = c.SubmitBatch(ctx, "demo", []api.BatchItem{{Payload: json.RawMessage(`1`)}, {IdempotencyKey: "has space", Payload: json.RawMessage(`2`)}})
	var e *client.Error
	if !errors.As(err, &e) || e.StatusCode != 400 || e.Problem.Field != "/1/idempotency_key" || !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("a batch with a bad item: %v", err)
	}
}

// TestDelayAgainstServer: SubmitOptions.Delay and Expires reach the server
// as Throttle-Delay and Throttle-Expires: the job is answered scheduled,
// with its delay as the estimated wait, and is delivered; a delay
// over the lane's max_delay is refused as invalid, naming the header.
func TestDelayAgainstServer(t *testing.T) {
	t.Parallel()
	s := start(t, serverOptions{})
	c := newClient(t, s.URL)
	ctx := context.Background()
	a, err := c.Submit(ctx, "demo", []byte("later"), &client.SubmitOptions{Delay: 1500 * time.Millisecond, Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if a.State != api.StateScheduled || a.ETAMillis < 1400 || a.ETAMillis > 1500 {
		t.Fatalf("answer %+v, want scheduled with eta_ms ≈ 1500", a)
	}
	// When it arrives is the service's tests' (TestDelayedJobSurvivesRestartAndStartsWhenDue).
	eventually(t, 10*time.Second, "the delayed job delivered", func() bool { return s.delivered.Load() == 1 })
	_, err = c.Submit(ctx, "demo", nil, &client.SubmitOptions{Delay: 24 * 366 * time.Hour})
	var e *client.Error
	if !errors.As(err, &e) || e.StatusCode != 400 || e.Problem.Field != "Throttle-Delay" || !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("a delay over max_delay: %v", err)
	}
}

// mustScan reads one number from s by format.
func mustScan(t *testing.T, s, format string, n *int) int {
	t.Helper()
	if _, err := fmt.Sscanf(s, format, n); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return *n
}
