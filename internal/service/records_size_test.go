package service_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// TestRecordOfAnAnswerThatEscapesLong: a target's answer of max_body bytes
// that JSON escapes six bytes each (<, >, &, control characters: valid
// UTF-8) still fits the record (results: twice max_body and 64KiB): it is
// kept as body_base64. Else the record's settling write was refused by its
// bucket, and the delivered job's record said in_flight until keep, its
// waiting caller was never answered and its callback never sent.
func TestRecordOfAnAnswerThatEscapesLong(t *testing.T) {
	t.Parallel()
	answer := strings.Repeat("<\x01", 16<<10) // 32KiB
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = fmt.Fprint(w, answer)
	}))
	t.Cleanup(target.Close)
	svc := resultsLane(t, `{keep: 1h, max_body: 32KiB, max_wait: 20s}`, target.URL)
	c := callJob(t, "POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs?wait=15s", "escapes-1", "x")
	if c.code != http.StatusOK || string(c.body) != answer || c.header.Get("Throttle-Job-State") != "delivered" {
		t.Fatalf("waited answer: %d %s, %d bytes; want 200 delivered with the target's %d bytes", c.code, c.header.Get("Throttle-Job-State"), len(c.body), len(answer))
	}
	code, rec := getRecord(t, svc.Addr(), "demo", "escapes-1")
	if code != http.StatusOK || rec.State != api.StateDelivered || rec.Response == nil || rec.Response.BodyBase64 == "" {
		t.Fatalf("record: %d %+v; want delivered, its answer in body_base64", code, rec)
	}
}

// TestRecordOfAnswerHeadersThatEscapeLong: the headers a record keeps
// (Content-Type and results.headers) are bounded once JSON-escaped: a
// target's listed header of tens of KiB of '<' (within the answer's 64KiB
// of headers) is left out of the record rather than make its bucket
// refuse the settling write.
func TestRecordOfAnswerHeadersThatEscapeLong(t *testing.T) {
	t.Parallel()
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Small", "kept")
		w.Header().Set("X-Big", strings.Repeat("<", 40<<10))
		_, _ = fmt.Fprint(w, "ok")
	}))
	t.Cleanup(target.Close)
	svc := resultsLane(t, `{keep: 1h, max_body: 0, max_wait: 20s, headers: [X-Big, X-Small]}`, target.URL)
	c := callJob(t, "POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs?wait=15s", "headers-1", "x")
	if c.code != http.StatusOK || c.header.Get("Throttle-Job-State") != "delivered" {
		t.Fatalf("waited answer: %d %q; want 200 delivered", c.code, c.header.Get("Throttle-Job-State"))
	}
	code, rec := getRecord(t, svc.Addr(), "demo", "headers-1")
	if code != http.StatusOK || rec.State != api.StateDelivered || rec.Response == nil ||
		rec.Response.Headers["X-Small"] != "kept" || rec.Response.Headers["Content-Type"] != "text/plain" || rec.Response.Headers["X-Big"] != "" {
		t.Fatalf("record: %d %+v; want delivered with Content-Type and X-Small, without X-Big", code, rec)
	}
}

// resultsLane runs one instance with lane demo (50/s, burst 5) keeping
// records with results (a YAML flow mapping), delivering to target, on a
// nats-server and a Redis of its own.
func resultsLane(t *testing.T, results, target string) *service.Service {
	t.Helper()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	y := configHead(t, natsSrv.ClientURL(), redis.URL()) + fmt.Sprintf(`lanes:
  - name: demo
    rate: 50
    burst: 5
    results: %s
    target: {http: {url: %q}}
`, results, target)
	cfg, err := config.Parse("size.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), prometheus.NewRegistry())
	servicetest.Run(t, svc)
	return svc
}
