package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/config"
)

// TestResults: a lane's results are off without the key, on with the
// defaults for "results: {}", and every bad value is refused naming the
// file and the field.
func TestResults(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte(good), func(string) string { return "" })
	if err != nil || cfg.Lanes[0].Results != nil {
		t.Fatalf("without results: %+v, %v; want records off", cfg.Lanes[0].Results, err)
	}
	withResults := func(r string) string {
		return strings.Replace(good, "    burst: 10\n", "    burst: 10\n    results: "+r+"\n", 1)
	}
	cfg, err = config.Parse("t.yaml", []byte(withResults("{}")), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Lanes[0].Results; r == nil || r.Keep.D() != 24*time.Hour || r.MaxBody != 64<<10 || r.MaxWait.D() != time.Minute {
		t.Fatalf("results: {} gave %+v; want keep 24h, max_body 64KiB, max_wait 60s", r)
	}
	cfg, err = config.Parse("t.yaml", []byte(withResults("{keep: 1h, max_body: 1KiB, max_wait: 30s, headers: [x-request-id]}")), func(string) string { return "" })
	if r := cfg.Lanes[0].Results; err != nil || r.Keep.D() != time.Hour || r.MaxBody != 1024 || r.Headers[0] != "X-Request-Id" {
		t.Fatalf("results: %+v, %v", r, err)
	}
	for _, s := range []struct{ results, field string }{
		{"{keep: 500ms}", "lanes[0].results.keep"},
		{"{keep: 90s}", "lanes[0].results.keep"}, // under nats.dedup_window's 2m
		{"{keep: 400d}", "lanes[0].results.keep"},
		{"{max_body: 2MiB}", "lanes[0].results.max_body"},
		{"{max_wait: 16m}", "lanes[0].results.max_wait"},
		{"{max_wait: -1s}", "lanes[0].results.max_wait"},
		{`{headers: ["a b"]}`, "lanes[0].results.headers[0]"},
	} {
		_, err := config.Parse("t.yaml", []byte(withResults(s.results)), func(string) string { return "" })
		var ce *config.Error
		if !errors.As(err, &ce) || ce.File != "t.yaml" || !strings.HasPrefix(ce.Field, s.field) {
			t.Errorf("results: %s: %v; want an error naming t.yaml and %s", s.results, err, s.field)
		}
	}
	// An unknown key is refused like any other: the file, its line, the key.
	if _, err := config.Parse("t.yaml", []byte(withResults("{colour: 1}")), func(string) string { return "" }); err == nil ||
		!strings.Contains(err.Error(), "t.yaml") || !strings.Contains(err.Error(), "colour") {
		t.Errorf("results: {colour: 1}: %v; want it refused naming the file and the key", err)
	}
}

