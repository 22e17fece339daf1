package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/testenv"
)

type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field"`
	Lane   string `json:"lane"`
}

type laneList struct {
	Lanes []struct {
		Name          string  `json:"name"`
		EffectiveRate float64 `json:"effective_rate"`
		Backlog       uint64  `json:"backlog"`
		Retrying      uint64  `json:"retrying"`
		Delivered     uint64  `json:"delivered"`
		InFlight      int     `json:"in_flight"`
		Paused        bool    `json:"paused"`
	} `json:"lanes"`
}

func getLanes(t *testing.T, addr string) laneList {
	t.Helper()
	resp, err := pollClient.Get("http://" + addr + "/v1/lanes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l laneList
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestBadInputIsRefusedAndStoresNothing: each refusal is a problem+json that
// names the field, and the lane's stream stays empty.
func TestBadInputIsRefusedAndStoresNothing(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 0.001, 1)
	cfg.Lanes[0].MaxBacklog = 2
	cfg.Lanes[0].MaxBody = 16
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	post := func(lane, body string, hdr map[string]string) (*http.Response, problem) {
		req, _ := http.NewRequest("POST", "http://"+svc.Addr()+"/v1/lanes/"+lane+"/jobs", strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p problem
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 400 {
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("status %d with Content-Type %q, body %s", resp.StatusCode, ct, raw)
			}
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("problem body %q: %v", raw, err)
			}
		}
		return resp, p
	}
	for _, tc := range []struct {
		name, lane, body string
		hdr              map[string]string
		status           int
		field            string
	}{
		{"UnknownLane", "nope", "x", nil, 404, "lane"},
		{"BodyTooLarge", "demo", strings.Repeat("x", 17), nil, 413, "body"},
		{"BadIdempotencyKey", "demo", "x", map[string]string{"Idempotency-Key": "has space"}, 400, "Idempotency-Key"},
	} {
		resp, p := post(tc.lane, tc.body, tc.hdr)
		if resp.StatusCode != tc.status || p.Status != tc.status || p.Field != tc.field || p.Type == "" || p.Detail == "" {
			t.Errorf("%s: status %d, problem %+v; want %d naming %q", tc.name, resp.StatusCode, p, tc.status, tc.field)
		}
	}
	if l := getLanes(t, svc.Addr()); l.Lanes[0].Backlog != 0 {
		t.Fatalf("refused requests stored %d jobs", l.Lanes[0].Backlog)
	}
	// Fill the backlog (rate 0.001/s, burst 1: one admitted, then queued).
	for i := 0; i < 2; i++ {
		if resp, p := post("demo", "x", nil); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("job %d: %d %+v", i, resp.StatusCode, p)
		}
	}
	waitFor(t, 5*time.Second, "backlog of 1 after the admitted job left", func() bool {
		l := getLanes(t, svc.Addr())
		return l.Lanes[0].Delivered == 1 && l.Lanes[0].Backlog == 1
	})
	if resp, p := post("demo", "x", nil); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("second queued job: %d %+v", resp.StatusCode, p)
	}
	// Now 2 are waiting: max_backlog reached.
	resp, p := post("demo", "x", nil)
	if resp.StatusCode != http.StatusTooManyRequests || p.Field != "max_backlog" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over max_backlog: status %d, Retry-After %q, %+v", resp.StatusCode, resp.Header.Get("Retry-After"), p)
	}
	// One job waits 1000 s at 0.001/s: Retry-After is that estimate.
	if ra := resp.Header.Get("Retry-After"); ra != "1000" {
		t.Errorf("Retry-After = %s, want 1000 (one period at 0.001/s)", ra)
	}
	if l := getLanes(t, svc.Addr()); l.Lanes[0].Backlog != 2 {
		t.Fatalf("backlog %d after a 429, want 2", l.Lanes[0].Backlog)
	}
}

