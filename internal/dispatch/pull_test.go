package dispatch_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dispatch"
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
