package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/testenv"
)

// serve starts an httptest server that is closed when the test ends.
func serve(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// newHTTP builds a target that is closed when the test ends.
func newHTTP(t *testing.T, cfg HTTPConfig, guard *Guard) *HTTP {
	t.Helper()
	h, err := NewHTTP(cfg, guard)
	if err != nil {
		t.Fatalf("NewHTTP: %v", err)
	}
	t.Cleanup(h.Close)
	return h
}

func testJob() Job {
	return Job{ID: "job-42", Lane: "demo", ContentType: "application/json", Payload: []byte(`{"n":1}`), Attempt: 1}
}

func TestHTTPClassification(t *testing.T) {
	steps := []struct {
		name        string
		handler     http.HandlerFunc
		cfg         HTTPConfig
		verdict     Verdict
		status      int
		retryAfter  time.Duration
		pause       time.Duration
		errIs       error
		approxPause bool // HTTP-date: whole seconds, real clock
	}{
		{name: "200 done", verdict: Done, status: 200,
			handler: func(w http.ResponseWriter, r *http.Request) {}},
		{name: "204 done", verdict: Done, status: 204,
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }},
		{name: "500 retry", verdict: Retry, status: 500, errIs: ErrStatus,
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }},
		{name: "502 retry", verdict: Retry, status: 502, errIs: ErrStatus,
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(502) }},
		{name: "408 retry", verdict: Retry, status: 408, errIs: ErrStatus,
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(408) }},
		{name: "425 retry", verdict: Retry, status: 425, errIs: ErrStatus,
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(425) }},
		{name: "404 dead", verdict: Dead, status: 404, errIs: ErrStatus,
			handler: func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }},
		{name: "400 dead", verdict: Dead, status: 400, errIs: ErrStatus,
			handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(400) }},
		{name: "404 retry with RetryOther4xx", verdict: Retry, status: 404, errIs: ErrStatus,
			cfg:     HTTPConfig{RetryOther4xx: true},
			handler: func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }},
		{name: "429 Retry-After seconds", verdict: Retry, status: 429, errIs: ErrStatus,
			retryAfter: 2 * time.Second, pause: 2 * time.Second,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(429)
			}},
		{name: "503 Retry-After HTTP-date", verdict: Retry, status: 503, errIs: ErrStatus,
			retryAfter: 3 * time.Second, pause: 3 * time.Second, approxPause: true,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", time.Now().Add(3*time.Second).UTC().Format(http.TimeFormat))
				w.WriteHeader(503)
			}},
		{name: "200 with X-RateLimit exhausted", verdict: Done, status: 200, pause: 5 * time.Second,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-RateLimit-Remaining", "0")
				w.Header().Set("X-RateLimit-Reset", "5")
			}},
		{name: "429 with X-RateLimit only", verdict: Retry, status: 429, errIs: ErrStatus,
			retryAfter: 5 * time.Second, pause: 5 * time.Second,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-RateLimit-Remaining", "0")
				w.Header().Set("X-RateLimit-Reset", "5")
				w.WriteHeader(429)
			}},
		{name: "IETF RateLimit exhausted", verdict: Done, status: 200, pause: 7 * time.Second,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("RateLimit-Policy", `"default";q=100;w=10`)
				w.Header().Set("RateLimit", `"default";r=0;t=7`)
			}},
		{name: "IETF RateLimit with quota left", verdict: Done, status: 200,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("RateLimit", `"default";r=3;t=7`)
			}},
		{name: "Retry-After capped", verdict: Retry, status: 429, errIs: ErrStatus,
			retryAfter: MaxPause, pause: MaxPause,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "999999")
				w.WriteHeader(429)
			}},
		{name: "redirect dead", verdict: Dead, status: 302, errIs: ErrRedirected,
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "/elsewhere", http.StatusFound)
			}},
		{name: "308 dead", verdict: Dead, status: 308, errIs: ErrRedirected,
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "/elsewhere", http.StatusPermanentRedirect)
			}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			var hits atomic.Int32
			srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				s.handler(w, r)
			})
			cfg := s.cfg
			cfg.URL = srv.URL + "/hook"
			res := newHTTP(t, cfg, nil).Deliver(context.Background(), testJob())
			if res.Verdict != s.verdict || res.Status != s.status {
				t.Errorf("verdict %v status %d, want %v %d (err %v)", res.Verdict, res.Status, s.verdict, s.status, res.Err)
			}
			if s.errIs == nil && res.Err != nil {
				t.Errorf("err = %v, want nil", res.Err)
			}
			if s.errIs != nil && !errors.Is(res.Err, s.errIs) {
				t.Errorf("err = %v, want %v", res.Err, s.errIs)
			}
			if s.approxPause {
				// The date has whole seconds: the wait is in (2s, 3s].
				for name, d := range map[string]time.Duration{"PauseLane": res.PauseLane, "RetryAfter": res.RetryAfter} {
					if d < s.pause-time.Second-250*time.Millisecond || d > s.pause {
						t.Errorf("%s = %v, want ≈ %v", name, d, s.pause)
					}
				}
			} else if res.PauseLane != s.pause || res.RetryAfter != s.retryAfter {
				t.Errorf("PauseLane %v RetryAfter %v, want %v %v", res.PauseLane, res.RetryAfter, s.pause, s.retryAfter)
			}
			if res.Took <= 0 {
				t.Errorf("Took = %v", res.Took)
			}
			if n := hits.Load(); n != 1 {
				t.Errorf("server saw %d requests, want 1 (redirects are not followed)", n)
			}
		})
	}
}

