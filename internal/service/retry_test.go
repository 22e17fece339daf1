package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/throttler/throttler/api"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/testenv"
)

// scripted answers each request with the next status of its script (the
// last one repeats) and counts requests per job id.
type scripted struct {
	mu     sync.Mutex
	script []int
	hdr    map[int]http.Header
	n      int
	byID   map[string]int
	url    string
}

func newScripted(t *testing.T, script ...int) *scripted {
	s := &scripted{script: script, byID: map[string]int{}, hdr: map[int]http.Header{}}
	rec := newRecorder(t)
	rec.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		st := s.script[min(s.n, len(s.script)-1)]
		for k, v := range s.hdr[s.n] {
			w.Header()[k] = v
		}
		s.n++
		s.byID[r.Header.Get("Idempotency-Key")]++
		s.mu.Unlock()
		w.WriteHeader(st)
	})
	s.url = rec.srv.URL
	return s
}

func (s *scripted) set(script ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script, s.n = script, 0
}

func (s *scripted) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id]
}

func retryConfig(t *testing.T, url string, maxAttempts int) config.Config {
	cfg := testConfig(t, t.TempDir(), url, 100, 10)
	cfg.Lanes[0].Retry = config.Retry{MaxAttempts: maxAttempts, BackoffBase: config.Duration(20 * time.Millisecond), BackoffMax: config.Duration(100 * time.Millisecond)}
	return cfg
}