// TestNATSPublishIsAJob: a plain JetStream publish to throttle.<lane> is
// drained and delivered like an HTTP submission, with its Nats-Msg-Id as the
// job id.
func TestNATSPublishIsAJob(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	rec := newRecorder(t)
	// Burst 1: jobs start one period apart, so arrival order is start order.
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 100, 1)
	cfg.NATS.URL = srv.ClientURL()
	start(t, cfg)

	nc, js := testenv.JetStream(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := 0; i < 20; i++ {
		msg := nats.NewMsg("throttle.demo")
		msg.Data = []byte(fmt.Sprintf(`{"n":%d}`, i))
		msg.Header.Set("Content-Type", "application/json")
		if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("nats-%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// A core NATS publish (no JetStream ack) lands in the stream too.
	if err := nc.Publish("throttle.demo", []byte("core")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "21 deliveries", func() bool { return len(rec.snapshot()) >= 21 })
	got := rec.snapshot()
	for i := 0; i < 20; i++ {
		if want := fmt.Sprintf("nats-%02d", i); got[i].id != want || got[i].ct != "application/json" || !bytes.Equal([]byte(got[i].body), []byte(fmt.Sprintf(`{"n":%d}`, i))) {
			t.Fatalf("delivery %d: %+v, want id %s", i, got[i], want)
		}
	}
	if got[20].body != "core" || !strings.HasPrefix(got[20].id, "demo-") {
		t.Fatalf("core publish delivered as %+v, want a stream-sequence id", got[20])
	}
}

// TestStopFinishesInflightDispatches: SIGTERM (context cancel) waits for a
// delivery that is under way, acks it, and returns within the bound.
func TestStopFinishesInflightDispatches(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 10)
	release := make(chan struct{})
	finished := make(chan string, 10)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		finished <- r.Header.Get("Idempotency-Key")
	})
	rec := newRecorder(t)
	rec.srv.Config.Handler = slow
	dir := t.TempDir()
	cfg := testConfig(t, dir, rec.srv.URL, 100, 5)
	svc, stop := start(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	if code, _, _ := submit(t, client, svc.Addr(), "demo", "slow-1", "x"); code != http.StatusAccepted {
		t.Fatalf("status %d", code)
	}
	<-started
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	// Intake is closed at once while the delivery runs. The probe names
	// no lane, so that nothing it sends is stored: open, intake answers it
	// 404; closed, 503 before looking at the lane. (A probe into the lane
	// stored a job whenever it came before the close, which then waited
	// in the stream, unstarted, and read as a lost ack below.)
	waitFor(t, 5*time.Second, "intake to close", func() bool {
		resp, err := client.Post("http://"+svc.Addr()+"/v1/lanes/no-such-lane/jobs", "text/plain", strings.NewReader("x"))
		if err != nil {
			return true // listener closed
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	select {
	case <-stopped:
		t.Fatal("the service stopped before its in-flight delivery finished")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if id := <-finished; id != "slow-1" {
		t.Fatalf("finished %s", id)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the service did not stop within 5 s of its last delivery")
	}
	// The job was acked: a restart on the same data delivers nothing again.
	rec.srv.Config.Handler = http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("job delivered again after a clean stop") })
	// The lane's stream keeps a job until it is acked (work-queue
	// retention): an empty stream at once is the proof, without waiting
	// out ack_wait for a redelivery.
	svc2, _ := start(t, cfg)
	if l := getLanes(t, svc2.Addr()); l.Lanes[0].Backlog != 0 {
		t.Fatalf("backlog %d after restart, want 0: the ack was lost", l.Lanes[0].Backlog)
	}
}

// TestLargestBodyIsStored: a body of exactly max_body (1 MiB by default) is
// stored and delivered whole on the embedded default.
func TestLargestBodyIsStored(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 10, 1)
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	body := strings.Repeat("x", 1<<20)
	if code, _, _ := submit(t, client, svc.Addr(), "demo", "big-1", body); code != http.StatusAccepted {
		t.Fatalf("1 MiB body: status %d", code)
	}
	waitFor(t, 5*time.Second, "the big job", func() bool { return len(rec.snapshot()) == 1 })
	if got := len(rec.snapshot()[0].body); got != 1<<20 {
		t.Fatalf("delivered %d bytes, want %d", got, 1<<20)
	}
}

// TestGoHandlerTarget: a program embedding the throttler receives a lane's
// jobs in a Go handler, paced like any other target; an unregistered
// handler name fails the start naming the field.
func TestGoHandlerTarget(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, t.TempDir(), "http://127.0.0.1:1/", 50, 2)
	cfg.Lanes[0].Target = config.Target{Handler: "mine"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	svc := service.New(cfg, nil, nil)
	svc.Handle("mine", dispatch.Handler(func(_ context.Context, j dispatch.Job) dispatch.Result {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, j.ID+":"+string(j.Payload))
		return dispatch.Result{Verdict: dispatch.Done}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- svc.Run(ctx) }()
	defer func() { cancel(); <-errc }()
	<-svc.Ready()
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for i := 0; i < 5; i++ {
		submit(t, client, svc.Addr(), "demo", fmt.Sprintf("h-%d", i), fmt.Sprint(i))
	}
	waitFor(t, 5*time.Second, "5 jobs in the handler", func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 5 })
	// Each job once, with its payload. Not in order: the handler runs on
	// a goroutine per dispatch, and two jobs the burst (2) lets start
	// together reach it in either order (start order is checked on the
	// drain's virtual clock, leaky TestStallCaughtUpWithinBurst).
	mu.Lock()
	sorted := slices.Sorted(slices.Values(got))
	mu.Unlock()
	if want := []string{"h-0:0", "h-1:1", "h-2:2", "h-3:3", "h-4:4"}; !slices.Equal(sorted, want) {
		t.Fatalf("handler got %v, want each of %v once", sorted, want)
	}

	cfg.NATS.DataDir = t.TempDir()
	cfg.Lanes[0].Target = config.Target{Handler: "missing"}
	err := service.New(cfg, nil, nil).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), `lanes[0]: target.handler: no handler "missing"`) {
		t.Fatalf("start with a missing handler: %v", err)
	}
}

