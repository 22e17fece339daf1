package queue

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestSubjectKey(t *testing.T) {
	for _, tc := range []struct {
		subject      string
		internal, ok bool
		key          string
	}{
		{"throttle.demo", false, true, ""},
		{"throttle.demo.cust-1", false, true, "cust-1"},
		{"throttle.demo.a.b", false, true, "a.b"},
		{"throttler.lane.demo", true, true, ""},
		{"throttler.lane.demo.k", true, true, "k"},
		{"throttle.demo2", false, false, ""},
		{"throttler.lane.demo2.k", false, false, ""},
		{"throttle.demo.", false, false, ""},
		{"throttler.control.demo", false, false, ""},
	} {
		internal, key, ok := subjectKey("demo", tc.subject)
		if internal != tc.internal || key != tc.key || ok != tc.ok {
			t.Errorf("subjectKey(%q) = %v %q %v, want %v %q %v", tc.subject, internal, key, ok, tc.internal, tc.key, tc.ok)
		}
	}
}

func TestValidJobID(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"order-1", true}, {"a#b", true}, {strings.Repeat("k", MaxJobID), true},
		{"", false}, {strings.Repeat("k", MaxJobID+1), false}, {"has space", false}, {"ctl\x01", false}, {"ünicode", false},
	} {
		if err := ValidJobID(tc.id); (err == nil) != tc.ok {
			t.Errorf("ValidJobID(%q) = %v, want ok=%v", tc.id, err, tc.ok)
		}
	}
}

// TestDecodeJob: a public subject tells an id (if valid) and a content
// type, nothing else; an internal one is believed within bounds.
func TestDecodeJob(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := func(kv ...string) nats.Header {
		out := nats.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	soon := now.Add(time.Minute).UnixMilli()
	hourAgo := now.Add(-time.Hour).UnixMilli()
	forged := h("Nats-Msg-Id", "m1", HeaderJobID, "victim", HeaderAttempts, "9", HeaderNotBefore, itoa(soon),
		HeaderNotify, "throttler.notify.abc", HeaderContentType, "text/plain", HeaderEnqueuedAt, itoa(hourAgo))
	j := decodeJob("demo", forged, []byte("x"), "k", 7, false, now)
	if j.ID != "m1" || j.Attempts != 0 || !j.NotBefore.IsZero() || j.Notify != "" || j.ContentType != "text/plain" || !j.Outside || j.Key != "k" ||
		!j.EnqueuedAt.IsZero() {
		t.Fatalf("public message decoded as %+v", j)
	}
	for id, want := range map[string]string{"AbCdEfGhIjK.8": "demo-7", "demo-9": "demo-7", "demo-09": "demo-09", "other-9": "other-9"} {
		if j := decodeJob("demo", h("Nats-Msg-Id", id), nil, "", 7, false, now); j.ID != want {
			t.Errorf("public message with Nats-Msg-Id %q decoded with id %q, want %q (the throttler's ids are not a publisher's)", id, j.ID, want)
		}
	}
	j = decodeJob("demo", forged, nil, "", 7, true, now)
	if j.ID != "victim" || j.Attempts != 9 || j.NotBefore.UnixMilli() != soon || j.Notify != "throttler.notify.abc" || j.Outside ||
		j.EnqueuedAt.UnixMilli() != hourAgo {
		t.Fatalf("internal message decoded as %+v", j)
	}
	bad := h("Nats-Msg-Id", "bad id", HeaderJobID, "ctl\x01", HeaderAttempts, "99999999999", HeaderNotBefore, "99999999999999",
		HeaderNotify, "throttler.control.demo", HeaderContentType, "a\r\nb", HeaderEnqueuedAt, itoa(now.Add(2*time.Minute).UnixMilli()))
	j = decodeJob("demo", bad, nil, "", 42, true, now)
	if j.ID != "demo-42" || j.Attempts != 0 || !j.NotBefore.IsZero() || j.Notify != "" || j.ContentType != "" || !j.EnqueuedAt.IsZero() {
		t.Fatalf("out-of-bounds headers decoded as %+v", j)
	}
}

// TestDecodeJobOwner: a job's owner is believed only from the throttler's
// own subject, of a job it took over HTTP: never from a public subject,
// nor from a public job the throttler moved (Throttler-Via: nats), and
// jobMsg never writes one for such a job.
func TestDecodeJobOwner(t *testing.T) {
	now := time.Now()
	h := nats.Header{}
	h.Set(HeaderOwner, "victim")
	if j := decodeJob("demo", h, nil, "", 1, false, now); j.Owner != "" {
		t.Errorf("public subject: owner %q", j.Owner)
	}
	if j := decodeJob("demo", h, nil, "", 1, true, now); j.Owner != "victim" {
		t.Errorf("internal subject: owner %q, want victim", j.Owner)
	}
	moved := nats.Header{}
	moved.Set(HeaderOwner, "victim")
	moved.Set(HeaderVia, "nats")
	if j := decodeJob("demo", moved, nil, "", 1, true, now); j.Owner != "" || !j.Outside {
		t.Errorf("moved public job: owner %q, outside %v", j.Owner, j.Outside)
	}
	if m := jobMsg(Job{ID: "x", Lane: "demo", Outside: true, Owner: "victim"}); m.Header.Get(HeaderOwner) != "" {
		t.Errorf("jobMsg wrote an owner for a job from outside: %v", m.Header)
	}
	m := jobMsg(Job{ID: "x", Lane: "demo", Owner: "shop"})
	if j := decodeJob("demo", m.Header, nil, "", 1, true, now); j.Owner != "shop" {
		t.Errorf("round trip: owner %q, want shop", j.Owner)
	}
	bad := nats.Header{}
	bad.Set(HeaderOwner, "has space")
	if j := decodeJob("demo", bad, nil, "", 1, true, now); j.Owner != "" {
		t.Errorf("out-of-bounds owner decoded as %q", j.Owner)
	}
}

func TestNotifyAddress(t *testing.T) {
	for in, want := range map[string]string{
		"throttler.notify.abc-1_Z":                    "throttler.notify.abc-1_Z",
		"throttler.notify.":                           "",
		"throttler.notify.a.b":                        "",
		"throttler.control.demo":                      "",
		"throttler.notify." + strings.Repeat("a", 65): "",
	} {
		if got := notifyAddress(in); got != want {
			t.Errorf("notifyAddress(%q) = %q, want %q", in, got, want)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