// TestResultsCallbacks: callback_urls and callback_lane go together; the
// callback lane exists, has an http target, and its job_urls cover every
// callback prefix. Each refusal names the file and the field.
func TestResultsCallbacks(t *testing.T) {
	conf := func(results, cbTarget string) string {
		return `
listen: 127.0.0.1:8080
lanes:
  - name: demo
    rate: 20
    burst: 10
    results: ` + results + `
    target: {http: {url: "http://127.0.0.1:9000/hook"}}
  - name: cb
    rate: 5
    burst: 1
    target: ` + cbTarget + `
`
	}
	const httpCB = `{http: {url: "https://hooks.example.com/", job_urls: ["https://hooks.example.com/v1", "https://other.example.com:8443/"]}}`
	cfg, err := config.Parse("t.yaml", []byte(conf(`{callback_urls: ["https://hooks.example.com/v1/cb", "https://other.example.com:8443/x"], callback_lane: cb}`, httpCB)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Lanes[0].Results; r.CallbackLane != "cb" || len(r.CallbackURLs) != 2 {
		t.Fatalf("results %+v", r)
	}
	for _, s := range []struct{ results, target, field string }{
		{`{callback_urls: ["https://hooks.example.com/v1"]}`, httpCB, "lanes[0].results.callback_lane"},
		{`{callback_lane: cb}`, httpCB, "lanes[0].results.callback_urls"},
		{`{callback_urls: ["https://hooks.example.com/v1?x=1"], callback_lane: cb}`, httpCB, "lanes[0].results.callback_urls[0]"},
		{`{callback_urls: ["ftp://hooks.example.com/v1"], callback_lane: cb}`, httpCB, "lanes[0].results.callback_urls[0]"},
		{`{callback_urls: ["https://hooks.example.com/v1"], callback_lane: nope}`, httpCB, "lanes[0].results.callback_lane"},
		{`{callback_urls: ["https://hooks.example.com/v1"], callback_lane: cb}`, `{nats: {subject: cb.out}}`, "lanes[0].results.callback_lane"},
		{`{callback_urls: ["https://hooks.example.com/v1"], callback_lane: cb}`, `{http: {url: "https://hooks.example.com/", method: PUT, job_urls: ["https://hooks.example.com/v1"]}}`, "lanes[0].results.callback_lane"},
		{`{callback_urls: ["https://hooks.example.com/v1"], callback_lane: cb}`, httpCB + "\n    per_key: {rate: 1, burst: 1}", "lanes[0].results.callback_lane"},
		{`{callback_urls: ["https://hooks.example.com/v1"], callback_lane: cb, max_body: 1MiB}`, httpCB + "\n    max_body: 1MiB", "lanes[1].max_body"},
		// Not under job_urls: another path, a path that only shares a
		// prefix of characters, another port, another scheme.
		{`{callback_urls: ["https://hooks.example.com/v1", "https://hooks.example.com/v2"], callback_lane: cb}`, httpCB, "lanes[0].results.callback_urls[1]"},
		{`{callback_urls: ["https://hooks.example.com/v10"], callback_lane: cb}`, httpCB, "lanes[0].results.callback_urls[0]"},
		{`{callback_urls: ["https://other.example.com/"], callback_lane: cb}`, httpCB, "lanes[0].results.callback_urls[0]"},
		{`{callback_urls: ["http://hooks.example.com/v1"], callback_lane: cb}`, httpCB, "lanes[0].results.callback_urls[0]"},
	} {
		_, err := config.Parse("t.yaml", []byte(conf(s.results, s.target)), nil)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.File != "t.yaml" || ce.Field != s.field {
			t.Errorf("results %s, callback target %s: %v; want an error naming t.yaml and %s", s.results, s.target, err, s.field)
		}
	}
}

// TestResultsReplySubjects: results.reply_subjects lists literal subject
// prefixes; one that is itself forbidden (the throttler's, the server's, a
// worker's inbox, every inbox while a pull lane names no worker), not a
// plain subject, or overlapping a lane's NATS target subject is refused
// naming the file and the prefix's field.
func TestResultsReplySubjects(t *testing.T) {
	conf := func(prefixes, workers string) string {
		return `
listen: 127.0.0.1:8080
nats: {user: t, password: p` + workers + `}
lanes:
  - name: demo
    rate: 20
    burst: 10
    results: {reply_subjects: ` + prefixes + `}
    target: {http: {url: "http://127.0.0.1:9000/hook"}}
  - name: renders
    rate: 5
    burst: 1
    target: {nats: {subject: renders.work, mode: pull}}
`
	}
	const named = `, workers: [{user: render-1, password: q, lanes: [renders]}]`
	cfg, err := config.Parse("t.yaml", []byte(conf(`[replies, _INBOX, "acme.results"]`, named)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Lanes[0].Results; len(r.ReplySubjects) != 3 || r.ReplySubjects[2] != "acme.results" {
		t.Fatalf("results %+v", r)
	}
	for _, s := range []struct{ prefixes, workers, field string }{
		{`[ok, throttler]`, named, "lanes[0].results.reply_subjects[1]"},
		{`[throttler.results.demo]`, named, "lanes[0].results.reply_subjects[0]"},
		{`[throttle.demo]`, named, "lanes[0].results.reply_subjects[0]"},
		{`[throttle_dead]`, named, "lanes[0].results.reply_subjects[0]"},
		{`[_INBOX_throttler]`, named, "lanes[0].results.reply_subjects[0]"},
		{`["$JS.API"]`, named, "lanes[0].results.reply_subjects[0]"},
		{`["$SYS"]`, named, "lanes[0].results.reply_subjects[0]"},
		{`["$KV"]`, named, "lanes[0].results.reply_subjects[0]"},
		{`[_INBOX.render-1]`, named, "lanes[0].results.reply_subjects[0]"},
		{`[_INBOX]`, "", "lanes[0].results.reply_subjects[0]"}, // renders names no worker: any inbox may be one
		{`["replies."]`, named, "lanes[0].results.reply_subjects[0]"},
		{`["replies.>"]`, named, "lanes[0].results.reply_subjects[0]"},
		{`["replies.*.x"]`, named, "lanes[0].results.reply_subjects[0]"},
		{`["a..b"]`, named, "lanes[0].results.reply_subjects[0]"},
		{`["a b"]`, named, "lanes[0].results.reply_subjects[0]"},
		{`[renders]`, named, "lanes[0].results.reply_subjects[0]"},          // covers renders.work
		{`[renders.work.ack]`, named, "lanes[0].results.reply_subjects[0]"}, // under it
		{`[ok, renders.work]`, named, "lanes[0].results.reply_subjects[1]"}, // it
	} {
		_, err := config.Parse("t.yaml", []byte(conf(s.prefixes, s.workers)), nil)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.File != "t.yaml" || ce.Field != s.field {
			t.Errorf("reply_subjects %s: %v; want an error naming t.yaml and %s", s.prefixes, err, s.field)
		}
	}
}
