// Package client submits jobs to a throttler and administers its lanes over
// the HTTP API (docs/API.md, docs/openapi.yaml), so that a Go program need
// not hand-write its conventions: Idempotency-Key and Throttle-Key headers,
// RFC 9457 problem bodies, and waiting out 429 and 503 answers.
//
// A Client is made with New and is safe for concurrent use. Every call takes
// a context; a call without a deadline gets none of its own beyond the
// HTTP client's timeout, but waits between retries end with the context.
//
// # Retries
//
// A 429 or 503 answer is retried after at least its Retry-After (1 s when it
// has none). Consecutive 429s back off further: the 2nd, 3rd and 4th wait
// ×2, ×4 and ×8 Retry-After, capped at 60 s, each with ±20 % jitter (never
// below Retry-After). After 5 retries (RetryPolicy.MaxRetries) the call
// returns an *Error with the last answer's status, problem and Retry-After.
// Submit sends an Idempotency-Key on every attempt (it makes one when the
// caller gives none), so a retried submission is stored once. Other answers
// and transport errors are returned at once.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/throttler/throttler/api"
)

// Client talks to one throttler server (or a load balancer in front of a
// fleet). The zero value is not usable: call New.
type Client struct {
	base   *url.URL
	key    string
	hc     *http.Client
	agent  string
	retry  RetryPolicy
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func() float64
}

// RetryPolicy says how 429 and 503 answers are retried.
type RetryPolicy struct {
	// MaxRetries bounds the retries of one call (default 5); a negative
	// value retries nothing.
	MaxRetries int
	// MaxDelay caps one wait of the backoff (default 60 s); a Retry-After
	// longer than it is still honoured.
	MaxDelay time.Duration
	// Jitter is the relative spread of each wait (default 0.2: ±20 %).
	Jitter float64
	// MaxRetryAfter: an answer asking for a longer wait than this is not
	// waited for; the call returns its *Error at once (default 5 min).
	MaxRetryAfter time.Duration
}

// DefaultRetryPolicy is the policy of a Client made without WithRetry.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxRetries: 5, MaxDelay: 60 * time.Second, Jitter: 0.2, MaxRetryAfter: 5 * time.Minute}
}

// Option configures a Client.
type Option func(*Client)

// WithAPIKey sends key as "Authorization: Bearer <key>" on every request.
func WithAPIKey(key string) Option { return func(c *Client) { c.key = key } }

// WithHTTPClient uses hc for requests (default: a client with a 30 s
// timeout).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithUserAgent sets the User-Agent header (default "throttler-client").
func WithUserAgent(ua string) Option { return func(c *Client) { c.agent = ua } }

// WithRetry replaces the retry policy; zero fields take their defaults
// except MaxRetries, which is used as given.
func WithRetry(p RetryPolicy) Option {
	return func(c *Client) {
		d := DefaultRetryPolicy()
		if p.MaxDelay <= 0 {
			p.MaxDelay = d.MaxDelay
		}
		if p.Jitter <= 0 || p.Jitter >= 1 {
			p.Jitter = d.Jitter
		}
		if p.MaxRetryAfter <= 0 {
			p.MaxRetryAfter = d.MaxRetryAfter
		}
		c.retry = p
	}
}

// WithSleep replaces how the client waits between retries (tests pass a
// function that records the wait and returns at once). sleep must return
// ctx's error when ctx ends first.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *Client) { c.sleep = sleep }
}

// WithJitterSource replaces the random source of the jitter: f returns a
// number in [0, 1), 0.5 meaning no jitter.
func WithJitterSource(f func() float64) Option { return func(c *Client) { c.jitter = f } }