func TestHTTPRequest(t *testing.T) {
	type seen struct {
		method, path string
		header       http.Header
		body         []byte
	}
	got := make(chan seen, 2)
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.RequestURI(), r.Header.Clone(), b}
	})
	h := newHTTP(t, HTTPConfig{
		URL:     srv.URL + "/hook?x=1",
		Method:  http.MethodPut,
		Headers: map[string]string{"Authorization": "Bearer s3cret", "x-tenant": "acme"},
	}, nil)
	job := testJob()
	job.Payload = []byte("\x00binary\xffbody")
	if res := h.Deliver(context.Background(), job); res.Verdict != Done {
		t.Fatalf("Deliver: %v %v", res.Verdict, res.Err)
	}
	r := <-got
	checks := []struct{ name, got, want string }{
		{"method", r.method, "PUT"},
		{"path", r.path, "/hook?x=1"},
		{"body", string(r.body), string(job.Payload)},
		{"Content-Type", r.header.Get("Content-Type"), "application/json"},
		{"Idempotency-Key", r.header.Get("Idempotency-Key"), "job-42"},
		{"User-Agent", r.header.Get("User-Agent"), "throttler"},
		{"Authorization", r.header.Get("Authorization"), "Bearer s3cret"},
		{"X-Tenant", r.header.Get("X-Tenant"), "acme"},
		{"webhook-signature (signing off)", r.header.Get("Webhook-Signature"), ""},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}

	// No content type on the job: the default; defaults for method too.
	h2 := newHTTP(t, HTTPConfig{URL: srv.URL}, nil)
	job.ContentType = ""
	if res := h2.Deliver(context.Background(), job); res.Verdict != Done {
		t.Fatalf("Deliver: %v %v", res.Verdict, res.Err)
	}
	r = <-got
	if r.method != "POST" || r.header.Get("Content-Type") != DefaultContentType {
		t.Errorf("defaults: method %q Content-Type %q", r.method, r.header.Get("Content-Type"))
	}
}

