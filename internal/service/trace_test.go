package service_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
	"github.com/throttler/throttler/internal/tracectx"
	"github.com/throttler/throttler/internal/tracing"
)

// traceTarget is an HTTP target that records the trace headers of every
// attempt per job id, and answers each id's attempts with the statuses
// set for it (200 once they run out).
type traceTarget struct {
	mu       sync.Mutex
	got      map[string][]tracectx.Context
	statuses map[string][]int
	srv      *httptest.Server
}

func newTraceTarget(t *testing.T) *traceTarget {
	tt := &traceTarget{got: map[string][]tracectx.Context{}, statuses: map[string][]int{}}
	tt.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Idempotency-Key")
		tt.mu.Lock()
		tt.got[id] = append(tt.got[id], tracectx.Context{Parent: r.Header.Get("traceparent"), State: r.Header.Get("tracestate"), Baggage: r.Header.Get("baggage")})
		status := http.StatusOK
		if s := tt.statuses[id]; len(s) > 0 {
			status, tt.statuses[id] = s[0], s[1:]
		}
		tt.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(tt.srv.Close)
	return tt
}

func (tt *traceTarget) attempts(id string) []tracectx.Context {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return append([]tracectx.Context(nil), tt.got[id]...)
}

const (
	submitterParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	submitterTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	submitterSpan   = "00f067aa0ba902b7"
)

