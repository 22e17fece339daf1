package lane

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/dispatch"
)

// TestSettle covers every row of the table in docs/DESIGN.md ("Retries and
// dead letters"), plus a stop cutting a delivery short.
func TestSettle(t *testing.T) {
	backoff := func(attempt int) time.Duration { return time.Duration(attempt) * time.Minute }
	errBoom := errors.New("boom")
	res := func(v dispatch.Verdict, status int) dispatch.Result {
		return dispatch.Result{Verdict: v, Status: status}
	}
	withWait := func(r dispatch.Result, retryAfter, pause time.Duration) dispatch.Result {
		r.RetryAfter, r.PauseLane = retryAfter, pause
		return r
	}
	for _, tc := range []struct {
		name     string
		o        Outcome
		want     Action
		wantKind Kind
	}{
		{"2xx acks", Outcome{Result: res(dispatch.Done, 200), Attempt: 1, MaxAttempts: 3},
			Action{Kind: Ack}, Ack},
		{"2xx while stopping still acks", Outcome{Result: res(dispatch.Done, 204), Attempt: 1, MaxAttempts: 3, Stopping: true},
			Action{Kind: Ack}, Ack},
		{"5xx retries after backoff", Outcome{Result: res(dispatch.Retry, 500), Attempt: 1, MaxAttempts: 3},
			Action{Kind: Retry, Delay: time.Minute}, Retry},
		{"5xx retries after the target's Retry-After", Outcome{Result: withWait(res(dispatch.Retry, 500), 7*time.Second, 0), Attempt: 2, MaxAttempts: 3},
			Action{Kind: Retry, Delay: 7 * time.Second}, Retry},
		{"connection error retries", Outcome{Result: dispatch.Result{Verdict: dispatch.Retry, Err: errBoom}, Attempt: 2, MaxAttempts: 3},
			Action{Kind: Retry, Delay: 2 * time.Minute}, Retry},
		{"503 without a wait is a failure", Outcome{Result: res(dispatch.Retry, 503), Attempt: 1, MaxAttempts: 3},
			Action{Kind: Retry, Delay: time.Minute}, Retry},
		{"last attempt dies", Outcome{Result: res(dispatch.Retry, 500), Attempt: 3, MaxAttempts: 3},
			Action{Kind: Dead, Reason: "failed 3 attempts"}, Dead},
		{"one attempt allowed dies at once", Outcome{Result: res(dispatch.Retry, 502), Attempt: 1, MaxAttempts: 1},
			Action{Kind: Dead, Reason: "failed 1 attempts"}, Dead},
		{"refusal dies at once", Outcome{Result: res(dispatch.Dead, 404), Attempt: 1, MaxAttempts: 3},
			Action{Kind: Dead, Reason: "rejected by target"}, Dead},
		{"429 waits in place for Retry-After", Outcome{Result: withWait(res(dispatch.Retry, 429), 2*time.Second, 2*time.Second), Attempt: 1, MaxAttempts: 3},
			Action{Kind: Wait, Delay: 2 * time.Second, RateLimited: true}, Wait},
		{"429 on the last attempt does not count", Outcome{Result: withWait(res(dispatch.Retry, 429), 2*time.Second, 0), Attempt: 3, MaxAttempts: 3},
			Action{Kind: Wait, Delay: 2 * time.Second, RateLimited: true}, Wait},
		{"429 without a wait waits the minimum", Outcome{Result: res(dispatch.Retry, 429), Attempt: 1, MaxAttempts: 3},
			Action{Kind: Wait, Delay: minWait, RateLimited: true}, Wait},
		{"429 waits for the longer lane pause", Outcome{Result: withWait(res(dispatch.Retry, 429), 2*time.Second, 5*time.Second), Attempt: 1, MaxAttempts: 3},
			Action{Kind: Wait, Delay: 5 * time.Second, RateLimited: true}, Wait},
		{"503 with a wait is a rate limit", Outcome{Result: withWait(res(dispatch.Retry, 503), 0, 3*time.Second), Attempt: 1, MaxAttempts: 3},
			Action{Kind: Wait, Delay: 3 * time.Second, RateLimited: true}, Wait},
		{"a stop releases a failure", Outcome{Result: dispatch.Result{Verdict: dispatch.Retry, Err: errBoom}, Attempt: 3, MaxAttempts: 3, Stopping: true},
			Action{Kind: Release}, Release},
		{"a stop releases a 429", Outcome{Result: withWait(res(dispatch.Retry, 429), time.Second, 0), Attempt: 1, MaxAttempts: 3, Stopping: true},
			Action{Kind: Release}, Release},
		{"a stop releases a refusal", Outcome{Result: res(dispatch.Dead, 400), Attempt: 1, MaxAttempts: 3, Stopping: true},
			Action{Kind: Release}, Release},
		{"a job handed back unstarted is released, even on the last attempt", Outcome{Result: dispatch.Result{Verdict: dispatch.Retry, Unstarted: true, Err: errBoom}, Attempt: 3, MaxAttempts: 3},
			Action{Kind: Release}, Release},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Settle(tc.o, backoff)
			if got != tc.want {
				t.Fatalf("Settle = %+v (%v), want %+v (%v)", got, got.Kind, tc.want, tc.wantKind)
			}
		})
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{Ack: "ack", Release: "release", Wait: "wait", Retry: "retry", Dead: "dead", Kind(9): "Kind(9)"} {
		if got := k.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(k), got, want)
		}
	}
}

func TestRateLimited(t *testing.T) {
	for _, tc := range []struct {
		status int
		pause  time.Duration
		want   bool
	}{
		{http.StatusTooManyRequests, 0, true},
		{http.StatusServiceUnavailable, time.Second, true},
		{http.StatusServiceUnavailable, 0, false},
		{http.StatusInternalServerError, time.Second, false},
	} {
		if got := rateLimited(dispatch.Result{Status: tc.status, PauseLane: tc.pause}); got != tc.want {
			t.Errorf("rateLimited(%d, pause %v) = %v", tc.status, tc.pause, got)
		}
	}
}