func TestHTTPSigned(t *testing.T) {
	secrets := []string{newSecret(t), newSecret(t)}
	signer, err := NewSigner(secrets, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *http.Request, 1)
	bodies := make(chan []byte, 1)
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- b
	})
	job := testJob()
	before := time.Now().Unix()
	res := newHTTP(t, HTTPConfig{URL: srv.URL, Signing: signer}, nil).Deliver(context.Background(), job)
	if res.Verdict != Done {
		t.Fatalf("Deliver: %v %v", res.Verdict, res.Err)
	}
	r, body := <-got, <-bodies
	if id := r.Header.Get("webhook-id"); id != job.ID {
		t.Errorf("webhook-id = %q, want %q", id, job.ID)
	}
	ts := r.Header.Get("webhook-timestamp")
	if n, err := strconv.ParseInt(ts, 10, 64); err != nil || n < before || n > time.Now().Unix() {
		t.Errorf("webhook-timestamp = %q, want now", ts)
	}
	for i, sec := range secrets {
		if !verifyStandardWebhook(t, decodeWhsec(t, sec), r.Header.Get("webhook-id"), ts, body, r.Header.Get("webhook-signature")) {
			t.Errorf("secret %d: no valid signature in %q", i, r.Header.Get("webhook-signature"))
		}
	}
}

func TestHTTPTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		// The request context ends on a client disconnect only once the
		// body is read (net/http starts its background read then).
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done(): // the client gave up and closed the connection
		case <-release:
		}
	})
	defer close(release) // runs before the server's cleanup
	const timeout = 200 * time.Millisecond
	res := newHTTP(t, HTTPConfig{URL: srv.URL, Timeout: timeout}, nil).Deliver(context.Background(), testJob())
	if res.Verdict != Retry || res.Status != 0 {
		t.Fatalf("verdict %v status %d, want retry 0 (err %v)", res.Verdict, res.Status, res.Err)
	}
	if !errors.Is(res.Err, context.DeadlineExceeded) || !strings.Contains(res.Err.Error(), "timed out") {
		t.Errorf("err = %v, want a timeout", res.Err)
	}
	// Real clock, honest tolerance: never early, and not much later.
	if res.Took < timeout || res.Took > timeout+time.Second {
		t.Errorf("Took = %v, want ≈ %v", res.Took, timeout)
	}
}

func TestHTTPCallerCancel(t *testing.T) {
	release := make(chan struct{})
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	res := newHTTP(t, HTTPConfig{URL: srv.URL}, nil).Deliver(ctx, testJob())
	if res.Verdict != Retry || !errors.Is(res.Err, context.Canceled) {
		t.Errorf("verdict %v err %v, want retry with context.Canceled", res.Verdict, res.Err)
	}
	if res.Took > 5*time.Second {
		t.Errorf("Took = %v: cancel was not honoured", res.Took)
	}
}

// hijack takes the connection away from net/http and closes it, with an
// RST if reset is set, without answering.
func hijack(t *testing.T, reset bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		if reset {
			if err := conn.(*net.TCPConn).SetLinger(0); err != nil {
				t.Errorf("SetLinger: %v", err)
			}
		}
		_ = conn.Close()
	}
}

func TestHTTPConnectionErrors(t *testing.T) {
	closedAddr := testenv.ClosedAddr(t)

	steps := []struct {
		name string
		url  func(t *testing.T) string
		want []string // one of them in the error
	}{
		{"reset", func(t *testing.T) string { return serve(t, hijack(t, true)).URL }, []string{"reset", "broken pipe"}},
		{"EOF", func(t *testing.T) string { return serve(t, hijack(t, false)).URL }, []string{"EOF", "reset", "broken pipe"}},
		{"refused", func(*testing.T) string { return "http://" + closedAddr }, []string{"refused"}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			res := newHTTP(t, HTTPConfig{URL: s.url(t), Timeout: 5 * time.Second}, nil).Deliver(context.Background(), testJob())
			if res.Verdict != Retry || res.Status != 0 || res.Err == nil {
				t.Fatalf("verdict %v status %d err %v, want retry, 0, an error", res.Verdict, res.Status, res.Err)
			}
			if !slices.ContainsFunc(s.want, func(w string) bool { return strings.Contains(res.Err.Error(), w) }) {
				t.Errorf("err = %v, want it to mention one of %q", res.Err, s.want)
			}
			t.Logf("err: %v", res.Err)
		})
	}
}

func TestHTTPErrorHidesSecrets(t *testing.T) {
	res := newHTTP(t, HTTPConfig{URL: "http://user:pw@127.0.0.1:1/p?api_key=SECRET", Timeout: time.Second}, nil).
		Deliver(context.Background(), testJob())
	if res.Err == nil {
		t.Fatal("no error")
	}
	if msg := res.Err.Error(); strings.Contains(msg, "SECRET") || strings.Contains(msg, "pw") {
		t.Errorf("error leaks credentials: %v", msg)
	}
}

