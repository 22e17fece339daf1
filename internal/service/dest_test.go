package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// apiCall is one request a test API received.
type apiCall struct {
	id, method, path, apiKey, accept string
	at                               time.Time
}

// apiTarget is a test API with several endpoints: it records every call
// (method, escaped path and query, the forwarded headers) by job id, and
// answers the ids in dead with 400.
type apiTarget struct {
	mu    sync.Mutex
	calls []apiCall
	dead  map[string]bool
	srv   *httptest.Server
}

func newAPITarget(t *testing.T) *apiTarget {
	a := &apiTarget{dead: map[string]bool{}}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := apiCall{id: r.Header.Get("Idempotency-Key"), method: r.Method, path: r.URL.EscapedPath(),
			apiKey: r.Header.Get("X-Api-Key"), accept: r.Header.Get("Accept"), at: time.Now()}
		if r.URL.RawQuery != "" {
			c.path += "?" + r.URL.RawQuery
		}
		a.mu.Lock()
		a.calls = append(a.calls, c)
		dead := a.dead[c.id]
		a.dead[c.id] = false // a replay succeeds
		a.mu.Unlock()
		if dead {
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *apiTarget) byID(id string) []apiCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []apiCall
	for _, c := range a.calls {
		if c.id == id {
			out = append(out, c)
		}
	}
	return out
}

func (a *apiTarget) snapshot() []apiCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]apiCall(nil), a.calls...)
}

