package ingest

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/throttler/throttler/api"
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
	// The path, the lane and the field may be the client's: bounded.
	p.Instance, p.Lane, p.Field = clip(p.Instance), clip(p.Lane), clip(p.Field)
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

// maxEcho bounds, in bytes, a client-chosen string (a lane name, a key, a
// path, a JSON pointer) echoed into a log line or a problem.
const maxEcho = 128

// echoCut marks a string clip cut.
const echoCut = "…"

// clip bounds a client-chosen string that a log line or a problem echoes:
// one of at most maxEcho bytes is returned as it is; a longer one is cut at
// a character boundary and ends with echoCut, maxEcho bytes at most in
// all. A cut never splits a UTF-8 sequence, so valid UTF-8 stays valid.
func clip(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	n := maxEcho - len(echoCut)
	// Back up to the start of the character at n (at most utf8.UTFMax-1
	// continuation bytes); bytes that start nothing are cut there.
	for i := n; i > n-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(s[i]) {
			n = i
			break
		}
	}
	return s[:n] + echoCut
}
