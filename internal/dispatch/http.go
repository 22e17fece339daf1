package dispatch

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/dest"
	"golang.org/x/net/http/httpguts"
)

// Defaults and header names of the HTTP target.
const (
	// DefaultHTTPMethod is the method when HTTPConfig.Method is empty.
	DefaultHTTPMethod = http.MethodPost
	// DefaultHTTPTimeout bounds one attempt when HTTPConfig.Timeout is 0.
	DefaultHTTPTimeout = 10 * time.Second
	// DefaultContentType is sent when the job has no content type.
	DefaultContentType = "application/octet-stream"
	// UserAgent is the default User-Agent of HTTP deliveries.
	UserAgent = "throttler"
	// HeaderIdempotencyKey carries the job id to the target.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderThrottleKey carries a keyed lane's key (Job.Key) to the
	// target, HTTP or NATS.
	HeaderThrottleKey = "Throttle-Key"

	// maxIdlePerHost keeps enough warm connections for high rates to one
	// host (Go's default of 2 would open a new connection per request).
	maxIdlePerHost = 256
	// maxDrain is how much of a response body is read so that the
	// connection can be reused; a larger body closes the connection.
	maxDrain = 64 << 10
	// maxAnswerHeader bounds the status line and headers of a target's
	// answer (the transport's default is 10 MiB, held per delivery in
	// flight); an answer over it is a failed attempt, retried.
	maxAnswerHeader = 64 << 10
	// maxErrorPart bounds a reason phrase or Location a target chose, as
	// an attempt's error quotes it (logs, dead letters).
	maxErrorPart = 256
)

// ErrRedirected is the error of a delivery answered with a 3xx: redirects
// are not followed (they could lead the request past the SSRF guard or
// replay a POST as a GET), and retrying will not change the answer, so the
// job is Dead.
var ErrRedirected = errors.New("dispatch: target redirected")

// ErrStatus is the error of a delivery answered with a non-2xx status
// other than a redirect; the wrapping error gives the status.
var ErrStatus = errors.New("dispatch: target answered")

// HTTPConfig configures an HTTP target. The zero value is invalid: URL is
// required; the other fields have defaults.
type HTTPConfig struct {
	// URL is the absolute http or https URL the job is sent to.
	URL string
	// Method is the request method; "" means POST.
	Method string
	// Headers are static headers added to every request (e.g.
	// Authorization). They may replace User-Agent and give a
	// Content-Type for jobs that have none; they may not set Host,
	// Content-Length, Transfer-Encoding, Connection, Idempotency-Key or
	// the webhook-* signing headers.
	Headers map[string]string
	// Timeout bounds one attempt, from dial to the drained body; 0 means
	// DefaultHTTPTimeout.
	Timeout time.Duration
	// RetryOther4xx makes 4xx statuses other than 408, 425 and 429 Retry
	// instead of Dead.
	RetryOther4xx bool
	// Signing, when set, signs each request with Standard Webhooks
	// headers.
	Signing *Signer
	// Methods, ForwardHeaders and JobURLs are the lane's lists a job's
	// own destination is checked against (target.http.methods,
	// forward_headers, job_urls: package dest). Empty lists allow the
	// configured method alone, no forwarded header and no job URL.
	Methods        []string
	ForwardHeaders []string
	JobURLs        []string
	// MaxInflight is how many deliveries may run at once (the lane's
	// max_inflight): the target keeps that many idle keep-alive
	// connections, at least 256, so that a lane at its bound never closes
	// a connection only to open another for the next job. 0 means 256.
	MaxInflight int
	// Capture, when set, keeps part of each answer in Result.Response (a
	// lane with results).
	Capture *Capture
}

// reservedHeader reports whether a static header may not be configured:
// Go ignores it, or the target sets it itself.
func reservedHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection",
		"Idempotency-Key", "Throttle-Key", "Webhook-Id", "Webhook-Timestamp", "Webhook-Signature":
		return true
	}
	return false
}

