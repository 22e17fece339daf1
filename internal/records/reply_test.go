package records_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/records"
	"github.com/throttler/throttler/internal/testenv"
)

// TestSubjectToken: every job id becomes one subject token (no '.', '*',
// '>', space or empty token), the same id always the same token and two
// ids never the same one; a plain id stays readable.
func TestSubjectToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ id, want string }{
		{"order-1", "order-1"},
		{"A_b-9", "A_b-9"},
		{"a.b", "~" + base64.RawURLEncoding.EncodeToString([]byte("a.b"))},
		{"*", "~Kg"},
		{">", "~Pg"},
		{"~Kg", "~" + base64.RawURLEncoding.EncodeToString([]byte("~Kg"))},
		{"a b", "~YSBi"},
		{"$JS", "~JEpT"},
	} {
		if got := api.SubjectToken(tc.id); got != tc.want {
			t.Errorf("SubjectToken(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
	seen := map[string]string{}
	for _, id := range []string{"a.b*c>d", "order-1", "~order-1", "x", "~eA", "a/b", "a:b", strings.Repeat("z.", 127) + "z"} {
		tok := api.SubjectToken(id)
		if tok == "" || strings.ContainsAny(tok, ".*> \t") {
			t.Errorf("SubjectToken(%q) = %q: not one token", id, tok)
		}
		if other, dup := seen[tok]; dup {
			t.Errorf("ids %q and %q share token %q", other, id, tok)
		}
		seen[tok] = id
	}
	if got := records.ResultsSubject("demo", "a.b"); got != "throttler.results.demo.~YS5i" {
		t.Errorf("ResultsSubject(demo, a.b) = %q", got)
	}
}

// TestReplyCheck: a reply subject passes only under a listed prefix at a
// token boundary, and never when it is malformed, the throttler's, the
// server's, or inside a worker's inbox, whatever the prefixes.
func TestReplyCheck(t *testing.T) {
	t.Parallel()
	r, err := records.NewReplies(records.ReplyRules{Prefixes: []string{"replies", "_INBOX", "acme.results"},
		Workers: map[string][]string{"renders": {"render-1"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"replies", "replies.shop.1", "_INBOX.shop.x", "acme.results", "acme.results.a.b", "replies.~YS5i", "replies.a-b_c"} {
		if err := r.Check(s); err != nil {
			t.Errorf("Check(%q): %v, want allowed", s, err)
		}
	}
	for _, s := range []string{
		"",                                        // empty
		"replies." + strings.Repeat("x", 250),     // over MaxReplyLen
		"replies.*", "replies.>", "replies.a.*.b", // wildcards
		"replies..x", "replies.", ".replies", // empty tokens
		"replies.$x", "$JS.API.STREAM.LIST", "$KV.THROTTLER_LIMITS.x", "$SYS.REQ.SERVER.PING", // '$'
		"replies.a b", "replies.\x7f", "replies.\tx", "replies.é", // not printable ASCII
		"throttle.demo", "throttle.demo.key", "throttler.results.demo.x", "throttler.control.demo", // the throttler's
		"throttle_retry.demo", "throttle_dead.demo", "_INBOX_throttler.x",
		"_INBOX.render-1.x", "_INBOX.render-1", // a worker's inbox
		"repliesX.y", "replie", "acme", "acme.resultsX", "other.x", // no prefix at a token boundary
	} {
		err := r.Check(s)
		var re *records.ReplyError
		if !errors.Is(err, records.ErrReplyRefused) || !errors.As(err, &re) {
			t.Errorf("Check(%q): %v, want a *ReplyError", s, err)
		}
	}
	// A pull-mode lane that names no worker user answers any inbox: no
	// inbox is a reply subject then.
	anyInbox, err := records.NewReplies(records.ReplyRules{Prefixes: []string{"replies"}, Workers: map[string][]string{"renders": nil}})
	if err != nil {
		t.Fatal(err)
	}
	if err := anyInbox.Check("_INBOX.shop.x"); err == nil {
		t.Error("an inbox passed while a pull lane names no worker")
	}
	var none *records.Replies
	if err := none.Check("replies.x"); !errors.Is(err, records.ErrReplyRefused) {
		t.Errorf("no prefixes: %v, want refused", err)
	}
}

// TestReplyPrefixes: a prefix that is itself forbidden, or not a plain
// subject, is refused with its index.
func TestReplyPrefixes(t *testing.T) {
	t.Parallel()
	workers := map[string][]string{"renders": {"render-1"}}
	for _, p := range []string{"throttler", "throttler.results", "throttle.demo", "throttle_dead", "_INBOX_throttler", "$JS", "$JS.API", "$SYS",
		"_INBOX.render-1", "_INBOX.render-1.x", "replies.", "replies.>", "replies.*", ">", "a..b", "", "a b"} {
		_, err := records.NewReplies(records.ReplyRules{Prefixes: []string{"ok", p}, Workers: workers})
		var pe *records.PrefixError
		if !errors.As(err, &pe) || pe.Index != 1 || !errors.Is(err, records.ErrReplyRefused) {
			t.Errorf("prefix %q: %v, want a PrefixError at [1]", p, err)
		}
	}
	if _, err := records.NewReplies(records.ReplyRules{Prefixes: []string{"_INBOX"}, Workers: map[string][]string{"renders": nil}}); err == nil {
		t.Error("_INBOX accepted while a pull lane names no worker")
	}
}

// heard collects the records published on a subject.
type heard struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func listen(t *testing.T, nc *nats.Conn, subject string) *heard {
	t.Helper()
	h := &heard{}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		h.mu.Lock()
		h.msgs = append(h.msgs, m)
		h.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *heard) records(t *testing.T) []api.JobRecord {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []api.JobRecord
	for _, m := range h.msgs {
		rec, err := records.Decode(m.Data)
		if err != nil {
			t.Fatalf("%s: %v", m.Subject, err)
		}
		if m.Subject != records.ResultsSubject(rec.Lane, rec.ID) && m.Subject != rec.Reply {
			t.Errorf("record of %s heard on %s", rec.ID, m.Subject)
		}
		if m.Header.Get(records.HeaderJobID) != rec.ID || m.Header.Get(records.HeaderState) != string(rec.State) || m.Header.Get(records.HeaderLane) != rec.Lane {
			t.Errorf("headers %v for record %s %s", m.Header, rec.ID, rec.State)
		}
		out = append(out, rec)
	}
	return out
}

func (h *heard) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.msgs)
}

// TestSettledRecordsArePublished: every write that settles a record
// (delivered by Finish, dead, cancelled, expired) publishes it on the
// lane's results subject, and on its reply subject when the lane allows
// it; a retry publishes nothing, and a reply subject the lane refuses gets
// nothing even when a record holds it.
func TestSettledRecordsArePublished(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	nc, _ := testenv.JetStream(t, srv.ClientURL())
	s, err := records.New(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	replies, err := records.NewReplies(records.ReplyRules{Prefixes: []string{"replies"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureLane(ctx, records.LaneSpec{Name: "demo", Keep: time.Hour, MaxRecord: 1 << 20, Replies: replies}); err != nil {
		t.Fatal(err)
	}
	listener, _ := testenv.JetStream(t, srv.ClientURL())
	results := listen(t, listener, "throttler.results.demo.>")
	reply := listen(t, listener, "replies.>")
	refused := listen(t, listener, "elsewhere.>")
	now := time.Now().UTC()

	start := func(id, replyTo string) records.Claim {
		c, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: id, Fresh: true, Stored: now, Now: now, Reply: replyTo})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	finish := func(c records.Claim, state api.JobState) {
		if _, err := s.Finish(ctx, c, func(r *api.JobRecord) { r.State = state }); err != nil {
			t.Fatal(err)
		}
	}
	// Retried, then delivered: one record, the final one.
	c := start("job.1", "replies.shop.1")
	finish(c, api.StateRetrying)
	finish(start("job.1", "replies.shop.1"), api.StateDelivered)
	// Dead.
	finish(start("d", "replies.shop.d"), api.StateDead)
	// Cancelled before any claim (a job stored without a record):
	// published at once, then again when the drain meets it, on the reply
	// subject the drain knows.
	if _, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: "c", Stored: now}, records.Everyone, now); err != nil {
		t.Fatal(err)
	}
	// A job published over NATS, cancelled before any claim: its reply
	// subject, when the lane allows it, hears the cancel at once.
	if _, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: "n", Reply: "replies.shop.n", Stored: now}, records.Everyone, now); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.CancelStored(ctx, records.Waiting{Lane: "demo", ID: "n2", Reply: "elsewhere.n2", Stored: now}, records.Everyone, now); err != nil || rec.Reply != "" {
		t.Fatalf("cancel of a waiting job naming a refused reply: %+v, %v; want no reply kept", rec, err)
	}
	if _, err := s.Start(ctx, records.Attempt{Lane: "demo", ID: "c", Fresh: true, Stored: now, Now: now, Reply: "replies.shop.c"}); !errors.Is(err, records.ErrNotStartable) {
		t.Fatalf("start of a cancelled job: %v", err)
	}
	// Expired by the scheduler's hook.
	hook := records.NewHook(s, nil)
	hook.Expired("demo", "e", "replies.shop.e")
	// A delayed job keeps its reply from the moment it is scheduled, so a
	// cancel of it answers there; a refused one is not kept.
	hook.Scheduled("demo", "s", now, "replies.shop.s")
	if _, err := s.Cancel(ctx, "demo", "s", records.Everyone, now); err != nil {
		t.Fatal(err)
	}
	hook.Scheduled("demo", "s2", now, "elsewhere.s2")
	if rec, _, err := s.Get(ctx, "demo", "s2"); err != nil || rec.Reply != "" {
		t.Fatalf("scheduled with a refused reply: %+v, %v; want no reply kept", rec, err)
	}
	// A reply the lane refuses, held by a record: results only.
	finish(start("r", "elsewhere.x"), api.StateDelivered)
	// No reply: results only.
	finish(start("plain", ""), api.StateDelivered)

	testenv.Eventually(t, 10*time.Second, "the results of 10 settlements", func() bool { return results.count() >= 10 })
	// One connection publishes all: the last result heard means every
	// earlier message was heard too.
	got := map[string]api.JobState{}
	for _, r := range results.records(t) {
		got[r.ID] = r.State
	}
	want := map[string]api.JobState{"job.1": api.StateDelivered, "d": api.StateDead, "c": api.StateCancelled, "e": api.StateExpired,
		"s": api.StateCancelled, "r": api.StateDelivered, "plain": api.StateDelivered, "n": api.StateCancelled, "n2": api.StateCancelled}
	if len(got) != len(want) || results.count() != 10 {
		t.Fatalf("results: %v (%d messages), want %v", got, results.count(), want)
	}
	for id, st := range want {
		if got[id] != st {
			t.Errorf("result %s: %s, want %s", id, got[id], st)
		}
	}
	gotReply := map[string]string{}
	for _, r := range reply.records(t) {
		gotReply[r.Reply] = r.ID + " " + string(r.State)
	}
	wantReply := map[string]string{"replies.shop.1": "job.1 delivered", "replies.shop.d": "d dead", "replies.shop.c": "c cancelled",
		"replies.shop.e": "e expired", "replies.shop.s": "s cancelled", "replies.shop.n": "n cancelled"}
	if len(gotReply) != len(wantReply) || reply.count() != 6 {
		t.Fatalf("replies: %v (%d messages), want %v", gotReply, reply.count(), wantReply)
	}
	for k, v := range wantReply {
		if gotReply[k] != v {
			t.Errorf("reply on %s: %q, want %q", k, gotReply[k], v)
		}
	}
	if n := refused.count(); n != 0 {
		t.Errorf("%d records published on a refused reply subject", n)
	}
}