// New makes a client of the server at base, e.g. "http://127.0.0.1:8080".
func New(base string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil {
		return nil, fmt.Errorf("client: server URL %q: %w", base, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("client: server URL %q: want http://host:port or https://host:port", base)
	}
	c := &Client{
		base:   u,
		hc:     &http.Client{Timeout: 30 * time.Second},
		agent:  "throttler-client",
		retry:  DefaultRetryPolicy(),
		sleep:  sleepCtx,
		jitter: mrand.Float64,
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Sentinel errors an *Error matches with errors.Is.
var (
	// ErrNotFound: 404 (no such lane, dead letter, key or route).
	ErrNotFound = errors.New("not found")
	// ErrUnauthorized: 401, no API key or an unknown one.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden: 403, the key lacks the scope (or a cross-site request).
	ErrForbidden = errors.New("forbidden")
	// ErrThrottled: 429 or 503 still after the retries (or a Retry-After
	// over RetryPolicy.MaxRetryAfter).
	ErrThrottled = errors.New("throttled")
	// ErrInvalid: 400, 413 and other refusals of the request itself.
	ErrInvalid = errors.New("invalid request")
	// ErrIdempotencyKeyConflict: 409 idempotency-key-conflict, on a server
	// with API keys: the submission's idempotency key is the id of a job
	// of the lane that another key submitted. Nothing was stored; submit
	// under another key. It matches ErrInvalid too. A batch item's
	// refusal is its api.BatchResult.Problem (ProblemIdempotencyKeyConflict).
	ErrIdempotencyKeyConflict = errors.New("idempotency key in use by another caller")
)

// ProblemIdempotencyKeyConflict is the problem type of
// ErrIdempotencyKeyConflict.
const ProblemIdempotencyKeyConflict = "urn:throttler:problem:idempotency-key-conflict"

// Error is a non-2xx answer of the server. Its Problem is the RFC 9457
// body when the server sent one (match on Problem.Type, not on Detail).
type Error struct {
	Method, Path string
	// StatusCode is the HTTP status of the last answer.
	StatusCode int
	// Problem is the decoded problem+json body; nil when the body was not
	// one (then Body holds up to 4 KiB of it).
	Problem *api.Problem
	Body    string
	// RetryAfter is the last answer's Retry-After (0 without one).
	RetryAfter time.Duration
	// Attempts is how many requests the call made (1 + retries).
	Attempts int
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode))
	if p := e.Problem; p != nil {
		if p.Detail != "" {
			fmt.Fprintf(&b, ": %s", p.Detail)
		}
		if p.Field != "" {
			fmt.Fprintf(&b, " (field %s)", p.Field)
		}
	} else if s := strings.TrimSpace(e.Body); s != "" {
		fmt.Fprintf(&b, ": %s", s)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, "; retry after %v", e.RetryAfter)
	}
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " (after %d attempts)", e.Attempts)
	}
	return b.String()
}

// Is matches the sentinel of the status: ErrNotFound, ErrUnauthorized,
// ErrForbidden, ErrThrottled, ErrInvalid; and of the problem:
// ErrIdempotencyKeyConflict.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrIdempotencyKeyConflict:
		return e.Problem != nil && e.Problem.Type == ProblemIdempotencyKeyConflict
	case ErrNotFound:
		return e.StatusCode == http.StatusNotFound
	case ErrUnauthorized:
		return e.StatusCode == http.StatusUnauthorized
	case ErrForbidden:
		return e.StatusCode == http.StatusForbidden
	case ErrThrottled:
		return e.StatusCode == http.StatusTooManyRequests || e.StatusCode == http.StatusServiceUnavailable
	case ErrInvalid:
		return e.StatusCode >= 400 && e.StatusCode < 500 && e.StatusCode != http.StatusNotFound &&
			e.StatusCode != http.StatusUnauthorized && e.StatusCode != http.StatusForbidden &&
			e.StatusCode != http.StatusTooManyRequests
	}
	return false
}

// request is one API call; body is sent again on every attempt.
type request struct {
	method string
	// path is the path's segments, unescaped ("v1", "lanes", lane).
	path   []string
	query  url.Values
	header http.Header
	body   []byte
}

