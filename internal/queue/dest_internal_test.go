package queue

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/dest"
)

// TestDestRoundTrip: where a job goes survives its message (stored by the
// throttler, and published from outside in any header case), and a header
// sent twice becomes a value the target refuses instead of one of them.
func TestDestRoundTrip(t *testing.T) {
	t.Parallel()
	d := dest.Request{Method: "GET", Path: "repos/a?x=1", URL: "https://api.example.com/v2/x",
		Headers: map[string]string{"X-Api-Key": "k", "Accept": "application/json"}}
	got := decodeJob("demo", jobMsg(Job{ID: "a", Lane: "demo", Dest: d}).Header, nil, "", 1, true, time.Now()).Dest
	if got.Method != d.Method || got.Path != d.Path || got.URL != d.URL || !maps.Equal(got.Headers, d.Headers) {
		t.Errorf("trusted round trip: got %+v, want %+v", got, d)
	}
	outside := nats.Header{"throttle-path": {"a/b"}, "THROTTLE-METHOD": {"GET"}, "throttle-forward-x-api-key": {"k"}}
	got = decodeJob("demo", outside, nil, "", 1, false, time.Now()).Dest
	if got.Path != "a/b" || got.Method != "GET" || got.Headers["X-Api-Key"] != "k" {
		t.Errorf("outside job: got %+v", got)
	}
	twice := nats.Header{"Throttle-Path": {"a"}, "throttle-path": {"b"}, "Throttle-Url": {"x", "y"}}
	got = decodeJob("demo", twice, nil, "", 1, false, time.Now()).Dest
	if got.Path != refused || got.URL != refused {
		t.Errorf("headers sent twice: got %+v, want both refused", got)
	}
	if got := decodeJob("demo", nats.Header{"Content-Type": {"text/plain"}}, nil, "", 1, false, time.Now()).Dest; !got.IsZero() {
		t.Errorf("no destination headers: got %+v", got)
	}
}

// TestCallbackIsTheThrottlersOwn: a job's callback URL round-trips on the
// throttler's own subject, and a Throttler-Callback published on a public
// subject is ignored (a callback is checked at intake; a public publisher
// never names one).
func TestCallbackIsTheThrottlersOwn(t *testing.T) {
	const cb = "https://hooks.example.com/cb/1"
	h := jobMsg(Job{ID: "a", Lane: "demo", Callback: cb}).Header
	if got := decodeJob("demo", h, nil, "", 1, true, time.Now()).Callback; got != cb {
		t.Errorf("trusted: callback %q, want %q", got, cb)
	}
	if got := decodeJob("demo", h, nil, "", 1, false, time.Now()).Callback; got != "" {
		t.Errorf("public subject: callback %q, want none", got)
	}
}

// TestReplyIsKeptAsWritten: a Throttle-Reply published on a public subject
// is kept as written (the lane checks it before the job starts), carried
// on the throttler's own subject as Throttler-Reply, never taken from a
// Throttler-Reply on a public subject, and one sent twice or over its bound
// becomes a value every check refuses.
func TestReplyIsKeptAsWritten(t *testing.T) {
	t.Parallel()
	public := nats.Header{"throttle-reply": {"replies.shop.1"}}
	job := decodeJob("demo", public, nil, "", 1, false, time.Now())
	if job.Reply != "replies.shop.1" {
		t.Fatalf("public Throttle-Reply: %q", job.Reply)
	}
	if got := decodeJob("demo", jobMsg(job).Header, nil, "", 1, true, time.Now()).Reply; got != "replies.shop.1" {
		t.Errorf("stored by the throttler: reply %q", got)
	}
	if got := decodeJob("demo", nats.Header{HeaderReplyStored: {"replies.x"}}, nil, "", 1, false, time.Now()).Reply; got != "" {
		t.Errorf("Throttler-Reply on a public subject: %q, want ignored", got)
	}
	if got := decodeJob("demo", nats.Header{"Throttle-Reply": {"replies.x"}}, nil, "", 1, true, time.Now()).Reply; got != "" {
		t.Errorf("Throttle-Reply on the throttler's own subject: %q, want ignored", got)
	}
	for name, h := range map[string]nats.Header{
		"twice": {"Throttle-Reply": {"replies.a", "replies.b"}},
		"long":  {"Throttle-Reply": {"replies." + strings.Repeat("x", 300)}},
	} {
		if got := decodeJob("demo", h, nil, "", 1, false, time.Now()).Reply; got != UnusableReply {
			t.Errorf("%s: reply %q, want the refused marker", name, got)
		}
	}
}
