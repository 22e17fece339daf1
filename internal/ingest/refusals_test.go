package ingest

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/admission"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/queue"
)

// TestProblemFor: the one table from error to problem, row by row: each
// class answers its type, status, field and Retry-After; a refusal's field,
// status and wait replace the row's; the detail is the refusal's, else the
// error's text; a wrapped error is classified as its cause; what matches
// no row is 503 queue-unavailable, retry in a second.
func TestProblemFor(t *testing.T) {
	rej := &admission.RejectError{Lane: "demo", Field: "max_wait", Backlog: 7, RetryAfter: 2500 * time.Millisecond}
	steps := []struct {
		name   string
		err    error
		typ    string
		status int
		field  string
		retry  int64
	}{
		{"ShuttingDown", refusal(ErrShuttingDown, "", "x"), ProblemShuttingDown, 503, "", 1},
		{"UnknownLane", refusal(ErrUnknownLane, "", "x"), ProblemUnknownLane, 404, "lane", 0},
		{"BodiesBusy", errBodiesBusy, ProblemOverloaded, 503, "max_body_inflight", 1},
		{"CallerBodiesBusy", refusal(ErrCallerBodiesBusy, "", "over your share"), ProblemOverloaded, 429, "max_body_inflight_per_caller", 1},
		{"BodyTimeout", refusal(ErrBodyTimeout, "", "x"), ProblemRequestTimeout, 408, "body", 0},
		{"BodyTooLarge", refusal(ErrBodyTooLarge, "/3/payload", "x"), ProblemBodyTooLarge, 413, "/3/payload", 0},
		{"StrictJSON", &JSONError{Reason: jsonDuplicate, Pointer: "/burst", Key: "burst"}, ProblemBadBody, 400, "body", 0},
		{"BadBody", refusal(ErrBadBody, "plan", "x"), ProblemBadBody, 400, "plan", 0},
		{"BadRate", fmt.Errorf("decode: %w", bucket.ErrInvalidRate), ProblemBadBody, 400, "rate", 0},
		{"LimitError", &bucket.LimitError{Field: "burst", Msg: "must be at least 1"}, ProblemBadBody, 400, "burst", 0},
		{"BadHeader", refusal(ErrBadHeader, HeaderThrottleKey, "x"), ProblemBadHeader, 400, HeaderThrottleKey, 0},
		{"BatchContentType", &Refusal{Err: ErrBadHeader, Field: "Content-Type", Status: 415}, ProblemBadHeader, 415, "Content-Type", 0},
		{"BadParam", refusal(ErrBadParam, "seq", "x"), ProblemBadQuery, 400, "seq", 0},
		{"NotKeyed", fmt.Errorf("lane demo: %w", api.ErrNotKeyed), ProblemNotFound, 404, "lane", 0},
		{"DeadLetterGone", fmt.Errorf("seq 4: %w", queue.ErrNotFound), ProblemNotFound, 404, "seq", 0},
		{"NotFound", refusal(ErrNotFound, "key", "x"), ProblemNotFound, 404, "key", 0},
		{"AdmissionRefused", admissionRefusal("demo", rej), ProblemBacklogFull, 429, "max_wait", 3},
		{"QueueBacklog", storeRefusal("demo", Lane{Admission: admission.Lane{Limit: bucket.Limit{Rate: 0.25, Burst: 1}}}, fmt.Errorf("queue: %w: nats: maximum messages exceeded", queue.ErrBacklogFull)), ProblemBacklogFull, 429, "max_backlog", 4},
		{"StorageFull", storeRefusal("demo", Lane{}, fmt.Errorf("%w: no space", queue.ErrFull)), ProblemStorageFull, 503, "max_bytes", 5},
		{"CallerQuota", &Refusal{Err: ErrCallerQuota, Field: "per_ip", RetryAfter: 6 * time.Second}, ProblemCallerQuota, 429, "per_ip", 6},
		{"OverPlan", refusal(ErrOverPlan, "", "x"), ProblemOverPlan, 413, "cost", 0},
		{"Unauthorized", refusal(ErrUnauthorized, "", "x"), ProblemUnauthorized, 401, "Authorization", 0},
		{"Forbidden", refusal(ErrForbidden, "", "x"), ProblemForbidden, 403, "Authorization", 0},
		{"UnknownHost", refusal(ErrUnknownHost, "", "x"), ProblemUnknownHost, 421, "Host", 0},
		{"CrossSite", refusal(ErrCrossSite, "", "x"), ProblemCrossSite, 403, "Origin", 0},
		{"Unclassified", errors.New("nats: timeout"), ProblemUnavailable, 503, "", 1},
		{"QueueUnavailable", storeRefusal("demo", Lane{}, fmt.Errorf("%w: nats: timeout", queue.ErrUnavailable)), ProblemUnavailable, 503, "", 1},
		{"AdmissionFailed", admissionRefusal("demo", errors.New("redis: down")), ProblemUnavailable, 503, "", 1},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			p := problemFor(s.err)
			if p.Type != s.typ || p.Status != s.status || p.Field != s.field || p.RetryAfterSeconds != s.retry || p.Title != http.StatusText(s.status) {
				t.Errorf("%v: %+v, want %s %d field %q retry %d", s.err, p, s.typ, s.status, s.field, s.retry)
			}
			if p.Detail != s.err.Error() || p.Detail == "" {
				t.Errorf("detail %q, want the error's text %q", p.Detail, s.err.Error())
			}
		})
	}
	// A refusal keeps its class and its cause in the chain.
	rf := &Refusal{Err: ErrBadBody, Cause: fs.ErrClosed, Detail: "reading the body failed"}
	if !errors.Is(rf, ErrBadBody) || !errors.Is(rf, fs.ErrClosed) {
		t.Errorf("%v: class or cause lost", rf)
	}
	if !errors.Is(admissionRefusal("demo", rej), admission.ErrBacklogFull) || !errors.Is(rej, queue.ErrBacklogFull) {
		t.Error("the admission's refusal and the queue's are not one ErrBacklogFull")
	}
}