// do sends r, retrying 429 and 503 answers by the policy, and decodes a
// 2xx JSON body into out (when out is not nil). It returns the final
// answer's headers.
func (c *Client) do(ctx context.Context, r request, out any) (http.Header, error) {
	u := *c.base
	escaped := make([]string, len(r.path))
	for i, s := range r.path {
		escaped[i] = url.PathEscape(s)
	}
	u.Path = c.base.Path + "/" + strings.Join(r.path, "/")
	u.RawPath = c.base.Path + "/" + strings.Join(escaped, "/")
	if r.query != nil {
		u.RawQuery = r.query.Encode()
	}
	path := "/" + strings.Join(r.path, "/")
	streak := 0 // consecutive 429s
	for attempt := 1; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, r.method, u.String(), bytes.NewReader(r.body))
		if err != nil {
			return nil, fmt.Errorf("client: %s %s: %w", r.method, path, err)
		}
		maps(req.Header, r.header)
		if r.body != nil && req.Header.Get("Content-Type") == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Accept", "application/json, application/problem+json")
		req.Header.Set("User-Agent", c.agent)
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("client: %s %s: %w", r.method, path, err)
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			defer resp.Body.Close()
			if out != nil && resp.StatusCode != http.StatusNoContent {
				if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(out); err != nil {
					return resp.Header, fmt.Errorf("client: %s %s: decoding the answer: %w", r.method, path, err)
				}
			}
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswer))
			return resp.Header, nil
		}
		e := readError(r.method, path, resp)
		e.Attempts = attempt
		throttled := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable
		if resp.StatusCode == http.StatusTooManyRequests {
			streak++
		} else {
			streak = 0
		}
		if !throttled || attempt > c.retry.MaxRetries || e.RetryAfter > c.retry.MaxRetryAfter {
			return resp.Header, e
		}
		if err := c.sleep(ctx, c.retry.delay(e.RetryAfter, streak, c.jitter)); err != nil {
			return resp.Header, fmt.Errorf("client: %s %s: waiting to retry: %w (last answer: %w)", r.method, path, err, e)
		}
	}
}

// delay is the wait before the next attempt: at least retryAfter (1 s when
// the answer had none); for the n-th consecutive 429 (streak n ≥ 2)
// retryAfter × 2^(n-1), capped at MaxDelay, with ±Jitter spread, never
// below retryAfter. rnd returns a number in [0, 1).
func (p RetryPolicy) delay(retryAfter time.Duration, streak int, rnd func() float64) time.Duration {
	if retryAfter <= 0 {
		retryAfter = time.Second
	}
	d := retryAfter
	if streak > 1 {
		d = retryAfter * time.Duration(1<<min(streak-1, 20))
	}
	if d > p.MaxDelay {
		d = p.MaxDelay
	}
	d = time.Duration(float64(d) * (1 + p.Jitter*(2*rnd()-1)))
	return max(d, retryAfter)
}

// maxAnswer bounds the bytes of an answer the client reads.
const maxAnswer = 64 << 20

func readError(method, path string, resp *http.Response) *Error {
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	e := &Error{Method: method, Path: path, StatusCode: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p api.Problem
		if json.Unmarshal(raw, &p) == nil {
			e.Problem = &p
			if e.RetryAfter == 0 && p.RetryAfterSeconds > 0 {
				e.RetryAfter = time.Duration(p.RetryAfterSeconds) * time.Second
			}
			return e
		}
	}
	if len(raw) > 4096 {
		raw = raw[:4096]
	}
	e.Body = string(raw)
	return e
}

// parseRetryAfter reads seconds or an HTTP date; 0 when absent or bad.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s <= 0 || math.IsNaN(s) || math.IsInf(s, 0) {
			return 0
		}
		return time.Duration(math.Min(s, 1e9) * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

func maps(dst, src http.Header) {
	for k, vs := range src {
		for _, v := range vs {
			dst.Add(k, v)
		}
	}
}

// newIdempotencyKey is 22 characters of crypto randomness.
func newIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
