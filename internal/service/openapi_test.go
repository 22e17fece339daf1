package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
)

// TestOpenAPIAnswersOfARunningServer sends real requests to a running
// service and checks each request and answer against docs/openapi.yaml
// (kin-openapi's openapi3filter): the route and status documented, the
// answer's content type listed, headers and bodies matching their schemas,
// problem bodies included. internal/ingest checks that the
// document lists exactly the router's routes.
func TestOpenAPIAnswersOfARunningServer(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		t.Fatal(err)
	}
	// The document's server is the default listen address; the routes are
	// matched on the path alone, whatever port the test's service took.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}

	rec := newRecorder(t)
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no", http.StatusBadRequest)
	}))
	t.Cleanup(refuse.Close)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 50, 10)
	slow, err := bucket.ParseRate("1/h")
	if err != nil {
		t.Fatal(err)
	}
	failing, full, recs := cfg.Lanes[0], cfg.Lanes[0], cfg.Lanes[0]
	failing.Name = "failing"
	failing.Target = config.Target{HTTP: &config.HTTPTarget{URL: refuse.URL, Method: "POST", Timeout: config.Duration(5 * time.Second)}}
	full.Name, full.Rate, full.Burst, full.MaxBacklog = "full", slow, 1, 1
	// recs keeps job records: its routes and answers are checked too.
	recs.Name, recs.Results = "recs", &config.Results{}
	cfg.Lanes = append(cfg.Lanes, failing, full, recs)
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	svc, _ := start(t, cfg)
	base := "http://" + svc.Addr()
	client := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer client.CloseIdleConnections()

	// call sends one request and validates it (valid requests only: a
	// request the test makes bad on purpose is checked for its answer
	// alone) and its answer.
	// wantStatus 0 takes any status; lastStatus is the latest one.
	var lastStatus int
	call := func(validRequest bool, method, path string, hdr map[string]string, body string, wantStatus int) []byte {
		t.Helper()
		newReq := func() *http.Request {
			var r io.Reader
			if body != "" {
				r = strings.NewReader(body)
			}
			req, err := http.NewRequest(method, base+path, r)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			return req
		}
		resp, err := client.Do(newReq())
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lastStatus = resp.StatusCode
		if wantStatus != 0 && resp.StatusCode != wantStatus {
			t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, got, wantStatus)
		}
		validate(t, router, newReq(), resp, got, validRequest)
		return got
	}
	// Submissions: admitted or queued, a duplicate, refusals.
	js := map[string]string{"Content-Type": "application/json", "Idempotency-Key": "order-1"}
	call(true, "POST", "/v1/lanes/demo/jobs", js, `{"n":1}`, 202)
	dup := call(true, "POST", "/v1/lanes/demo/jobs", js, `{"n":1}`, 202)
	if !strings.Contains(string(dup), `"duplicate":true`) {
		t.Fatalf("second submission: %s", dup)
	}
	call(true, "POST", "/v1/lanes/demo/jobs", nil, "", 202)
	call(false, "POST", "/v1/lanes/demo/jobs", map[string]string{"Idempotency-Key": "has space"}, "x", 400)
	call(true, "POST", "/v1/lanes/nope/jobs", nil, "x", 404)
	call(false, "POST", "/v1/lanes/demo/jobs", nil, strings.Repeat("x", 2<<20), 413)
	call(true, "POST", "/v1/lanes/demo/jobs:batch", map[string]string{"Content-Type": "application/json"},
		`[{"idempotency_key":"b-1","payload":{"n":1}},{"payload_base64":"AAE=","content_type":"application/octet-stream"}]`, 202)
	call(true, "POST", "/v1/lanes/demo/jobs:batch", map[string]string{"Content-Type": "application/json"},
		`[{"idempotency_key":"b-2","payload":2},{"idempotency_key":"has space","payload":3}]`, 400)
	// The full lane: one job admitted, one queued, then 429.
	call(true, "POST", "/v1/lanes/full/jobs", nil, "a", 202)
	for i := 0; ; i++ {
		call(true, "POST", "/v1/lanes/full/jobs", nil, "b", 0)
		if lastStatus == 429 {
			break
		}
		if i == 5 {
			t.Fatalf("the full lane took %d jobs", i+2)
		}
	}

	// Lanes and limits.
	call(true, "GET", "/v1/lanes", nil, "", 200)
	call(true, "GET", "/v1/lanes/demo/history", nil, "", 200)
	call(false, "GET", "/v1/lanes/nosuch/history", nil, "", 404)
	call(true, "PATCH", "/v1/lanes/demo", map[string]string{"Content-Type": "application/json"}, `{"rate":"60/s","burst":20}`, 200)
	call(true, "PATCH", "/v1/lanes/demo", map[string]string{"Content-Type": "application/json"}, `{"rate":40}`, 200)
	call(true, "PATCH", "/v1/lanes/demo", map[string]string{"Content-Type": "application/json"}, `{"rate":"fast"}`, 400)
	call(false, "PATCH", "/v1/lanes/demo", map[string]string{"Content-Type": "application/json"}, `{"speed":1}`, 400)
	call(true, "PATCH", "/v1/lanes/nope", map[string]string{"Content-Type": "application/json"}, `{"burst":2}`, 404)
	call(true, "PATCH", "/v1/lanes/demo", map[string]string{"Content-Type": "application/json"}, `{"paused":true}`, 200)
	call(true, "PATCH", "/v1/lanes/demo", map[string]string{"Content-Type": "application/json"}, `{"paused":false}`, 200)
	call(true, "PATCH", "/v1/lanes/demo", map[string]string{"Content-Type": "application/json"}, `{"paused":true,"burst":2}`, 400)
	// Without a callers section the caller routes do not exist: 404.
	call(true, "GET", "/v1/callers/plans", nil, "", 404)

	// Dead letters: the failing lane's target refuses every job for good.
	for i := range 3 {
		call(true, "POST", "/v1/lanes/failing/jobs", map[string]string{"Content-Type": "application/json", "Idempotency-Key": fmt.Sprintf("f-%d", i)}, `{"f":1}`, 202)
	}
	var page struct {
		Dead []struct {
			Seq uint64 `json:"seq"`
		} `json:"dead"`
	}
	waitFor(t, 20*time.Second, "3 dead letters", func() bool {
		page.Dead = nil
		_ = json.Unmarshal(call(true, "GET", "/v1/lanes/failing/dead", nil, "", 200), &page)
		return len(page.Dead) == 3
	})
	call(true, "GET", "/v1/lanes/failing/dead?limit=2", nil, "", 200)
	call(false, "GET", "/v1/lanes/failing/dead?limit=0", nil, "", 400)
	seq := fmt.Sprint(page.Dead[0].Seq)
	call(true, "GET", "/v1/lanes/failing/dead/"+seq, nil, "", 200)
	call(false, "GET", "/v1/lanes/failing/dead/abc", nil, "", 400)
	call(true, "GET", "/v1/lanes/failing/dead/999999", nil, "", 404)
	call(false, "POST", "/v1/lanes/failing/dead/"+seq+"/replay?key=a%2Fb", nil, "", 400)
	call(true, "POST", "/v1/lanes/failing/dead/"+seq+"/replay?key=k1", nil, "", 200)
	call(true, "DELETE", "/v1/lanes/failing/dead/"+fmt.Sprint(page.Dead[1].Seq), nil, "", 204)
	call(true, "POST", "/v1/lanes/failing/dead/replay?max=1", nil, "", 200)
	call(false, "POST", "/v1/lanes/failing/dead/replay?max=0", nil, "", 400)
	call(true, "POST", "/v1/lanes/failing/dead/replay?max=1&until=1", nil, "", 200)
	call(false, "POST", "/v1/lanes/failing/dead/replay?until=0", nil, "", 400)
	call(false, "POST", "/v1/lanes/failing/dead/replay?until=x", nil, "", 400)
	call(true, "POST", "/v1/lanes/failing/dead/replay", nil, "", 200)
	call(true, "DELETE", "/v1/lanes/failing/dead", nil, "", 204)
	call(true, "GET", "/v1/lanes/nope/dead", nil, "", 404)

	// Job records: a waited answer, a record, the list, a duplicate of a
	// delivered job (single and batch), cancels.
	ctJSON := map[string]string{"Content-Type": "application/json"}
	call(true, "POST", "/v1/lanes/recs/jobs?wait=10s", map[string]string{"Content-Type": "application/json", "Idempotency-Key": "r-1"}, `{"r":1}`, 200)
	call(true, "GET", "/v1/lanes/recs/jobs/r-1", nil, "", 200)
	call(true, "GET", "/v1/lanes/recs/jobs/r-1?wait=1s", nil, "", 200)
	call(true, "GET", "/v1/lanes/recs/jobs", nil, "", 200)
	call(true, "GET", "/v1/lanes/recs/jobs?state=delivered&limit=5", nil, "", 200)
	call(false, "GET", "/v1/lanes/recs/jobs?state=lost", nil, "", 400)
	call(true, "GET", "/v1/lanes/recs/jobs/nope", nil, "", 404)
	if b := call(true, "POST", "/v1/lanes/recs/jobs", map[string]string{"Content-Type": "application/json", "Idempotency-Key": "r-1"}, `{"r":1}`, 202); !bytes.Contains(b, []byte(`"state":"delivered"`)) {
		t.Errorf("a duplicate of a delivered job: %s", b)
	}
	call(true, "POST", "/v1/lanes/recs/jobs:batch", ctJSON, `[{"idempotency_key":"r-1","payload":{"r":1}},{"payload":{"r":2}}]`, 0)
	call(true, "DELETE", "/v1/lanes/recs/jobs/r-1", nil, "", 409)
	call(true, "POST", "/v1/lanes/recs/jobs", map[string]string{"Content-Type": "application/json", "Idempotency-Key": "r-2", "Throttle-Delay": "1h"}, `{"r":2}`, 202)
	call(true, "DELETE", "/v1/lanes/recs/jobs/r-2", nil, "", 200)
	call(true, "DELETE", "/v1/lanes/recs/jobs/nope", nil, "", 404)
	call(false, "POST", "/v1/lanes/recs/jobs?wait=forever", ctJSON, `{"r":3}`, 400)

	// Operations.
	call(true, "GET", "/v1/whoami", nil, "", 200)
	// GET /ui is checked by hand: the validator folds a trailing slash, so
	// it reads /ui as the page's own operation (GET /ui/, which generated
	// clients and routers that keep the slash need; before it was listed
	// the page matched no operation).
	if resp, err := client.Get(base + "/ui"); err != nil || resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "ui/" {
		t.Errorf("GET /ui: %v %v, want 301 to ui/", resp, err)
	} else {
		resp.Body.Close()
	}
	call(true, "GET", "/ui/", nil, "", 200)
	call(true, "GET", "/ui/app.js", nil, "", 200)
	call(true, "GET", "/ui/app.css", nil, "", 200)
	call(true, "GET", "/ui/icon.svg", nil, "", 200)
	call(true, "GET", "/ui/no-such-file", nil, "", 404)
	call(true, "GET", "/healthz", nil, "", 200)
	call(true, "GET", "/readyz", nil, "", 200)
	call(true, "GET", "/metrics", nil, "", 200)
	call(true, "GET", "/metrics", map[string]string{"Accept": "application/openmetrics-text; version=1.0.0"}, "", 200)
	if t.Failed() {
		t.Log("docs/openapi.yaml and the server disagree; fix whichever is wrong")
	}
}

