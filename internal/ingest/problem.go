package ingest

import (
	"encoding/json"
	"github.com/throttler/throttler/api"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Problem types; each is documented in docs/API.md under its anchor.
const (
	ProblemUnknownLane  = "urn:throttler:problem:unknown-lane"
	ProblemBodyTooLarge = "urn:throttler:problem:body-too-large"
	ProblemBadHeader    = "urn:throttler:problem:invalid-header"
	ProblemBacklogFull  = "urn:throttler:problem:backlog-full"
	ProblemUnavailable  = "urn:throttler:problem:queue-unavailable"
	ProblemNotFound     = "urn:throttler:problem:not-found"
	ProblemBadBody      = "urn:throttler:problem:invalid-body"
	ProblemShuttingDown = "urn:throttler:problem:shutting-down"
	ProblemStorageFull  = "urn:throttler:problem:storage-full"
	// ProblemOverloaded: a bound of the HTTP server itself (connections,
	// bodies being read) is reached.
	ProblemOverloaded = "urn:throttler:problem:overloaded"
	// ProblemRequestTimeout: the body did not arrive within read_timeout.
	ProblemRequestTimeout = "urn:throttler:problem:request-timeout"
	problemContentType    = "application/problem+json"
	maxRetryAfterSeconds  = 24 * 3600
)

func writeProblem(w http.ResponseWriter, r *http.Request, p api.Problem, retryAfter time.Duration) {
	if p.Instance == "" {
		p.Instance = r.URL.Path
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	if retryAfter > 0 || p.Status == http.StatusTooManyRequests || p.Status == http.StatusServiceUnavailable {
		s := retryAfterSeconds(retryAfter)
		w.Header().Set("Retry-After", strconv.FormatInt(s, 10))
		p.RetryAfterSeconds = s
	}
	w.Header().Set("Content-Type", problemContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// retryAfterSeconds rounds up to whole seconds, at least 1 and at most a day.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64(math.Ceil(d.Seconds()))
	return min(max(s, 1), maxRetryAfterSeconds)
}