// TestHTTPConnectionReuse proves that bodies are drained: every request of
// a sequence rides the same connection, unless the body is over the drain
// bound.
func TestHTTPConnectionReuse(t *testing.T) {
	for _, s := range []struct {
		name     string
		bodySize int
		wantNew  int32
	}{
		{"small bodies reuse", 10 << 10, 1},
		{"huge bodies do not", 1 << 20, 5},
	} {
		t.Run(s.name, func(t *testing.T) {
			var conns atomic.Int32
			body := bytes.Repeat([]byte("x"), s.bodySize)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write(body)
			}))
			srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
				if st == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Start()
			t.Cleanup(srv.Close)
			h := newHTTP(t, HTTPConfig{URL: srv.URL}, nil)
			for range 5 {
				if res := h.Deliver(context.Background(), testJob()); res.Verdict != Done {
					t.Fatalf("Deliver: %v %v", res.Verdict, res.Err)
				}
			}
			if n := conns.Load(); n != s.wantNew {
				t.Errorf("%d connections for 5 requests, want %d", n, s.wantNew)
			}
		})
	}
}

func TestHTTPConcurrent(t *testing.T) {
	var hits atomic.Int32
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	h := newHTTP(t, HTTPConfig{URL: srv.URL, Headers: map[string]string{"X-A": "1"}}, nil)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			job := testJob()
			job.ID = strconv.Itoa(i)
			if res := h.Deliver(context.Background(), job); res.Verdict != Done {
				t.Errorf("job %d: %v %v", i, res.Verdict, res.Err)
			}
		})
	}
	wg.Wait()
	if n := hits.Load(); n != 64 {
		t.Errorf("hits = %d, want 64", n)
	}
}

func TestNewHTTPValidation(t *testing.T) {
	steps := []struct {
		name string
		cfg  HTTPConfig
		want string
	}{
		{"no url", HTTPConfig{}, "URL: required"},
		{"bad scheme", HTTPConfig{URL: "ftp://x/"}, `URL: scheme "ftp"`},
		{"relative", HTTPConfig{URL: "/hook"}, "URL: scheme"},
		{"no host", HTTPConfig{URL: "http:///hook"}, "has no host"},
		{"unparsable", HTTPConfig{URL: "http://[::1/"}, "URL:"},
		{"bad method", HTTPConfig{URL: "http://x/", Method: "PO ST"}, "Method:"},
		{"negative timeout", HTTPConfig{URL: "http://x/", Timeout: -time.Second}, "Timeout:"},
		{"negative max inflight", HTTPConfig{URL: "http://x/", MaxInflight: -1}, "MaxInflight:"},
		{"bad header name", HTTPConfig{URL: "http://x/", Headers: map[string]string{"a b": "1"}}, "Headers:"},
		{"header injection", HTTPConfig{URL: "http://x/", Headers: map[string]string{"X-A": "1\r\nX-B: 2"}}, "control character"},
		{"reserved header", HTTPConfig{URL: "http://x/", Headers: map[string]string{"idempotency-key": "k"}}, "cannot be configured"},
		{"host header", HTTPConfig{URL: "http://x/", Headers: map[string]string{"Host": "y"}}, "cannot be configured"},
		{"control in value", HTTPConfig{URL: "http://x/", Headers: map[string]string{"X-A": "a\x01b"}}, "control character"},
		{"delete in value", HTTPConfig{URL: "http://x/", Headers: map[string]string{"X-A": "a\x7fb"}}, "control character"},
		{"no hostname", HTTPConfig{URL: "http://:80/"}, "has no host"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			_, err := NewHTTP(s.cfg, nil)
			if err == nil || !strings.Contains(err.Error(), s.want) {
				t.Errorf("err = %v, want it to contain %q", err, s.want)
			}
		})
	}
}