// TestFullStreamAnswers503: a lane whose stream reached max_bytes refuses
// with 503 + Retry-After naming max_bytes, and stores nothing more.
func TestFullStreamAnswers503(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 0.001, 1)
	cfg.Lanes[0].MaxBytes = 1 << 20
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	body := strings.Repeat("x", 400<<10)
	for i := 0; i < 3; i++ { // the first is admitted and leaves; two wait
		if code, _, _ := submit(t, client, svc.Addr(), "demo", fmt.Sprintf("fat-%d", i), body); code != http.StatusAccepted {
			t.Fatalf("job %d: %d", i, code)
		}
		if i == 0 {
			waitFor(t, 5*time.Second, "the admitted job to leave", func() bool { return getLanes(t, svc.Addr()).Lanes[0].Delivered == 1 })
		}
	}
	req, _ := http.NewRequest("POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs", strings.NewReader(body))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p problem
	json.NewDecoder(resp.Body).Decode(&p)
	if resp.StatusCode != http.StatusServiceUnavailable || p.Field != "max_bytes" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("full stream: %d %+v Retry-After %q", resp.StatusCode, p, resp.Header.Get("Retry-After"))
	}
	if b := getLanes(t, svc.Addr()).Lanes[0].Backlog; b != 2 {
		t.Fatalf("backlog %d after the refusal, want 2", b)
	}
}

// TestEmbeddedListenTakesOutsidePublishers: with nats.listen set, a
// producer outside the process publishes to throttle.<lane> on the
// embedded server and the job is delivered.
func TestEmbeddedListenTakesOutsidePublishers(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 50, 5)
	cfg.NATS.Listen = testenv.FreeAddr(t)
	start(t, cfg)
	nc, err := nats.Connect("nats://" + cfg.NATS.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msg := nats.NewMsg("throttle.demo")
	msg.Data = []byte("from outside")
	msg.Header.Set("Nats-Msg-Id", "outside-1")
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the published job", func() bool { return len(rec.snapshot()) == 1 })
	if a := rec.snapshot()[0]; a.id != "outside-1" || a.body != "from outside" {
		t.Fatalf("delivered %+v", a)
	}
}