// CheckStaticHeaders checks the static headers of an HTTP target (see
// HTTPConfig.Headers) and returns an error naming the first bad header in
// name order, or nil. A name must be an RFC 9110 token and not one the
// target sets itself (Host, Content-Length, Transfer-Encoding, Connection,
// Idempotency-Key, Throttle-Key, webhook-*); a value may hold visible characters, spaces
// and tabs, nothing else (a CR or LF would inject headers, and Go refuses
// to send other control characters). The message has no package prefix:
// callers say where the headers came from.
func CheckStaticHeaders(headers map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		switch {
		case !isToken(k):
			return fmt.Errorf("%q is not a valid header name (letters, digits and !#$%%&'*+-.^_`|~)", k)
		case reservedHeader(k):
			return fmt.Errorf("%q is set by the target and cannot be configured", k)
		case !validHeaderValue(headers[k]):
			return fmt.Errorf("value of %q contains a control character (only visible characters, spaces and tabs are allowed)", k)
		}
	}
	return nil
}

// validHeaderValue reports whether v is an RFC 9110 field value without
// obsolete line folding: no control character other than a tab.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// Validate returns an error naming the first bad field, or nil.
func (c HTTPConfig) Validate() error {
	if c.URL == "" {
		return errors.New("dispatch: http: URL: required")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("dispatch: http: URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("dispatch: http: URL: scheme %q is not http or https", u.Scheme)
	}
	if u.Hostname() == "" {
		return fmt.Errorf("dispatch: http: URL: %q has no host", redactURL(u))
	}
	if c.Method != "" && !isToken(c.Method) {
		return fmt.Errorf("dispatch: http: Method: %q is not a valid method", c.Method)
	}
	if c.MaxInflight < 0 {
		return fmt.Errorf("dispatch: http: MaxInflight: %d is negative", c.MaxInflight)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("dispatch: http: Timeout: %v is negative", c.Timeout)
	}
	if err := CheckStaticHeaders(c.Headers); err != nil {
		return fmt.Errorf("dispatch: http: Headers: %w", err)
	}
	if _, err := c.rules(); err != nil {
		return fmt.Errorf("dispatch: http: %w", err)
	}
	return nil
}

var _ Target = (*HTTP)(nil)

// HTTP delivers jobs as HTTP requests to one URL, over its own pool of
// keep-alive connections. It is safe for concurrent use. Classification:
//
//   - 2xx: Done.
//   - 408, 425, 429, 5xx, timeouts and transport errors (refused, reset,
//     EOF, DNS): Retry.
//   - other 4xx: Dead, or Retry with RetryOther4xx.
//   - 3xx: Dead with ErrRedirected (redirects are not followed).
//   - an address refused by the Guard: Dead with ErrForbiddenAddress.
//
// Downstream signals (Retry-After on 429/503, X-RateLimit-*, RateLimit)
// fill Result.RetryAfter and Result.PauseLane, capped at MaxPause.
type HTTP struct {
	url      string
	logURL   string // scheme://host/path: no credentials or query in errors
	method   string
	timeout  time.Duration
	retry4xx bool
	headers  http.Header
	signer   *Signer
	// transport sends each request itself (RoundTrip): no http.Client,
	// whose redirect handling copied every request's headers for a
	// redirect that is never followed.
	transport *http.Transport
	// basicAuth is the Authorization of target.http.url's user info, sent
	// with a request to that URL that has none of its own (what
	// http.Client.Do did); "" for none.
	basicAuth string
	clock     clock.Clock // reads Retry-After dates against Now
	// rules check a job's own destination (dest.go).
	rules *dest.Rules
	// tmpl is the request every delivery copies: the URL is parsed once,
	// not per job (url.Parse was the largest cost of a delivery after
	// the round trip itself).
	tmpl *http.Request
	// capture is nil unless the lane keeps results.
	capture *Capture
}

// NewHTTP validates cfg and returns an HTTP target. guard checks every
// connection's address at dial time; nil means no SSRF check (tests and
// library use). NewHTTP does no I/O: call guard.CheckURL at start to fail
// early on a forbidden literal IP. Call Close when done with the target.
func NewHTTP(cfg HTTPConfig, guard *Guard) (*HTTP, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u, _ := url.Parse(cfg.URL) // validated above
	rules, _ := cfg.rules()    // validated above
	h := &HTTP{
		rules:    rules,
		url:      cfg.URL,
		logURL:   redactURL(u),
		method:   cfg.Method,
		timeout:  cfg.Timeout,
		retry4xx: cfg.RetryOther4xx,
		headers:  make(http.Header, len(cfg.Headers)+1),
		signer:   cfg.Signing,
		clock:    clock.Real,
		capture:  cfg.Capture,
	}
	if h.method == "" {
		h.method = DefaultHTTPMethod
	}
	if h.timeout == 0 {
		h.timeout = DefaultHTTPTimeout
	}
	h.headers.Set("User-Agent", UserAgent)
	for k, v := range cfg.Headers {
		h.headers.Set(k, v)
	}
	dial := (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	if guard != nil {
		dial = guard.DialContext
	}
	h.transport = &http.Transport{
		// No proxy: the guard must see the target's address, not a
		// proxy's.
		Proxy:                  nil,
		DialContext:            dial,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           0, // no global limit; per host below
		MaxIdleConnsPerHost:    max(maxIdlePerHost, cfg.MaxInflight),
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: maxAnswerHeader,
	}
	tmpl, err := http.NewRequest(h.method, h.url, nil)
	if err != nil {
		return nil, fmt.Errorf("dispatch: %s %s: %w", h.method, h.logURL, err)
	}
	h.tmpl = tmpl
	if ui := tmpl.URL.User; ui != nil {
		pw, _ := ui.Password()
		h.basicAuth = "Basic " + base64.StdEncoding.EncodeToString([]byte(ui.Username()+":"+pw))
	}
	return h, nil
}

// Close closes the target's idle connections. Deliveries still running
// finish; a later Deliver opens new connections.
func (h *HTTP) Close() { h.transport.CloseIdleConnections() }

// Deliver sends job as one request: the payload is the body, with the
// job's Content-Type (default application/octet-stream), Idempotency-Key =
// job.ID, Throttle-Key = job.Key on a keyed lane, the static headers and, with signing, the Standard Webhooks
// headers. The attempt is bounded by the configured Timeout and by ctx.
func (h *HTTP) Deliver(ctx context.Context, job Job) Result {
	return timed(func() Result { return h.deliver(ctx, job) })
}

func (h *HTTP) deliver(ctx context.Context, job Job) Result {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	req, method, to, res := h.prepare(ctx, job)
	if res.Err != nil {
		return res
	}
	// The transport itself: a 3xx comes back as it is (classify makes it
	// Dead), never followed.
	resp, err := h.transport.RoundTrip(req)
	if err != nil {
		return h.transportError(ctx, method, h.logURLOf(to), err)
	}
	var kept *Response
	if h.capture != nil {
		kept = h.capture.capture(resp)
	}
	// Drain a bounded amount so that the connection goes back to the pool;
	// a larger body is dropped with its connection.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	_ = resp.Body.Close()
	res = h.classify(resp, method, to)
	res.Response = kept
	return res
}

// prepare builds job's request: where it goes, its headers and its
// signature. to is the job's own URL, nil for the target's (errors name
// it through logURLOf, built only when one is needed); a destination the
// lane's lists refuse comes back as a Dead Result.
func (h *HTTP) prepare(ctx context.Context, job Job) (req *http.Request, method string, to *url.URL, res Result) {
	req = h.request(ctx, job.Payload)
	req.Header = h.header(len(job.Dest.Headers))
	method = h.method
	signer := h.signer
	if job.KeyTarget != nil && job.KeyTarget.Signer != nil {
		signer = job.KeyTarget.Signer
	}
	if !job.Dest.IsZero() || job.KeyTarget != nil {
		if method, to, res = h.route(req, job); res.Err != nil {
			return nil, method, to, res
		}
	}
	switch {
	case job.ContentType != "":
		req.Header.Set("Content-Type", job.ContentType)
	case req.Header.Get("Content-Type") == "":
		req.Header.Set("Content-Type", DefaultContentType)
	}
	// Idempotency-Key also lets the transport replay the request on a
	// keep-alive connection that the server had closed.
	if h.basicAuth != "" && to == nil && req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", h.basicAuth)
	}
	req.Header.Set(HeaderIdempotencyKey, job.ID)
	if job.Key != "" {
		req.Header.Set(HeaderThrottleKey, job.Key)
	}
	setTraceHTTP(req.Header, job.Trace)
	for k, v := range signer.Sign(job.ID, job.Payload) {
		req.Header[k] = v
	}
	return req, method, to, Result{}
}

// header is a copy of the static headers with room for what every
// delivery adds (Content-Type, Idempotency-Key, Throttle-Key) and for
// extra forwarded ones, so that the map rarely grows on the way: one
// allocation for the map and one for all the values.
func (h *HTTP) header(extra int) http.Header {
	const added = 3
	out := make(http.Header, len(h.headers)+added+extra)
	n := 0
	for _, v := range h.headers {
		n += len(v)
	}
	vals := make([]string, n)
	for k, v := range h.headers {
		n := copy(vals, v)
		out[k], vals = vals[:n:n], vals[n:]
	}
	return out
}

// logURLOf is the URL errors name: to's, or the target's when to is nil,
// without credentials or query.
func (h *HTTP) logURLOf(to *url.URL) string {
	if to == nil {
		return h.logURL
	}
	return redactURL(to)
}

// request is what http.NewRequestWithContext(ctx, h.method, h.url,
// bytes.NewReader(body)) returns, made from h.tmpl without parsing the URL
// again. The URL is shared with every other delivery: nothing on the way
// (client, transport) writes to a request's URL.
func (h *HTTP) request(ctx context.Context, body []byte) *http.Request {
	req := h.tmpl.WithContext(ctx)
	req.ContentLength = int64(len(body))
	if len(body) == 0 {
		req.Body, req.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
		return req
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return req
}

// transportError classifies a failed round trip.
func (h *HTTP) transportError(ctx context.Context, method, logURL string, err error) Result {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // its message repeats the full URL, with any secrets
	}
	switch {
	case errors.Is(err, ErrForbiddenAddress):
		return Result{Verdict: Dead, Err: fmt.Errorf("dispatch: %s %s: %w", method, logURL, err)}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return Result{Verdict: Retry, Err: fmt.Errorf("dispatch: %s %s: timed out (timeout %v): %w", method, logURL, h.timeout, err)}
	}
	return Result{Verdict: Retry, Err: fmt.Errorf("dispatch: %s %s: %w", method, logURL, err)}
}

// classify turns a response into a Result.
func (h *HTTP) classify(resp *http.Response, method string, to *url.URL) Result {
	res := Result{Status: resp.StatusCode}
	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		res.Verdict = Done
	case code >= 300 && code < 400:
		res.Verdict = Dead
		// Where it points, without the query or user info (they may hold
		// a token, and the error goes into logs and dead letters); a
		// Location that is not a URL is not shown.
		loc := resp.Header.Get("Location")
		if u, err := resp.Request.URL.Parse(loc); err == nil && loc != "" {
			loc = redactURL(u)
		} else if loc != "" {
			loc = "(not a URL)"
		}
		res.Err = fmt.Errorf("dispatch: %s %s: %w with %s to %q", method, h.logURLOf(to), ErrRedirected, clipAnswer(resp.Status), clipAnswer(loc))
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly,
		code == http.StatusTooManyRequests, code >= 500, code < 200:
		res.Verdict = Retry
	case h.retry4xx:
		res.Verdict = Retry
	default:
		res.Verdict = Dead
	}
	if res.Verdict != Done && res.Err == nil {
		res.Err = fmt.Errorf("dispatch: %s %s: %w %s", method, h.logURLOf(to), ErrStatus, clipAnswer(resp.Status))
	}
	res.RetryAfter, res.PauseLane = downstreamSignals(code, resp.Header, h.clock.Now())
	if res.Verdict == Retry && res.RetryAfter == 0 {
		res.RetryAfter = res.PauseLane
	}
	if res.Verdict != Retry {
		res.RetryAfter = 0
	}
	return res
}

// clipAnswer bounds a part of a target's answer (its status line's reason
// phrase, a Location) quoted in an error.
func clipAnswer(s string) string {
	if len(s) <= maxErrorPart {
		return s
	}
	return strings.ToValidUTF8(s[:maxErrorPart], "") + "…"
}

// redactURL returns scheme://host/path, without user info or query, which
// may hold credentials.
func redactURL(u *url.URL) string {
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return r.String()
}

// isToken reports whether s is an RFC 9110 token (method or header name).
func isToken(s string) bool { return httpguts.ValidHeaderFieldName(s) }