func TestCheckStaticHeaders(t *testing.T) {
	ok := map[string]string{"Authorization": "Bearer x", "X-Tab": "a\tb", "User-Agent": "mine/1.0", "Content-Type": "application/json", "X-Empty": ""}
	if err := CheckStaticHeaders(ok); err != nil {
		t.Errorf("good headers refused: %v", err)
	}
	if err := CheckStaticHeaders(nil); err != nil {
		t.Errorf("no headers refused: %v", err)
	}
	steps := []struct {
		headers map[string]string
		want    string
	}{
		{map[string]string{"Bad Header": "x"}, `"Bad Header" is not a valid header name`},
		{map[string]string{"X-Ü": "x"}, `"X-Ü" is not a valid header name`},
		{map[string]string{"": "x"}, `"" is not a valid header name`},
		{map[string]string{"webhook-signature": "v1,x"}, `"webhook-signature" is set by the target`},
		{map[string]string{"transfer-encoding": "chunked"}, `"transfer-encoding" is set by the target`},
		{map[string]string{"X-A": "1\nX-B: 2"}, `value of "X-A" contains a control character`},
		{map[string]string{"X-A": "nul\x00"}, `value of "X-A" contains a control character`},
		// The first bad header in name order is named, whatever the map order.
		{map[string]string{"Z z": "x", "A a": "x", "M m": "x"}, `"A a"`},
	}
	for _, s := range steps {
		err := CheckStaticHeaders(s.headers)
		if err == nil || !strings.Contains(err.Error(), s.want) {
			t.Errorf("CheckStaticHeaders(%q) = %v, want it to contain %q", s.headers, err, s.want)
		}
	}
}

func TestHTTPTransport(t *testing.T) {
	h := newHTTP(t, HTTPConfig{URL: "http://example.test/"}, NewGuard(nil))
	if h.transport.Proxy != nil {
		t.Error("transport uses a proxy: the guard would check the proxy's address, not the target's")
	}
	if h.transport.MaxIdleConnsPerHost < 256 {
		t.Errorf("MaxIdleConnsPerHost = %d", h.transport.MaxIdleConnsPerHost)
	}
	if h.timeout != DefaultHTTPTimeout || h.method != http.MethodPost {
		t.Errorf("defaults: timeout %v method %s", h.timeout, h.method)
	}
	// A lane with more deliveries at once than the default pool keeps as
	// many warm connections.
	big := newHTTP(t, HTTPConfig{URL: "http://example.test/", MaxInflight: 1000}, nil)
	if n := big.transport.MaxIdleConnsPerHost; n != 1000 {
		t.Errorf("MaxInflight 1000: MaxIdleConnsPerHost = %d, want 1000", n)
	}
}

// TestHTTPRequestBodies: every delivery copies one request made at start;
// each must still carry its own body and length, an empty one included,
// and be replayable (GetBody) when a kept-alive connection was closed
// under it.
func TestHTTPRequestBodies(t *testing.T) {
	type seen struct {
		body   string
		length int64
	}
	got := make(chan seen, 64)
	srv := serve(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{string(b), r.ContentLength}
	})
	h := newHTTP(t, HTTPConfig{URL: srv.URL + "/hook"}, nil)
	for _, body := range []string{"first", "", "third, longer than the first"} {
		job := testJob()
		job.Payload = []byte(body)
		if res := h.Deliver(context.Background(), job); res.Verdict != Done {
			t.Fatalf("Deliver %q: %v %v", body, res.Verdict, res.Err)
		}
		if r := <-got; r.body != body || r.length != int64(len(body)) {
			t.Errorf("sent %q, server read %q with Content-Length %d", body, r.body, r.length)
		}
	}
	req := h.request(context.Background(), []byte("replay"))
	rc, err := req.GetBody()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(rc); string(b) != "replay" {
		t.Errorf("GetBody gave %q, want %q", b, "replay")
	}
	if req.URL.String() != srv.URL+"/hook" || req.Method != http.MethodPost {
		t.Errorf("request %s %s", req.Method, req.URL)
	}
	// Concurrent deliveries share the parsed URL and nothing else.
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			job := testJob()
			job.Payload = []byte(strconv.Itoa(i))
			if res := h.Deliver(context.Background(), job); res.Verdict != Done {
				t.Errorf("job %d: %v %v", i, res.Verdict, res.Err)
			}
		})
	}
	wg.Wait()
	close(got)
	var bodies []string
	for r := range got {
		bodies = append(bodies, r.body)
	}
	slices.Sort(bodies)
	if distinct := slices.Compact(slices.Clone(bodies)); len(bodies) != 32 || len(distinct) != 32 {
		t.Errorf("%d bodies, %d distinct, want 32: %v", len(bodies), len(distinct), bodies)
	}
}