// destConfig is a lane "api" fronting a at base /api/: GET, PUT and DELETE
// besides POST, X-Api-Key and Accept forwarded, job URLs under /v2/.
func destConfig(t *testing.T, a *apiTarget, rate float64, burst int) config.Config {
	cfg := testConfig(t, t.TempDir(), a.srv.URL+"/api/", rate, burst)
	cfg.Lanes[0].Name = "api"
	h := cfg.Lanes[0].Target.HTTP
	h.Methods = []string{"GET", "PUT", "DELETE"}
	h.ForwardHeaders = []string{"X-Api-Key", "Accept"}
	h.JobURLs = []string{a.srv.URL + "/v2/"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestOneLaneFrontsManyEndpoints (real clock, G1 across endpoints): one
// lane at 20/s, burst 10 fronts an API whose calls go to four endpoints
// with four methods; the 60 jobs (15 an endpoint, 50 of them queued: 2.5 s
// of windows) share the lane's one bucket, so no window of their arrivals,
// all endpoints together, holds more than burst + rate·W, and every call
// reaches its endpoint with its method exactly once.
func TestOneLaneFrontsManyEndpoints(t *testing.T) {
	a := newAPITarget(t)
	l := bucket.Limit{Rate: 20, Burst: 10}
	cfg := destConfig(t, a, l.Rate, l.Burst)
	svc, _ := start(t, cfg)
	endpoints := []struct{ method, path string }{
		{"GET", "repos/acme/widgets"}, {"POST", "issues"}, {"PUT", "issues/7/labels?replace=1"}, {"DELETE", "issues/7/lock"},
	}
	const n = 60
	for i := range n {
		e := endpoints[i%len(endpoints)]
		h := map[string]string{"Idempotency-Key": fmt.Sprintf("call-%03d", i), "Throttle-Path": e.path, "Throttle-Forward-X-Api-Key": "k"}
		if e.method != "POST" {
			h["Throttle-Method"] = e.method
		}
		if code, body, _ := postTrace(t, svc.Addr(), "/v1/lanes/api/jobs", "x", h); code != http.StatusAccepted {
			t.Fatalf("job %d: %d %s", i, code, body)
		}
	}
	waitFor(t, 20*time.Second, fmt.Sprintf("%d calls", n), func() bool { return len(a.snapshot()) >= n })
	waitSettled(t, svc.Addr())
	got := a.snapshot()
	if len(got) != n {
		t.Fatalf("%d calls, want %d", len(got), n)
	}
	for i := range n {
		e := endpoints[i%len(endpoints)]
		c := a.byID(fmt.Sprintf("call-%03d", i))
		if want := "/api/" + e.path; len(c) != 1 || c[0].method != e.method || c[0].path != want || c[0].apiKey != "k" {
			t.Fatalf("job %d: calls %+v, want one %s %s with X-Api-Key", i, c, e.method, want)
		}
	}
	// Arrivals add the HTTP hop's jitter to the starts (15 ms), and a start
	// is less than a period after its slot: the tolerance of the lane's
	// own G1 test (service_test.go).
	rel := make([]time.Duration, len(got))
	for i, c := range got {
		rel[i] = c.at.Sub(got[0].at)
	}
	buckettest.CheckWindows(t, rel, l, 15*time.Millisecond+l.Period())
}

// TestJobDestinationsEndToEnd: a job's method, path, URL and forwarded
// headers reach the target from a single submission, a batch item and a
// NATS publish, through a dead letter and its replay; the dead letter
// shows the method, path and header names, never a value, and the
// forwarded secret is in no log line; every refusal is a 400 problem
// naming the header or item member, and nothing refused is delivered. A
// job published on NATS asking for what the lane refuses is dead-lettered
// unsent. Outcome-only: parallel.
func TestJobDestinationsEndToEnd(t *testing.T) {
	t.Parallel()
	a := newAPITarget(t)
	a.dead["dies"] = true
	cfg := destConfig(t, a, 200, 50)
	cfg.NATS.Listen = testenv.FreeAddr(t)
	logs := &testenv.LogBuffer{}
	svc := service.New(cfg, logs.Logger(), nil)
	servicetest.Run(t, svc)
	addr := svc.Addr()
	const secret = "sk_live_do-not-log-me"

	post := func(id string, h map[string]string) (int, []byte) {
		t.Helper()
		h["Idempotency-Key"] = id
		code, body, _ := postTrace(t, addr, "/v1/lanes/api/jobs", "x", h)
		return code, body
	}
	if code, body := post("single", map[string]string{"Throttle-Method": "GET", "Throttle-Path": "/repos//acme/./w?page=2",
		"Throttle-Forward-X-Api-Key": secret, "Throttle-Forward-Accept": "application/json"}); code != http.StatusAccepted {
		t.Fatalf("single: %d %s", code, body)
	}
	if code, body := post("url", map[string]string{"Throttle-URL": a.srv.URL + "/v2/hooks/9", "Throttle-Method": "PUT"}); code != http.StatusAccepted {
		t.Fatalf("url: %d %s", code, body)
	}
	if code, body := post("dies", map[string]string{"Throttle-Method": "DELETE", "Throttle-Path": "issues/1", "Throttle-Forward-X-Api-Key": secret}); code != http.StatusAccepted {
		t.Fatalf("dies: %d %s", code, body)
	}
	batch := `[{"idempotency_key":"item","payload":1,"method":"PUT","path":"issues/2","headers":{"x-api-key":"` + secret + `"}},{"idempotency_key":"item-plain","payload":2}]`
	if code, body, _ := postTrace(t, addr, "/v1/lanes/api/jobs:batch", batch, map[string]string{"Content-Type": "application/json"}); code != http.StatusAccepted {
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
		"nats":         {"Throttle-Path": {"repos/x"}, "throttle-method": {"GET"}, "Throttle-Forward-Accept": {"text/csv"}},
		"nats-escapes": {"Throttle-Path": {"%2e%2e/admin"}},
		"nats-header":  {"Throttle-Forward-Authorization": {"Bearer stolen"}},
	} {
		m := nats.NewMsg("throttle.api")
		m.Data, m.Header = []byte("n"), h
		m.Header.Set("Nats-Msg-Id", id)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the jobs delivered", func() bool {
		return len(a.byID("single")) == 1 && len(a.byID("url")) == 1 && len(a.byID("dies")) == 1 &&
			len(a.byID("item")) == 1 && len(a.byID("item-plain")) == 1 && len(a.byID("nats")) == 1
	})
	for id, want := range map[string]apiCall{
		"single":     {method: "GET", path: "/api/repos/acme/w?page=2", apiKey: secret, accept: "application/json"},
		"url":        {method: "PUT", path: "/v2/hooks/9"},
		"dies":       {method: "DELETE", path: "/api/issues/1", apiKey: secret},
		"item":       {method: "PUT", path: "/api/issues/2", apiKey: secret},
		"item-plain": {method: "POST", path: "/api/"},
		"nats":       {method: "GET", path: "/api/repos/x", accept: "text/csv"},
	} {
		got := a.byID(id)[0]
		got.id, got.at = "", time.Time{}
		if got != want {
			t.Errorf("%s: target got %+v, want %+v", id, got, want)
		}
	}

	// The dead letters: the one the target refused shows its shape
	// (names, no values); the NATS jobs the lane refuses were never sent.
	page := waitDead(t, addr, "api", "three dead letters", func(page api.DeadLetters) bool { return len(page.Dead) == 3 })
	var dies api.DeadLetter
	for _, d := range page.Dead {
		switch d.ID {
		case "dies":
			dies = d
		case "nats-escapes", "nats-header":
			if !strings.Contains(d.LastError, "not allowed") || d.LastStatus != 0 {
				t.Errorf("dead letter %s: %+v, want refused by the lane's lists, unsent", d.ID, d)
			}
		default:
			t.Errorf("unexpected dead letter %+v", d)
		}
	}
	if len(a.byID("nats-escapes"))+len(a.byID("nats-header")) != 0 {
		t.Errorf("a NATS job the lane refuses reached the target")
	}
	resp, err := pollClient.Get(fmt.Sprintf("http://%s/v1/lanes/api/dead/%d", addr, dies.Seq))
	if err != nil {
		t.Fatal(err)
	}
	var one api.DeadLetter
	_ = json.NewDecoder(resp.Body).Decode(&one)
	resp.Body.Close()
	if one.Method != "DELETE" || one.Path != "issues/1" || strings.Join(one.Headers, ",") != "X-Api-Key" {
		t.Errorf("GET dead/%d: %+v, want method, path and header names", dies.Seq, one)
	}
	if code, body, _ := postTrace(t, addr, fmt.Sprintf("/v1/lanes/api/dead/%d/replay", dies.Seq), "", nil); code != http.StatusOK {
		t.Fatalf("replay: %d %s", code, body)
	}
	waitFor(t, 10*time.Second, "the replayed job delivered", func() bool { return len(a.byID("dies")) == 2 })
	if c := a.byID("dies")[1]; c.method != "DELETE" || c.path != "/api/issues/1" || c.apiKey != secret {
		t.Errorf("replayed job: %+v, want its shape kept", c)
	}

	// Refusals: 400, naming the header or the item member; nothing stored.
	for _, c := range []struct {
		name  string
		h     map[string]string
		batch string
		field string
	}{
		{"dot segments", map[string]string{"Throttle-Path": "a/../../admin"}, "", "Throttle-Path"},
		{"encoded dots", map[string]string{"Throttle-Path": "%2e%2e/admin"}, "", "Throttle-Path"},
		{"encoded slash", map[string]string{"Throttle-Path": "a%2f..%2fadmin"}, "", "Throttle-Path"},
		{"double encoding", map[string]string{"Throttle-Path": "%252e%252e/admin"}, "", "Throttle-Path"},
		{"backslash", map[string]string{"Throttle-Path": `..\admin`}, "", "Throttle-Path"},
		{"method", map[string]string{"Throttle-Method": "PATCH"}, "", "Throttle-Method"},
		{"header not listed", map[string]string{"Throttle-Forward-Authorization": secret}, "", "Throttle-Forward-Authorization"},
		{"header never", map[string]string{"Throttle-Forward-Host": "evil"}, "", "Throttle-Forward-Host"},
		{"url outside", map[string]string{"Throttle-URL": a.srv.URL + "/v2evil"}, "", "Throttle-URL"},
		{"url other host", map[string]string{"Throttle-URL": "http://evil.example/v2/"}, "", "Throttle-URL"},
		{"url userinfo", map[string]string{"Throttle-URL": strings.Replace(a.srv.URL, "http://", "http://x@", 1) + "/v2/"}, "", "Throttle-URL"},
		{"empty path", map[string]string{"Throttle-Path": ""}, "", "Throttle-Path"},
		{"batch path", nil, `[{"payload":1},{"payload":1,"path":"../x"}]`, "/1/path"},
		{"batch method", nil, `[{"payload":1,"method":"HEAD"}]`, "/0/method"},
		{"batch header", nil, `[{"payload":1,"headers":{"Authorization":"` + secret + `"}}]`, "/0/headers/Authorization"},
		{"batch url", nil, `[{"payload":1,"url":"http://169.254.169.254/v2/"}]`, "/0/url"},
	} {
		var code int
		var body []byte
		var h http.Header
		if c.batch != "" {
			code, body, h = postTrace(t, addr, "/v1/lanes/api/jobs:batch", c.batch, map[string]string{"Content-Type": "application/json"})
		} else {
			c.h["Idempotency-Key"] = "refused-" + strings.ReplaceAll(c.name, " ", "-")
			code, body, h = postTrace(t, addr, "/v1/lanes/api/jobs", "x", c.h)
		}
		var p api.Problem
		_ = json.Unmarshal(body, &p)
		if code != http.StatusBadRequest || h.Get("Content-Type") != "application/problem+json" || p.Field != c.field {
			t.Errorf("%s: %d %s, want a 400 problem naming %q", c.name, code, body, c.field)
		}
		if strings.Contains(string(body), secret) {
			t.Errorf("%s: the problem holds the forwarded value: %s", c.name, body)
		}
	}
	waitSettled(t, addr)
	for _, c := range a.snapshot() {
		if strings.HasPrefix(c.id, "refused-") {
			t.Errorf("refused job %s reached the target", c.id)
		}
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("a forwarded value is in the logs")
	}
	resp, err = pollClient.Get("http://" + addr + "/v1/lanes/api/dead")
	if err == nil {
		var b strings.Builder
		_ = resp.Write(&b)
		resp.Body.Close()
		if strings.Contains(b.String(), secret) {
			t.Errorf("a forwarded value is in the dead-letter listing")
		}
	}
}

// TestThousandReceiversEachWithItsURL (real clock): 1,000 receivers on one
// keyed lane, each given its own URL, header and rate (1, 2 or 3/s, burst
// 1) by PATCH …/keys/{key}: every job reaches its own receiver exactly
// once, in submit order per receiver, and no receiver gets two jobs closer
// than its period (less 30 ms of HTTP jitter: a key paced at another key's
// rate, or at the lane's, would be far off). One receiver signs with its
// own secret, which GET never shows.
func TestThousandReceiversEachWithItsURL(t *testing.T) {
	a := newAPITarget(t)
	var sigMu sync.Mutex
	signed := map[string]bool{}
	// dialled holds, for a job that came first on its connection, when
	// the connection was accepted: its delivery started before that, and
	// its arrival trails its start by the dial too (the lane opens up to
	// max_inflight connections at once for the first jobs).
	type conn struct {
		accepted time.Time
		served   atomic.Bool
	}
	type connKey struct{}
	dialled := map[string]time.Time{}
	// Warm-up jobs (keys w000…, to the lane's base URL /api/) are held
	// until max_inflight of them are in flight at once, so that the lane
	// has a connection open for each delivery it can run before the
	// measured jobs come: a job waiting for a connection arrives late by a
	// dial, which under load took up to 118 ms.
	const inflight = 256
	var warmArrived sync.WaitGroup
	warmArrived.Add(inflight)
	allWarm := make(chan struct{})
	go func() { warmArrived.Wait(); close(allWarm) }()
	var warmDone atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		warmArrived.Done()
		select {
		case <-allWarm:
		case <-time.After(20 * time.Second):
		}
		warmDone.Add(1)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c := r.Context().Value(connKey{}).(*conn)
		sigMu.Lock()
		if r.Header.Get("Webhook-Signature") != "" {
			signed[r.Header.Get("Idempotency-Key")] = true
		}
		if !c.served.Swap(true) {
			dialled[r.Header.Get("Idempotency-Key")] = c.accepted
		}
		sigMu.Unlock()
		a.srv.Config.Handler.ServeHTTP(w, r)
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, &conn{accepted: time.Now()})
	}
	srv.Start()
	t.Cleanup(srv.Close)
	// The lane-wide cap never binds (1,000 first jobs fit its burst): a
	// key's start delayed by the lane's slot would come less than a period
	// before its next, which the keyed pacer counts from the key's slot.
	cfg := keyedConfig(t, srv.URL+"/api/", 5000, 1000, 1, 1)
	h := cfg.Lanes[0].Target.HTTP
	h.ForwardHeaders = []string{"X-Api-Key"}
	h.JobURLs = []string{srv.URL + "/r/"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	svc, _ := start(t, cfg)
	addr := svc.Addr()
	const receivers, per = 1000, 3
	key := func(i int) string { return fmt.Sprintf("k%04d", i) }
	rate := func(i int) float64 { return float64(1 + i%3) }
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	for i := range receivers {
		body := fmt.Sprintf(`{"url":%q,"headers":{"X-Api-Key":"key-%s"},"rate":"%v/s"}`, srv.URL+"/r/"+key(i), key(i), rate(i))
		if i == 0 {
			body = body[:len(body)-1] + `,"signing_secret":"` + secret + `"}`
		}
		var st api.KeyStatus
		if code := keyCall(t, "PATCH", addr, "/v1/lanes/demo/keys/"+key(i), body, &st); code != http.StatusOK {
			t.Fatalf("PATCH %s: %d", key(i), code)
		}
		if st.URL != srv.URL+"/r/"+key(i) || st.Rate != rate(i) || strings.Join(st.Headers, ",") != "X-Api-Key" || st.SigningSecretSet != (i == 0) {
			t.Fatalf("PATCH %s answered %+v", key(i), st)
		}
	}
	resp, err := pollClient.Get("http://" + addr + "/v1/lanes/demo/keys/" + key(0))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_ = resp.Write(&b)
	resp.Body.Close()
	if !strings.Contains(b.String(), `"signing_secret_set":true`) || strings.Contains(b.String(), "whsec_") || strings.Contains(b.String(), "key-k0000") {
		t.Errorf("GET of a key shows a secret or header value, or not that one is set: %s", b.String())
	}
	// Refusals of a key's target: 400 naming the member; nothing stored.
	for body, field := range map[string]string{
		`{"url":"` + srv.URL + `/elsewhere/x"}`:   "url",
		`{"url":"` + srv.URL + `/r/../api/"}`:     "url",
		`{"headers":{"Authorization":"x"}}`:       "headers/Authorization",
		`{"headers":{"Host":"evil"}}`:             "headers/Host",
		`{"signing_secret":"not-a-whsec-secret"}`: "signing_secret",
	} {
		var p api.Problem
		req, _ := http.NewRequest("PATCH", "http://"+addr+"/v1/lanes/demo/keys/"+key(1), strings.NewReader(body))
		resp, err := pollClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || p.Field != field || strings.Contains(p.Detail, "not-a-whsec") {
			t.Errorf("PATCH %s: %d %+v, want a 400 naming %s", body, resp.StatusCode, p, field)
		}
	}

	// The warm-up: max_inflight jobs of keys of their own, all in flight
	// at once, then the lane's burst back (max_inflight tokens at its
	// rate take 51 ms; twice that is waited).
	var warm []string
	for i := range inflight {
		warm = append(warm, fmt.Sprintf(`{"idempotency_key":"warm-%d","throttle_key":"w%03d","payload":0}`, i, i))
	}
	resp, err = batchClient.Post("http://"+addr+"/v1/lanes/demo/jobs:batch", "application/json", strings.NewReader("["+strings.Join(warm, ",")+"]"))
	if err != nil {
		t.Fatalf("warm-up batch: %v", err)
	}
	resp.Body.Close()
	waitFor(t, 30*time.Second, "the warm-up jobs delivered", func() bool { return warmDone.Load() == inflight })
	if cfg.Lanes[0].MaxInflight != inflight {
		t.Fatalf("the lane's max_inflight is %d; the warm-up holds %d", cfg.Lanes[0].MaxInflight, inflight)
	}
	time.Sleep(2 * time.Duration(float64(inflight)/cfg.Lanes[0].Rate.PerSecond()*float64(time.Second)))

	// per jobs per receiver, in batches of 1,000 items: job j of each
	// receiver before job j+1. Stalls count from here: the deliveries'.
	stalls := testenv.StartStallMeter(t)
	for j := range per {
		var items []string
		for i := range receivers {
			items = append(items, fmt.Sprintf(`{"idempotency_key":"%s-%d","throttle_key":"%s","payload":%d}`, key(i), j, key(i), j))
		}
		// A batch of 1,000 stores them in one window: seconds under -race,
		// past the polling client's timeout.
		resp, err := batchClient.Post("http://"+addr+"/v1/lanes/demo/jobs:batch", "application/json", strings.NewReader("["+strings.Join(items, ",")+"]"))
		if err != nil {
			t.Fatalf("batch %d: %v", j, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("batch %d: %d %.300s", j, resp.StatusCode, body)
		}
	}
	waitFor(t, 60*time.Second, "every job delivered", func() bool { return len(a.snapshot()) >= receivers*per })
	waitSettled(t, addr)
	got := a.snapshot()
	if len(got) != receivers*per {
		t.Fatalf("%d deliveries, want %d", len(got), receivers*per)
	}
	byKey := map[string][]apiCall{}
	seen := map[string]bool{}
	for _, c := range got {
		if seen[c.id] {
			t.Fatalf("job %s delivered twice", c.id)
		}
		seen[c.id] = true
		k := c.id[:5]
		if c.path != "/r/"+k || c.apiKey != "key-"+k {
			t.Fatalf("job %s went to %s with X-Api-Key %q, not its receiver's URL and header", c.id, c.path, c.apiKey)
		}
		byKey[k] = append(byKey[k], c)
	}
	// An arrival trails its start by the HTTP hop (20 ms) and by the
	// stalls of this process, which holds the throttler and the 1,000
	// receivers: three times the worst stall measured (the fleet tests'
	// stall meter, same reasoning). A key paced at another rate is 167 ms
	// or more off; one paced at the lane's rate, a whole period.
	// A job that came first on a new connection started before the
	// connection was accepted: its start is bounded by that, not by its
	// arrival (the dial can take longer than the hop under load).
	jitter := 20*time.Millisecond + 3*stalls.WorstStall()
	sigMu.Lock()
	defer sigMu.Unlock()
	for i := range receivers {
		cs := byKey[key(i)]
		period := time.Duration(float64(time.Second) / rate(i))
		for j, c := range cs {
			if want := fmt.Sprintf("%s-%d", key(i), j); c.id != want {
				t.Fatalf("receiver %s: arrival %d is %s, want %s (FIFO per receiver)", key(i), j, c.id, want)
			}
			if j > 0 {
				prev, how := cs[j-1].at, "arrivals"
				if at, ok := dialled[cs[j-1].id]; ok && at.Before(prev) {
					prev, how = at, "the accept of the connection of arrival "+strconv.Itoa(j-1)+" and arrival"
				}
				if gap := c.at.Sub(prev); gap < period-jitter {
					t.Fatalf("receiver %s (%v/s): %s %d and %d %v apart, under its period %v less the jitter %v", key(i), rate(i), how, j-1, j, gap, period, jitter)
				}
			}
		}
	}
	for id := range signed {
		if !strings.HasPrefix(id, key(0)+"-") {
			t.Errorf("job %s was signed: only %s has a secret", id, key(0))
		}
	}
	if len(signed) != per {
		t.Errorf("%d of %s's jobs signed, want %d", len(signed), key(0), per)
	}
}

// batchClient sends the large batches, which may take longer than the
// polling client's timeout.
var batchClient = &http.Client{Timeout: 2 * time.Minute}