func deadList(t *testing.T, addr string) []api.DeadLetter {
	t.Helper()
	resp, err := pollClient.Get("http://" + addr + "/v1/lanes/demo/dead")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Dead []api.DeadLetter `json:"dead"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Dead
}

func TestRetriesThenDelivered(t *testing.T) {
	t.Parallel()
	tgt := newScripted(t, 500, 500, 500, 200)
	svc, _ := start(t, retryConfig(t, tgt.url, 5))
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	if code, _, _ := submit(t, client, svc.Addr(), "demo", "flaky-1", "x"); code != http.StatusAccepted {
		t.Fatalf("status %d", code)
	}
	// 3 failures, then 200.
	expectDelivered(t, svc.Addr(), tgt, "flaky-1", 4)
}

// expectDelivered waits until the lane delivered one job, then checks that
// the target saw id exactly requests times and that nothing was dead-lettered.
func expectDelivered(t *testing.T, addr string, tgt *scripted, id string, requests int) {
	t.Helper()
	waitFor(t, 10*time.Second, "the delivery of "+id, func() bool { return getLanes(t, addr).Lanes[0].Delivered == 1 })
	if n := tgt.count(id); n != requests {
		t.Fatalf("target saw %d requests for %s, want %d", n, id, requests)
	}
	if d := deadList(t, addr); len(d) != 0 {
		t.Fatalf("dead letters: %+v", d)
	}
}

func TestDeadLetterAndReplay(t *testing.T) {
	t.Parallel()
	tgt := newScripted(t, 500)
	svc, _ := start(t, retryConfig(t, tgt.url, 3))
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	submit(t, client, svc.Addr(), "demo", "doomed-1", "payload-1")
	var dead []api.DeadLetter
	waitFor(t, 10*time.Second, "a dead letter", func() bool {
		dead = deadList(t, svc.Addr())
		return len(dead) == 1
	})
	d := dead[0]
	if d.ID != "doomed-1" || d.Attempts != 3 || d.LastStatus != 500 || !strings.Contains(d.Reason, "3 attempts") || d.Size != len("payload-1") {
		t.Fatalf("dead letter %+v", d)
	}
	if n := tgt.count("doomed-1"); n != 3 {
		t.Fatalf("target saw %d attempts, want 3", n)
	}
	// Inspect it with its payload.
	resp, err := pollClient.Get(fmt.Sprintf("http://%s/v1/lanes/demo/dead/%d", svc.Addr(), d.Seq))
	if err != nil {
		t.Fatal(err)
	}
	var one api.DeadLetter
	json.NewDecoder(resp.Body).Decode(&one)
	resp.Body.Close()
	if string(one.Payload) != "payload-1" || one.ContentType != "text/plain" {
		t.Fatalf("inspected %+v", one)
	}
	// Fix the target, replay: delivered once, dead letter gone.
	tgt.set(200)
	resp, err = client.Post(fmt.Sprintf("http://%s/v1/lanes/demo/dead/%d/replay", svc.Addr(), d.Seq), "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("replay: %v %v", resp, err)
	}
	resp.Body.Close()
	waitFor(t, 5*time.Second, "the replayed job", func() bool { return tgt.count("doomed-1") == 4 })
	waitSettled(t, svc.Addr())
	if n := tgt.count("doomed-1"); n != 4 {
		t.Fatalf("replay delivered %d times", n-3)
	}
	if d := deadList(t, svc.Addr()); len(d) != 0 {
		t.Fatalf("dead letters after replay: %+v", d)
	}
	// Bad parameters are problems that name the field.
	for _, path := range []string{"/v1/lanes/demo/dead/abc", "/v1/lanes/demo/dead?limit=0"} {
		resp, _ := pollClient.Get("http://" + svc.Addr() + path)
		var p problem
		json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != 400 || p.Field == "" {
			t.Errorf("%s: %d %+v", path, resp.StatusCode, p)
		}
	}
}

func TestRejectedJobIsDeadAtOnceAndPurge(t *testing.T) {
	t.Parallel()
	tgt := newScripted(t, 404)
	svc, _ := start(t, retryConfig(t, tgt.url, 5))
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for i := 0; i < 3; i++ {
		submit(t, client, svc.Addr(), "demo", fmt.Sprintf("gone-%d", i), "x")
	}
	waitFor(t, 5*time.Second, "3 dead letters", func() bool { return len(deadList(t, svc.Addr())) == 3 })
	if d := deadList(t, svc.Addr())[0]; d.Attempts != 1 || d.LastStatus != 404 || d.Reason != "rejected by target" {
		t.Fatalf("dead letter %+v", d)
	}
	req, _ := http.NewRequest("DELETE", "http://"+svc.Addr()+"/v1/lanes/demo/dead", nil)
	resp, err := client.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("purge: %v %v", resp, err)
	}
	if d := deadList(t, svc.Addr()); len(d) != 0 {
		t.Fatalf("after purge: %+v", d)
	}
}

// TestRateLimitWaitsDoNotCountAsAttempts: with max_attempts 1, two 429s
// followed by a 200 still deliver the job.
func TestRateLimitWaitsDoNotCountAsAttempts(t *testing.T) {
	t.Parallel()
	tgt := newScripted(t, 429, 429, 200)
	tgt.hdr[0] = http.Header{"Retry-After": {"1"}}
	tgt.hdr[1] = http.Header{"Retry-After": {"1"}}
	svc, _ := start(t, retryConfig(t, tgt.url, 1))
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	submit(t, client, svc.Addr(), "demo", "limited-1", "x")
	expectDelivered(t, svc.Addr(), tgt, "limited-1", 3) // two 429s, then 200
}

func TestDuplicateSubmissionDeliveredOnce(t *testing.T) {
	t.Parallel()
	tgt := newScripted(t, 200)
	svc, _ := start(t, retryConfig(t, tgt.url, 3))
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	var bodies []string
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequest("POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs", strings.NewReader("same"))
		req.Header.Set("Idempotency-Key", "dup-1")
		resp, err := client.Do(req)
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submission %d: %v %v", i, resp, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		bodies = append(bodies, string(b))
	}
	if !strings.Contains(bodies[1], `"id":"dup-1"`) || !strings.Contains(bodies[1], `"duplicate":true`) || strings.Contains(bodies[0], "duplicate") {
		t.Fatalf("answers %q", bodies)
	}
	waitFor(t, 5*time.Second, "one delivery", func() bool { return tgt.count("dup-1") >= 1 })
	waitSettled(t, svc.Addr())
	if n := tgt.count("dup-1"); n != 1 {
		t.Fatalf("delivered %d times", n)
	}
}

// TestStopHandsBackHeldJobsAtOnce: every job an instance holds when it
// stops (fetched, waiting for its slot) is back on the queue for other
// instances at once, not after ack_wait; and so is every job it never
// fetched: another consumer gets all that were not delivered, each once.
//
// Outcomes only: "at once" is checked as within half of ack_wait (2.5 s),
// where the jobs back take a few fetches of at most 200 ms each.
func TestStopHandsBackHeldJobsAtOnce(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	var got atomic.Int64
	rec := newRecorder(t)
	rec.srv.Config.Handler = http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got.Add(1) })
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 2, 1)
	cfg.NATS.URL = srv.ClientURL()
	cfg.Lanes[0].MaxInflight = 4
	svc, stop := start(t, cfg)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	const jobs = 20
	for i := 0; i < jobs; i++ {
		submit(t, client, svc.Addr(), "demo", fmt.Sprintf("held-%d", i), "x")
	}
	_, js := testenv.JetStream(t, srv.ClientURL())
	cons, err := js.Consumer(context.Background(), queue.StreamName("demo"), queue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	// At 2/s the drain holds the next job, waiting for its slot.
	waitFor(t, 5*time.Second, "the drain to hold a job", func() bool {
		ci, err := cons.Info(context.Background())
		return err == nil && ci.NumAckPending > ci.NumRedelivered && got.Load() >= 1
	})
	stop()
	stopped := time.Now()
	delivered := int(got.Load())
	// Another instance (here a plain fetch on the shared consumer, acking
	// as it goes: max_ack_pending is 4) gets every job not delivered,
	// long before ack_wait would have let the held ones go.
	seen := map[string]int{}
	redelivered := 0
	for len(seen) < jobs-delivered && time.Since(stopped) < config.DefaultAckWait/2 {
		batch, err := cons.Fetch(jobs, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			// A job stored at intake carries its id in Nats-Msg-Id alone.
			id := m.Headers().Get(queue.HeaderJobID)
			if id == "" {
				id = m.Headers().Get(jetstream.MsgIDHeader)
			}
			seen[id]++
			if meta, _ := m.Metadata(); meta != nil && meta.NumDelivered > 1 {
				redelivered++
			}
			m.Ack()
		}
	}
	if len(seen) != jobs-delivered {
		t.Fatalf("%d jobs back on the queue within %v of the stop, want the %d not delivered (ack_wait is %v): %v",
			len(seen), config.DefaultAckWait/2, jobs-delivered, config.DefaultAckWait, seen)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s fetched %d times", id, n)
		}
	}
	if redelivered == 0 {
		t.Fatal("none of the jobs back had been held by the stopped instance: the test held none")
	}
}