// TestHTTPBasicAuthFromURL: the user info of target.http.url is sent as
// Basic Authorization to that URL, as http.Client did, unless the request
// has an Authorization of its own (a configured header); a job sent
// elsewhere (its own path) does not get it.
func TestHTTPBasicAuthFromURL(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	withUser := strings.Replace(srv.URL, "http://", "http://user:pw@", 1) + "/p"
	plain := newHTTP(t, HTTPConfig{URL: withUser, Timeout: time.Second}, nil)
	configured := newHTTP(t, HTTPConfig{URL: withUser, Timeout: time.Second, Headers: map[string]string{"Authorization": "Bearer x"}}, nil)
	for _, d := range []struct {
		h   *HTTP
		job Job
	}{
		{plain, testJob()},
		{plain, Job{ID: "j2", Payload: []byte("x"), Dest: dest.Request{Path: "sub"}}},
		{configured, testJob()},
	} {
		if res := d.h.Deliver(context.Background(), d.job); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	want := []string{"/p Basic dXNlcjpwdw==", "/p/sub ", "/p Bearer x"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		t.Errorf("Authorization sent: %q, want %q", got, want)
	}
}

// TestHTTPHugeAnswerHeaders: a target that answers with huge headers
// neither holds megabytes per delivery nor puts them in the attempt's
// error, which goes into logs, dead letters and their listings: an
// answer whose headers are over maxAnswerHeader bytes is a failed attempt,
// and a long reason phrase or Location is cut in the error; a Location that
// is not a URL is not shown at all (it may hold a token).
func TestHTTPHugeAnswerHeaders(t *testing.T) {
	t.Parallel()
	// A raw server: net/http writes no reason phrase of its own choosing.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	answers := map[string]string{
		"/reason":   "HTTP/1.1 500 " + strings.Repeat("r", 60<<10) + "\r\nContent-Length: 0\r\n\r\n",
		"/location": "HTTP/1.1 302 Found\r\nLocation: /" + strings.Repeat("l", 60<<10) + "\r\nContent-Length: 0\r\n\r\n",
		"/headers":  "HTTP/1.1 200 OK\r\nX-Junk: " + strings.Repeat("j", 4<<20) + "\r\nContent-Length: 0\r\n\r\n",
		// Not a URL (an IPv6 host left open), with a token in it.
		"/badlocation": "HTTP/1.1 302 Found\r\nLocation: http://[::1%zz/cb?token=SECRET\r\nContent-Length: 0\r\n\r\n",
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, answers[req.URL.Path])
			}()
		}
	}()
	base := "http://" + ln.Addr().String()
	for _, tc := range []struct {
		path    string
		verdict Verdict
	}{{"/reason", Retry}, {"/location", Dead}, {"/headers", Retry}, {"/badlocation", Dead}} {
		t.Run(tc.path, func(t *testing.T) {
			res := newHTTP(t, HTTPConfig{URL: base + tc.path, Timeout: 5 * time.Second}, nil).Deliver(context.Background(), testJob())
			if res.Verdict != tc.verdict || res.Err == nil {
				t.Fatalf("verdict %v, err %v; want %v with an error", res.Verdict, res.Err, tc.verdict)
			}
			if n := len(res.Err.Error()); n > 1024 {
				t.Errorf("the error is %d bytes; want at most 1024", n)
			}
			if strings.Contains(res.Err.Error(), "SECRET") {
				t.Errorf("the error shows the Location's token: %v", res.Err)
			}
		})
	}
}
