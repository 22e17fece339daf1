package dispatch_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/testenv"
)

// TestParseOutcome: every status of the pull protocol, and what is refused.
func TestParseOutcome(t *testing.T) {
	h := func(kv ...string) nats.Header {
		out := nats.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		header    nats.Header
		want      dispatch.Result
		progress  bool
		wantErr   string
		workerErr string
	}{
		{"no status is done", h(), dispatch.Result{Verdict: dispatch.Done}, false, "", ""},
		{"done", h("Throttler-Status", "DONE "), dispatch.Result{Verdict: dispatch.Done}, false, "", ""},
		{"retry", h("Throttler-Status", "retry", "Throttler-Error", "db down"), dispatch.Result{Verdict: dispatch.Retry}, false, "", "db down"},
		{"retry after", h("Throttler-Status", "retry", "Retry-After", "2.5"), dispatch.Result{Verdict: dispatch.Retry, RetryAfter: 2500 * time.Millisecond}, false, "", ""},
		{"retry after 0 leaves the backoff", h("Throttler-Status", "retry", "Retry-After", "0"), dispatch.Result{Verdict: dispatch.Retry}, false, "", ""},
		{"retry after is capped", h("Throttler-Status", "retry", "Retry-After", "86400"), dispatch.Result{Verdict: dispatch.Retry, RetryAfter: dispatch.MaxPause}, false, "", ""},
		{"bad retry after", h("Throttler-Status", "retry", "Retry-After", "-1"), dispatch.Result{}, false, `Retry-After: "-1"`, ""},
		{"dead", h("Throttler-Status", "dead", "Throttler-Error", "bad order"), dispatch.Result{Verdict: dispatch.Dead}, false, "", "bad order"},
		{"release", h("Throttler-Status", "release"), dispatch.Result{Verdict: dispatch.Retry, Unstarted: true}, false, "", ""},
		{"progress", h("Throttler-Status", "progress"), dispatch.Result{}, true, "", ""},
		{"unknown", h("Throttler-Status", "finished"), dispatch.Result{}, false, `"finished" is not one of`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, progress, err := dispatch.ParseOutcome(tc.header)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if progress != tc.progress || res.Verdict != tc.want.Verdict || res.RetryAfter != tc.want.RetryAfter || res.Unstarted != tc.want.Unstarted {
				t.Fatalf("got %+v progress=%v, want %+v progress=%v", res, progress, tc.want, tc.progress)
			}
			if res.Verdict != dispatch.Done && !tc.progress && !errors.Is(res.Err, dispatch.ErrWorker) {
				t.Fatalf("err %v is not ErrWorker", res.Err)
			}
			if tc.workerErr != "" && !strings.Contains(res.Err.Error(), tc.workerErr) {
				t.Fatalf("err %v lacks the worker's reason %q", res.Err, tc.workerErr)
			}
		})
	}
}

// TestWireNamesMatchAPI: the request mode's header names are the worker
// protocol's, as package api spells them for workers.
func TestWireNamesMatchAPI(t *testing.T) {
	for _, pair := range [][2]string{
		{dispatch.HeaderIdempotencyKey, api.HeaderIdempotencyKey},
		{dispatch.HeaderLane, api.HeaderLane},
		{dispatch.HeaderKey, api.HeaderKey},
		{dispatch.HeaderAttempt, api.HeaderAttempt},
		{dispatch.HeaderStatus, api.HeaderStatus},
		{dispatch.HeaderError, api.HeaderError},
		{dispatch.HeaderRetryAfter, api.HeaderRetryAfter},
	} {
		if pair[0] != pair[1] {
			t.Errorf("dispatch says %q, api says %q", pair[0], pair[1])
		}
	}
}

// TestParkedPullsAreBounded: a pull request beyond MaxParked is answered
// "empty" at once; the ones parked before it stay parked.
func TestParkedPullsAreBounded(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p, err := dispatch.OpenPull(nc, dispatch.PullConfig{Subject: "work", MaxParked: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	inbox := nats.NewInbox()
	answers, err := nc.SubscribeSync(inbox + ".*")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		m := nats.NewMsg("work")
		m.Reply = inbox + "." + name
		m.Header.Set(api.HeaderExpires, "30000")
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	m, err := answers.NextMsg(2 * time.Second)
	if err != nil {
		t.Fatalf("the third pull was not answered: %v", err)
	}
	if m.Subject != inbox+".c" || m.Header.Get(api.HeaderStatus) != api.StatusEmpty {
		t.Fatalf("answer on %s with status %q, want the third pull (c) answered %q", m.Subject, m.Header.Get(api.HeaderStatus), api.StatusEmpty)
	}
	// The two parked ones are still there: both can be claimed.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 2 {
		if _, err := p.Claim(ctx, 1); err != nil {
			t.Fatalf("claim: %v", err)
		}
	}
	if m, err := answers.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("a parked pull was answered: %s", m.Subject)
	}
}

// TestBounceAnswersUnclaimedOldPulls: Bounce answers "empty" to the pull
// requests older than its bound that no job is meant for, oldest first, and
// leaves the claimed and the young ones parked.
func TestBounceAnswersUnclaimedOldPulls(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	p, err := dispatch.OpenPull(nc, dispatch.PullConfig{Subject: "work"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	inbox := nats.NewInbox()
	answers, err := nc.SubscribeSync(inbox + ".*")
	if err != nil {
		t.Fatal(err)
	}
	ask := func(name string) {
		m := nats.NewMsg("work")
		m.Reply = inbox + "." + name
		m.Header.Set(api.HeaderExpires, "30000")
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	ask("a")
	ask("b")
	ask("c")
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// All three parked: claim them in turn, then give two back.
	for range 3 {
		if _, err := p.Claim(ctx, 1); err != nil {
			t.Fatalf("claim: %v", err)
		}
	}
	p.Unclaim(2)
	if n := p.Bounce(time.Hour); n != 0 {
		t.Fatalf("bounced %d young pulls, want 0", n)
	}
	if n := p.Bounce(0); n != 2 {
		t.Fatalf("bounced %d, want the 2 unclaimed of 3", n)
	}
	for _, want := range []string{"a", "b"} {
		m, err := answers.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("no answer for %s: %v", want, err)
		}
		if m.Subject != inbox+"."+want || m.Header.Get(api.HeaderStatus) != api.StatusEmpty {
			t.Fatalf("answer %s %v, want %s empty (oldest first)", m.Subject, m.Header, want)
		}
	}
	if m, err := answers.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("the claimed pull was answered too: %s", m.Subject)
	}
	if n := p.Bounce(0); n != 0 {
		t.Fatalf("bounced %d, want 0: the one left is claimed", n)
	}
}