// The answers that are not JSON (the status page's files, the metrics) are
// checked for their status, content type and headers; their bodies are
// read as text.
func init() {
	for _, ct := range []string{"text/html", "text/javascript", "text/css", "image/svg+xml", "application/openmetrics-text"} {
		openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder)
	}
}

// validate checks one exchange against the document: the request's route
// is documented, the request (when it is meant to be valid) matches its
// parameters and body, and the answer's status, content type, headers and
// body match what the operation lists. Every mismatch is an error of t.
func validate(t *testing.T, router routers.Router, req *http.Request, resp *http.Response, body []byte, validRequest bool) {
	t.Helper()
	ctx := context.Background()
	if req.Body != nil && req.Header.Get("Content-Type") == "" {
		// A body without a content type is application/octet-stream
		// (RFC 9110, 8.3), as the service reads it.
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Errorf("%s %s: not in docs/openapi.yaml: %v", req.Method, req.URL.Path, err)
		return
	}
	in := &openapi3filter.RequestValidationInput{
		Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{
			AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
			IncludeResponseStatus: true,
			MultiError:            true,
		},
	}
	fail := func(what string, err error) {
		var me openapi3.MultiError
		if errors.As(err, &me) {
			for _, e := range me {
				t.Errorf("%s %s → %d: %s: %v", req.Method, req.URL.Path, resp.StatusCode, what, e)
			}
		} else {
			t.Errorf("%s %s → %d: %s: %v", req.Method, req.URL.Path, resp.StatusCode, what, err)
		}
		t.Logf("answer: %s %s", resp.Header, body)
	}
	if validRequest {
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			fail("request", err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(body)), Options: in.Options,
	}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		fail("answer", err)
	}
}