// postTrace sends body to path with headers; it returns the status and body.
func postTrace(t *testing.T, addr, path, body string, headers map[string]string) (int, []byte, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := servicetest.Client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// TestTraceContextEndToEnd (tracing off): the W3C trace context of a job
// submitted over HTTP (headers), in a batch (an item's trace object, or
// the request's headers for items without one) or published on NATS
// reaches the target as the submitter sent it, on every attempt: through
// a retry and a dead-letter replay. A malformed value is refused with a
// problem naming the header or item field, storing nothing; on NATS it is
// dropped and the job delivered. Outcome-only: runs in parallel.
func TestTraceContextEndToEnd(t *testing.T) {
	t.Parallel()
	tt := newTraceTarget(t)
	tt.statuses["retried"] = []int{500}
	tt.statuses["dead"] = []int{400}
	cfg := testConfig(t, t.TempDir(), tt.srv.URL+"/hook", 200, 50)
	cfg.Lanes[0].Retry = config.Retry{MaxAttempts: 3, BackoffBase: config.Duration(20 * time.Millisecond), BackoffMax: config.Duration(50 * time.Millisecond)}
	cfg.NATS.Listen = testenv.FreeAddr(t)
	svc, _ := start(t, cfg)
	addr := svc.Addr()
	full := tracectx.Context{Parent: submitterParent, State: "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", Baggage: "user=alice,tier=gold;ttl=60"}
	headers := func(id string, c tracectx.Context) map[string]string {
		h := map[string]string{"Content-Type": "text/plain", "Idempotency-Key": id}
		if c.Parent != "" {
			h["traceparent"] = c.Parent
		}
		if c.State != "" {
			h["tracestate"] = c.State
		}
		if c.Baggage != "" {
			h["baggage"] = c.Baggage
		}
		return h
	}

	for _, id := range []string{"single", "retried", "dead"} {
		if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/jobs", "x", headers(id, full)); code != http.StatusAccepted {
			t.Fatalf("%s: %d %s", id, code, body)
		}
	}
	other := tracectx.Context{Parent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}
	batch := `[{"idempotency_key":"item-own","payload":1,"trace":{"traceparent":"` + other.Parent + `"}},{"idempotency_key":"item-default","payload":2}]`
	bh := headers("", full)
	bh["Content-Type"] = "application/json"
	delete(bh, "Idempotency-Key")
	if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/jobs:batch", batch, bh); code != http.StatusAccepted {
		t.Fatalf("batch: %d %s", code, body)
	}

	nc, err := nats.Connect("nats://" + cfg.NATS.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for id, h := range map[string]nats.Header{
		"nats-ok":  {"traceparent": {submitterParent}, "baggage": {"user=bob"}},
		"nats-bad": {"traceparent": {"00-not-a-trace"}, "baggage": {"user=bob"}},
	} {
		m := nats.NewMsg("throttle.demo")
		m.Data, m.Header = []byte("n"), h
		m.Header.Set("Nats-Msg-Id", id)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}

	waitFor(t, 10*time.Second, "every job delivered (the retried one twice)", func() bool {
		return len(tt.attempts("single")) == 1 && len(tt.attempts("retried")) == 2 && len(tt.attempts("dead")) == 1 &&
			len(tt.attempts("item-own")) == 1 && len(tt.attempts("item-default")) == 1 &&
			len(tt.attempts("nats-ok")) == 1 && len(tt.attempts("nats-bad")) == 1
	})
	// Replay the dead letter: its context comes back with it.
	if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/dead/replay", "", nil); code != http.StatusOK {
		t.Fatalf("replay: %d %s", code, body)
	}
	waitFor(t, 10*time.Second, "the replayed job delivered", func() bool { return len(tt.attempts("dead")) == 2 })

	for id, want := range map[string]tracectx.Context{
		"single": full, "retried": full, "dead": full, "item-own": other, "item-default": full,
		"nats-ok": {Parent: submitterParent, Baggage: "user=bob"}, "nats-bad": {},
	} {
		for i, got := range tt.attempts(id) {
			if got != want {
				t.Errorf("%s attempt %d: target got %+v, want %+v", id, i+1, got, want)
			}
		}
	}

	// Malformed: refused, naming the header or the item's field; nothing
	// stored.
	for _, c := range []struct {
		name, path, body string
		headers          map[string]string
		field            string
	}{
		{"bad traceparent", "/v1/lanes/demo/jobs", "x", headers("bad-1", tracectx.Context{Parent: "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}), "traceparent"},
		{"tracestate alone", "/v1/lanes/demo/jobs", "x", headers("bad-2", tracectx.Context{State: "rojo=1"}), "tracestate"},
		{"bad baggage", "/v1/lanes/demo/jobs", "x", headers("bad-3", tracectx.Context{Baggage: "a b=c"}), "baggage"},
		{"batch item", "/v1/lanes/demo/jobs:batch", `[{"idempotency_key":"bad-4","payload":1},{"idempotency_key":"bad-5","payload":1,"trace":{"traceparent":"00-x"}}]`,
			map[string]string{"Content-Type": "application/json"}, "/1/trace/traceparent"},
		{"batch header", "/v1/lanes/demo/jobs:batch", `[{"idempotency_key":"bad-6","payload":1}]`,
			map[string]string{"Content-Type": "application/json", "traceparent": "garbage"}, "traceparent"},
	} {
		code, body, h := postTrace(t, addr, c.path, c.body, c.headers)
		var p struct {
			Field string `json:"field"`
		}
		_ = json.Unmarshal(body, &p)
		if code != http.StatusBadRequest || h.Get("Content-Type") != "application/problem+json" || p.Field != c.field {
			t.Errorf("%s: %d %s %s, want 400 problem naming %q", c.name, code, h.Get("Content-Type"), body, c.field)
		}
	}
	waitSettled(t, addr)
	for _, id := range []string{"bad-1", "bad-2", "bad-3", "bad-4", "bad-5", "bad-6"} {
		if n := len(tt.attempts(id)); n != 0 {
			t.Errorf("refused job %s delivered %d times", id, n)
		}
	}
}

// TestTracingSpansReachOTLP (tracing on, the OTLP/HTTP exporter and an
// in-test receiver decoding its protobufs with the OTLP message types): a job submitted with a
// traceparent gets an intake span, a queue-wait span (linked to the
// submitter's span) and an attempt span, all children of the submitter's
// span in its trace; the target's traceparent names the attempt span as
// its parent. A job without one is stored under its intake span, so its
// wait and attempt join the intake's trace. A job published on NATS gets
// an intake span under its publisher's span. Outcome-only: parallel.
func TestTracingSpansReachOTLP(t *testing.T) {
	t.Parallel()
	recv := testenv.StartOTLP(t)
	tt := newTraceTarget(t)
	cfg := testConfig(t, t.TempDir(), tt.srv.URL+"/hook", 200, 50)
	cfg.NATS.Listen = testenv.FreeAddr(t)
	tr, err := tracing.New(tracing.Config{Endpoint: recv.URL + "/v1/traces", Sampler: tracing.DefaultSampler, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	exporting := make(chan error, 1)
	go func() { exporting <- tr.Run(rctx) }()
	defer func() {
		cancel()
		<-exporting
	}()
	svc := service.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), nil)
	svc.TraceWith(tr)
	stop := servicetest.Run(t, svc)
	addr := svc.Addr()

	if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/jobs", "x", map[string]string{"Idempotency-Key": "with", "traceparent": submitterParent, "tracestate": "rojo=1"}); code != http.StatusAccepted {
		t.Fatalf("%d %s", code, body)
	}
	if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/jobs", "x", map[string]string{"Idempotency-Key": "without"}); code != http.StatusAccepted {
		t.Fatalf("%d %s", code, body)
	}
	nc, err := nats.Connect("nats://" + cfg.NATS.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	natsParent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	m := nats.NewMsg("throttle.demo")
	m.Data, m.Header = []byte("n"), nats.Header{"traceparent": {natsParent}, "Nats-Msg-Id": {"published"}}
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the jobs delivered", func() bool {
		return len(tt.attempts("with")) == 1 && len(tt.attempts("without")) == 1 && len(tt.attempts("published")) == 1
	})
	stop()
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}

	byJob := func(name, id string) testenv.Span {
		t.Helper()
		for _, s := range recv.Named(name) {
			if s.Attr("throttler.job.id") == id {
				return s
			}
		}
		t.Fatalf("no %s span for job %s among %d spans", name, id, len(recv.Spans()))
		return testenv.Span{}
	}
	// The job with a traceparent.
	var intake testenv.Span
	for _, s := range recv.Named("POST /v1/lanes/{lane}/jobs") {
		if s.TraceID() == submitterTrace {
			intake = s
		}
	}
	if intake.Span == nil || intake.ParentID() != submitterSpan || intake.Attr("throttler.lane") != "demo" || intake.Attr("http.response.status_code") != "202" {
		t.Fatalf("intake span %+v, want a child of the submitter's span", intake)
	}
	q, d := byJob("throttler.queue", "with"), byJob("throttler.dispatch", "with")
	for _, s := range []testenv.Span{q, d} {
		if s.TraceID() != submitterTrace || s.ParentID() != submitterSpan || s.Attr("throttler.lane") != "demo" {
			t.Errorf("%s: trace %s parent %s lane %q, want a child of the submitter's span", s.Name, s.TraceID(), s.ParentID(), s.Attr("throttler.lane"))
		}
	}
	if len(q.Links) != 1 || hex.EncodeToString(q.Links[0].SpanId) != submitterSpan || hex.EncodeToString(q.Links[0].TraceId) != submitterTrace {
		t.Errorf("queue span links %v, want one to the submitter's span", q.Links)
	}
	if d.Attr("throttler.outcome") != "done" || d.Attr("http.response.status_code") != "200" || d.Attr("throttler.attempt") != "1" {
		t.Errorf("attempt span attributes %v", d.Attributes)
	}
	if got := tt.attempts("with")[0]; got.Parent != "00-"+submitterTrace+"-"+d.SpanID()+"-01" || got.State != "rojo=1" {
		t.Errorf("target got %+v, want the attempt span %s as its parent in trace %s", got, d.SpanID(), submitterTrace)
	}
	// The job without one: its intake span is the root of its trace.
	q, d = byJob("throttler.queue", "without"), byJob("throttler.dispatch", "without")
	var root testenv.Span
	for _, s := range recv.Named("POST /v1/lanes/{lane}/jobs") {
		if s.TraceID() == d.TraceID() {
			root = s
		}
	}
	if root.Span == nil || root.ParentID() != "" || q.ParentID() != root.SpanID() || d.ParentID() != root.SpanID() {
		t.Errorf("job without a traceparent: intake %v, queue parent %s, attempt parent %s", root.Span != nil, q.ParentID(), d.ParentID())
	}
	if got := tt.attempts("without")[0]; !strings.Contains(got.Parent, "-"+d.SpanID()+"-") {
		t.Errorf("target got %+v, want the attempt span %s as its parent", got, d.SpanID())
	}
	// The job published on NATS.
	in := byJob("throttler.intake", "published")
	if in.TraceID() != "0af7651916cd43dd8448eb211c80319c" || in.ParentID() != "b7ad6b7169203331" || in.Attr("throttler.intake") != "nats" {
		t.Errorf("NATS intake span trace %s parent %s", in.TraceID(), in.ParentID())
	}
	if d := byJob("throttler.dispatch", "published"); d.TraceID() != in.TraceID() || d.ParentID() != "b7ad6b7169203331" {
		t.Errorf("NATS job's attempt span trace %s parent %s", d.TraceID(), d.ParentID())
	}
}
