// Package dest decides where one job of an HTTP lane goes: the method, the
// URL and the forwarded headers a job (or its key) asks for, checked against
// the lane's lists. It is pure: no I/O, no clock. Intake checks a job with
// it before storing it, config checks the lists with it, and the HTTP target
// checks the job again before sending it (a job published on the lane's
// public NATS subject reaches the throttler unchecked).
//
// A job may ask for:
//
//   - a path and query under the lane's base URL (Throttle-Path): it never
//     leaves the base's path. Dot segments (also with path parameters,
//     "..;"), backslashes, control characters, the percent-encoded forms of
//     '/', '\', '.', ';' and '%' (double encoding), and encoded characters
//     that Unicode normalisation turns into one of those are refused, so no
//     decoding or normalising of the result, once or twice, can climb out
//     of the base; repeated slashes and "." segments are dropped;
//   - a method listed in target.http.methods (Throttle-Method);
//   - a whole URL under one of target.http.job_urls (Throttle-URL), compared
//     after parsing and normalising: scheme, host, port, and the path on a
//     segment boundary;
//   - headers named in target.http.forward_headers (Throttle-Forward-<Name>,
//     sent as <Name>). Hop-by-hop headers, Host, Content-Length,
//     Content-Type, Idempotency-Key, the signing headers, the trace headers
//     and the throttler's own Throttle-* headers can never be listed.
package dest

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"
)

// Headers a job names its destination with, on HTTP and on NATS.
const (
	HeaderPath   = "Throttle-Path"
	HeaderMethod = "Throttle-Method"
	HeaderURL    = "Throttle-URL"
	// ForwardPrefix starts a header the target receives without it:
	// Throttle-Forward-Authorization is sent as Authorization.
	ForwardPrefix = "Throttle-Forward-"
)

// Bounds of what a job may ask for.
const (
	// MaxPath is the longest Throttle-Path (path and query), in bytes.
	MaxPath = 2048
	// MaxURL is the longest Throttle-URL, in bytes.
	MaxURL = 2048
	// MaxHeaders is the most forwarded headers one job carries.
	MaxHeaders = 32
	// MaxHeaderBytes bounds the names and values of one job's forwarded
	// headers together.
	MaxHeaderBytes = 8 << 10
)

// Sentinel errors of a refused request; each comes wrapped in an *Error
// naming the header at fault.
var (
	// ErrPathEscapes: a path that could leave the base (a dot segment, an
	// encoded slash, backslash, dot or percent).
	ErrPathEscapes = errors.New("the path could leave the lane's base path")
	// ErrBadPath: a path or URL that is not valid (control characters, a
	// fragment, too long).
	ErrBadPath = errors.New("the path is not valid")
	// ErrMethodNotAllowed: a method not in target.http.methods.
	ErrMethodNotAllowed = errors.New("the method is not allowed on this lane")
	// ErrHeaderNotAllowed: a forwarded header not in
	// target.http.forward_headers, or one that can never be forwarded.
	ErrHeaderNotAllowed = errors.New("the header may not be forwarded on this lane")
	// ErrBadHeaderValue: a forwarded value with a control character, or
	// headers over MaxHeaders or MaxHeaderBytes.
	ErrBadHeaderValue = errors.New("the forwarded header is not valid")
	// ErrURLNotAllowed: a URL under none of target.http.job_urls, or a
	// lane without job_urls.
	ErrURLNotAllowed = errors.New("the URL is not under any of the lane's job_urls")
	// ErrNotHTTP: a destination asked of a lane whose target is not HTTP.
	ErrNotHTTP = errors.New("the lane's target is not HTTP")
	// ErrNotKeyHost: on a url_host lane, a key's own url whose host is
	// another key (it would give that host a second bucket).
	ErrNotKeyHost = errors.New("the URL's host is not the key")
)

// Error is a refused request: Field names the header at fault
// (Throttle-Path, Throttle-Forward-X-Api-Key, …), Err is the sentinel and
// Detail says why. Values are never in it: a forwarded value may be a
// secret.
type Error struct {
	Field  string
	Err    error
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Field + ": " + e.Err.Error()
	}
	return e.Field + ": " + e.Err.Error() + ": " + e.Detail
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

func refuse(field string, err error, format string, args ...any) *Error {
	return &Error{Field: field, Err: err, Detail: fmt.Sprintf(format, args...)}
}

// Request is where a job asks to go; the zero value asks for the lane's
// target as configured. Headers maps canonical names (as sent to the
// target) to values.
type Request struct {
	Method  string
	Path    string
	URL     string
	Headers map[string]string
}

// IsZero reports whether r asks for nothing of its own.
func (r Request) IsZero() bool {
	return r.Method == "" && r.Path == "" && r.URL == "" && len(r.Headers) == 0
}

// HeaderNames is the names of the forwarded headers, sorted: what listings
// show (values never).
func (r Request) HeaderNames() []string {
	if len(r.Headers) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(r.Headers))
}

// Methods a lane may list (target.http.method and target.http.methods).
var Methods = []string{"POST", "PUT", "PATCH", "GET", "DELETE"}

// ValidMethod reports whether m is one of Methods.
func ValidMethod(m string) bool { return slices.Contains(Methods, m) }

// neverForwarded are the headers no lane may forward: hop-by-hop
// (RFC 9110 §7.6.1), those Go or the target set itself, the signing and
// trace headers, and the proxy ones.
var neverForwarded = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Host": true, "Content-Length": true, "Content-Type": true, "Expect": true,
	"Idempotency-Key": true, "Webhook-Id": true, "Webhook-Timestamp": true, "Webhook-Signature": true,
	"Traceparent": true, "Tracestate": true, "Baggage": true,
}

// CheckForwardName says why name can never be listed in
// target.http.forward_headers (or a key's headers), or nil.
func CheckForwardName(name string) error {
	c := http.CanonicalHeaderKey(name)
	switch {
	case !httpguts.ValidHeaderFieldName(name):
		return fmt.Errorf("%q is not a valid header name (letters, digits and !#$%%&'*+-.^_`|~)", name)
	case neverForwarded[c]:
		return fmt.Errorf("%q can never be forwarded (hop-by-hop, set by the target, signing or trace header)", name)
	case strings.HasPrefix(c, "Throttle-") || strings.HasPrefix(c, "Throttler-"):
		return fmt.Errorf("%q is one of the throttler's own headers and can never be forwarded", name)
	}
	return nil
}

// ValidHeaderValue reports whether v is an RFC 9110 field value without
// obsolete line folding: no control character other than a tab.
func ValidHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// Config is a lane's lists, as the file gives them.
type Config struct {
	// URL is target.http.url, the base of a job's path.
	URL string
	// Method is target.http.method, the default; "" means POST.
	Method string
	// Methods is target.http.methods; empty allows Method alone.
	Methods []string
	// ForwardHeaders is target.http.forward_headers.
	ForwardHeaders []string
	// JobURLs is target.http.job_urls.
	JobURLs []string
}

// FieldError is a Config error naming its key (methods[1], job_urls[0]).
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

// Rules are a lane's checked lists. The zero value is not usable: make
// them with New. Rules are immutable and safe for concurrent use.
type Rules struct {
	base *url.URL
	// baseEsc is base's escaped path without its trailing slash: what a
	// job's path is appended to, computed once.
	baseEsc  string
	method   string
	methods  []string
	forward  map[string]bool
	prefixes []prefix
	// baseKey is base's key on a url_host lane (BaseKey).
	baseKey string
}

// prefix is a normalised job_urls entry: scheme, host (lower case) with
// its effective port, and the path, without a trailing slash.
type prefix struct {
	raw                string
	scheme, host, port string
	path               string
}

// New checks cfg and returns its Rules. An error is a *FieldError naming
// the key under target.http.
func New(cfg Config) (*Rules, error) {
	base, err := url.Parse(cfg.URL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, &FieldError{"url", fmt.Sprintf("%q is not an absolute http(s) URL with a host", cfg.URL)}
	}
	r := &Rules{base: base, baseEsc: strings.TrimSuffix(base.EscapedPath(), "/"), method: cfg.Method}
	if k, err := HostKey(cfg.URL); err == nil {
		r.baseKey = k
	}
	if r.method == "" {
		r.method = http.MethodPost
	}
	r.methods = []string{r.method}
	for i, m := range cfg.Methods {
		if !ValidMethod(m) {
			return nil, &FieldError{fmt.Sprintf("methods[%d]", i), fmt.Sprintf("%q is not one of %s", m, strings.Join(Methods, ", "))}
		}
		if !slices.Contains(r.methods, m) {
			r.methods = append(r.methods, m)
		}
	}
	if len(cfg.ForwardHeaders) > 0 {
		r.forward = make(map[string]bool, len(cfg.ForwardHeaders))
	}
	for i, h := range cfg.ForwardHeaders {
		if err := CheckForwardName(h); err != nil {
			return nil, &FieldError{fmt.Sprintf("forward_headers[%d]", i), err.Error()}
		}
		r.forward[http.CanonicalHeaderKey(h)] = true
	}
	for i, s := range cfg.JobURLs {
		p, err := parsePrefix(s)
		if err != nil {
			return nil, &FieldError{fmt.Sprintf("job_urls[%d]", i), err.Error()}
		}
		r.prefixes = append(r.prefixes, p)
	}
	return r, nil
}

func parsePrefix(s string) (prefix, error) {
	u, err := parseJobURL(s)
	if err != nil {
		return prefix{}, err
	}
	if u.RawQuery != "" || u.ForceQuery {
		return prefix{}, fmt.Errorf("%q has a query; a prefix is scheme, host, port and path", s)
	}
	p := prefix{raw: s, scheme: u.Scheme, host: u.Hostname(), port: effectivePort(u), path: strings.TrimSuffix(u.EscapedPath(), "/")}
	return p, nil
}

// effectivePort is u's port, or the scheme's default.
func effectivePort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	return defaultPort(u.Scheme)
}

// parseJobURL parses an absolute URL a job or a prefix names, refusing
// what could confuse a comparison: no user info, no fragment, no backslash
// or control character, a host name of letters, digits, dots and hyphens (or
// a bracketed IPv6 literal), and a path that passes checkPath.
func parseJobURL(s string) (*url.URL, error) {
	if len(s) > MaxURL {
		return nil, fmt.Errorf("%w: %d bytes; at most %d", ErrBadPath, len(s), MaxURL)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return nil, fmt.Errorf("%w: byte 0x%02x at %d (no spaces, controls, backslashes or non-ASCII)", ErrBadPath, c, i)
		}
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: not a URL", ErrBadPath)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%w: the scheme is not http or https", ErrBadPath)
	case u.Opaque != "" || u.Host == "":
		return nil, fmt.Errorf("%w: not an absolute URL with a host", ErrBadPath)
	case u.User != nil || strings.Contains(u.Host, "@"):
		return nil, fmt.Errorf("%w: user info is not allowed", ErrBadPath)
	case u.Fragment != "" || strings.Contains(s, "#"):
		return nil, fmt.Errorf("%w: a fragment is not allowed", ErrBadPath)
	}
	if !validHost(u.Hostname()) {
		return nil, fmt.Errorf("%w: the host is not a DNS name or IP literal", ErrBadPath)
	}
	if p := u.Port(); p != "" {
		if len(p) > 5 || strings.TrimLeft(p, "0123456789") != "" || p[0] == '0' {
			return nil, fmt.Errorf("%w: the port is not a number", ErrBadPath)
		}
	}
	u.Host = strings.ToLower(u.Host)
	norm, err := checkPath(u.EscapedPath())
	if err != nil {
		return nil, err
	}
	if err := setPath(u, "/"+norm); err != nil {
		return nil, err
	}
	return u, nil
}

// validHost: a DNS name (letters, digits, hyphens, dots between labels, no
// trailing dot) or an IP literal.
func validHost(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	if strings.Contains(h, ":") { // an IPv6 literal (Hostname strips the brackets)
		for i := 0; i < len(h); i++ {
			c := h[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == ':' || c == '.') {
				return false
			}
		}
		return true
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-') {
				return false
			}
		}
	}
	return true
}

// Check validates req against the rules without building anything: what
// intake runs before storing a job.
func (r *Rules) Check(req Request) error {
	_, _, err := r.resolve(req, nil, nil)
	return err
}

// Resolved is where a job goes.
type Resolved struct {
	Method string
	// URL is nil when the job goes to the base URL as configured.
	URL *url.URL
	// Header holds the forwarded headers (canonical names); nil for none.
	Header http.Header
}

// Resolve checks req and returns where it goes. keyURL, when not nil, is
// the job's key's URL (already checked against the prefixes when it was
// stored): it replaces the base when the job names no URL of its own.
// An error is an *Error naming the header at fault.
func (r *Rules) Resolve(req Request, keyURL *url.URL) (Resolved, error) {
	var h http.Header
	if len(req.Headers) > 0 {
		h = make(http.Header, len(req.Headers))
	}
	method, u, err := r.resolve(req, keyURL, h)
	if err != nil {
		return Resolved{Method: r.method}, err
	}
	return Resolved{Method: method, URL: u, Header: h}, nil
}

// ResolveInto is Resolve writing the forwarded headers straight into h, a
// request's header the caller owns, instead of a map of their own: what a
// delivery runs, once per job. On an error h may hold some of them: drop
// the request.
func (r *Rules) ResolveInto(req Request, keyURL *url.URL, h http.Header) (method string, u *url.URL, err error) {
	if h == nil && len(req.Headers) > 0 {
		return r.method, nil, errors.New("dest: ResolveInto with a nil header")
	}
	return r.resolve(req, keyURL, h)
}

// resolve checks req; with h, it writes the forwarded headers into it.
func (r *Rules) resolve(req Request, keyURL *url.URL, h http.Header) (method string, u *url.URL, err error) {
	method = r.method
	if req.Method != "" {
		if !slices.Contains(r.methods, req.Method) {
			return r.method, nil, refuse(HeaderMethod, ErrMethodNotAllowed, "%q is not one of %s (target.http.methods)", clip(req.Method), strings.Join(r.methods, ", "))
		}
		method = req.Method
	}
	base, baseEsc := r.base, r.baseEsc
	if keyURL != nil {
		base, baseEsc = keyURL, ""
	}
	if req.URL != "" {
		if u, err = r.checkURL(req.URL); err != nil {
			return r.method, nil, err
		}
		base, baseEsc = u, ""
	}
	if req.Path != "" {
		if base != r.base {
			baseEsc = strings.TrimSuffix(base.EscapedPath(), "/")
		}
		if u, err = join(base, baseEsc, req.Path); err != nil {
			return r.method, nil, err
		}
	} else if keyURL != nil && u == nil {
		u = keyURL
	}
	if len(req.Headers) > 0 {
		if err := r.headers(ForwardPrefix, req.Headers, h); err != nil {
			return r.method, nil, err
		}
	}
	return method, u, nil
}

// headers checks forwarded headers and, with out, writes them into it;
// field+name names one at fault: the first in name order, whatever order
// the map gives.
func (r *Rules) headers(field string, hs map[string]string, out http.Header) error {
	if len(hs) > MaxHeaders {
		return refuse(field+"*", ErrBadHeaderValue, "%d forwarded headers; at most %d", len(hs), MaxHeaders)
	}
	// The common case: every name canonical (so no two of them are one
	// header, and map order cannot choose between two values) and allowed,
	// checked and written in one pass, with one allocation for all the
	// values. Anything else goes to headersSorted, which names the first at
	// fault in name order (and writes every header again).
	var vals []string
	if out != nil {
		vals = make([]string, 0, len(hs))
	}
	size := 0
	for name, v := range hs {
		// A name in r.forward passed CheckForwardName when the rules
		// were made.
		if !r.forward[name] || http.CanonicalHeaderKey(name) != name || !ValidHeaderValue(v) {
			return r.headersSorted(field, hs, out)
		}
		size += len(name) + len(v)
		if out != nil {
			vals = append(vals, v)
			out[name] = vals[len(vals)-1 : len(vals) : len(vals)]
		}
	}
	if size > MaxHeaderBytes {
		return refuse(field+"*", ErrBadHeaderValue, "forwarded headers of %d bytes; at most %d", size, MaxHeaderBytes)
	}
	return nil
}

// headersSorted is headers one name at a time in name order: the first
// refused is the one named, and of two spellings of one header the last
// in name order is sent.
func (r *Rules) headersSorted(field string, hs map[string]string, out http.Header) error {
	size := 0
	for _, name := range slices.Sorted(maps.Keys(hs)) {
		v := hs[name]
		f := field + clip(name)
		if err := CheckForwardName(name); err != nil {
			return refuse(f, ErrHeaderNotAllowed, "%v", err)
		}
		c := http.CanonicalHeaderKey(name)
		if !r.forward[c] {
			return refuse(f, ErrHeaderNotAllowed, "%s is not in target.http.forward_headers", c)
		}
		if !ValidHeaderValue(v) {
			return refuse(f, ErrBadHeaderValue, "the value has a control character")
		}
		size += len(name) + len(v)
	}
	if size > MaxHeaderBytes {
		return refuse(field+"*", ErrBadHeaderValue, "forwarded headers of %d bytes; at most %d", size, MaxHeaderBytes)
	}
	if out != nil {
		for _, name := range slices.Sorted(maps.Keys(hs)) {
			out[http.CanonicalHeaderKey(name)] = []string{hs[name]}
		}
	}
	return nil
}

// CheckKeyHeaders checks the headers a key's override sends with its jobs:
// the same rules as a job's forwarded headers. field names the body member.
func (r *Rules) CheckKeyHeaders(hs map[string]string) error {
	return r.headers("headers/", hs, nil)
}

// CheckURL checks a URL a job or a key names against the prefixes and
// returns it parsed; an *Error names Throttle-URL.
func (r *Rules) CheckURL(s string) (*url.URL, error) { return r.checkURL(s) }

func (r *Rules) checkURL(s string) (*url.URL, error) {
	if len(r.prefixes) == 0 {
		return nil, refuse(HeaderURL, ErrURLNotAllowed, "the lane lists no target.http.job_urls")
	}
	u, err := parseJobURL(s)
	if err != nil {
		if errors.Is(err, ErrPathEscapes) {
			return nil, &Error{Field: HeaderURL, Err: ErrPathEscapes, Detail: escapeDetail("the URL's path has ", err)}
		}
		return nil, &Error{Field: HeaderURL, Err: ErrBadPath, Detail: strings.TrimPrefix(err.Error(), ErrBadPath.Error()+": ")}
	}
	if under(r.prefixes, u) {
		return u, nil
	}
	return nil, refuse(HeaderURL, ErrURLNotAllowed, "scheme, host, port and path are under none of target.http.job_urls")
}

// join puts path (a Throttle-Path: path and query) under base's path;
// baseEsc is base's escaped path without its trailing slash.
func join(base *url.URL, baseEsc, p string) (*url.URL, error) {
	if len(p) > MaxPath {
		return nil, refuse(HeaderPath, ErrBadPath, "%d bytes; at most %d", len(p), MaxPath)
	}
	rawPath, query, hasQuery := strings.Cut(p, "?")
	norm, err := checkPath(rawPath)
	if err != nil {
		if errors.Is(err, ErrPathEscapes) {
			return nil, &Error{Field: HeaderPath, Err: ErrPathEscapes, Detail: escapeDetail("it has ", err)}
		}
		return nil, &Error{Field: HeaderPath, Err: ErrBadPath, Detail: strings.TrimPrefix(err.Error(), ErrBadPath.Error()+": ")}
	}
	if hasQuery {
		if err := checkQuery(query); err != nil {
			return nil, &Error{Field: HeaderPath, Err: ErrBadPath, Detail: strings.TrimPrefix(err.Error(), ErrBadPath.Error()+": ")}
		}
	}
	u := *base
	u.User = nil
	escaped := baseEsc
	if norm != "" {
		escaped += "/" + norm
	} else if escaped == "" {
		escaped = "/"
	}
	if err := setPath(&u, escaped); err != nil {
		return nil, refuse(HeaderPath, ErrBadPath, "bad percent-encoding")
	}
	switch {
	case query == "":
	case u.RawQuery == "":
		u.RawQuery = query
	default:
		u.RawQuery += "&" + query
	}
	return &u, nil
}

// checkPath checks a relative path (no leading slash needed) and returns
// it normalised: leading, repeated and trailing-empty slashes and "."
// segments dropped. A ".." segment, an encoded '/', '\', '.' or '%', or a
// backslash is ErrPathEscapes; a control character, a space, '#', a
// non-ASCII byte or a bad percent-encoding is ErrBadPath. A path already
// normal (the common case) comes back as it is, without allocating.
func checkPath(p string) (string, error) {
	p = strings.TrimLeft(p, "/")
	normal := true // no empty or "." segment after the leading slashes
	for rest := p; ; {
		seg, tail, more := strings.Cut(rest, "/")
		switch seg {
		case "", ".":
			normal = false
		case "..":
			return "", fmt.Errorf("%w: a .. segment", ErrPathEscapes)
		default:
			if err := checkSegment(seg); err != nil {
				return "", err
			}
		}
		if !more {
			break
		}
		rest = tail
	}
	if normal {
		return p, nil
	}
	var b strings.Builder
	b.Grow(len(p))
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "" || seg == "." {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		b.WriteString(seg)
	}
	return b.String(), nil
}

// escapeDetail says what in a path could leave the base path: the reason
// checkPath gave (a .. segment, a backslash, an encoded '/', …) after
// lead.
func escapeDetail(lead string, err error) string {
	return lead + strings.TrimPrefix(err.Error(), ErrPathEscapes.Error()+": ")
}

// checkSegment checks one path segment other than "", "." and "..".
// A "." or ".." followed by path parameters (";…") is a dot segment too:
// Tomcat, Jetty and Spring drop the parameters before they resolve dot
// segments, so "..;/admin" climbs out of the base there.
func checkSegment(seg string) error {
	if head, _, ok := strings.Cut(seg, ";"); ok && (head == "." || head == "..") {
		return fmt.Errorf("%w: a dot segment with path parameters", ErrPathEscapes)
	}
	encoded := false
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		switch {
		case c == '\\':
			return fmt.Errorf("%w: a backslash", ErrPathEscapes)
		case c == '%':
			if i+2 >= len(seg) || !isHex(seg[i+1]) || !isHex(seg[i+2]) {
				return fmt.Errorf("%w: bad percent-encoding", ErrBadPath)
			}
			d := unhex(seg[i+1])<<4 | unhex(seg[i+2])
			switch {
			case d == '/' || d == '\\' || d == '.' || d == '%' || d == ';':
				return fmt.Errorf("%w: an encoded %q", ErrPathEscapes, rune(d))
			case d < ' ' || d == 0x7f:
				return fmt.Errorf("%w: an encoded control byte", ErrBadPath)
			}
			encoded = true
			i += 2
		case !pchar(c):
			return fmt.Errorf("%w: byte 0x%02x is not allowed in a path (encode it)", ErrBadPath, c)
		}
	}
	// Without a '%' the segment is printable ASCII: nothing to decode.
	if encoded {
		dec, err := url.PathUnescape(seg)
		if err != nil || !utf8.ValidString(dec) {
			// Overlong forms (%c0%ae is '.' to a lax decoder) and other
			// invalid UTF-8.
			return fmt.Errorf("%w: the encoded bytes are not valid UTF-8", ErrPathEscapes)
		}
		for _, c := range dec {
			if lookalike[c] {
				return fmt.Errorf("%w: an encoded %U, which a normalising server reads as '.', '/', '\\', ';' or '%%'", ErrPathEscapes, c)
			}
		}
	}
	return nil
}

// lookalike are the characters that Unicode compatibility normalisation
// (NFKC), a Windows best-fit mapping or an IDNA-style reading turn into a
// '.', '/', '\\', ';' or '%': a server that normalises a path after
// decoding it would see a dot segment, a new segment or a second encoding
// where the check saw a name.
var lookalike = map[rune]bool{
	// '.' and runs of them
	'\u2024': true, '\u2025': true, '\u2026': true, '\uFE19': true, '\uFE30': true,
	'\uFE52': true, '\uFF0E': true, '\u3002': true, '\uFF61': true,
	// '/'
	'\u2044': true, '\u2215': true, '\u2571': true, '\u29F8': true, '\uFF0F': true,
	// '\\'
	'\u2216': true, '\u2572': true, '\u29F9': true, '\uFE68': true, '\uFF3C': true,
	// ';'
	'\u037E': true, '\uFE54': true, '\uFF1B': true,
	// '%'
	'\uFE6A': true, '\uFF05': true,
}

// setPath sets u's path to escaped, an escaped path checkPath allowed.
func setPath(u *url.URL, escaped string) error {
	if strings.IndexByte(escaped, '%') < 0 {
		// Nothing to decode (the common case): the path is escaped as it
		// is, and it needs RawPath only where Go's EscapedPath would
		// encode a character checkPath allows as it is: ! ' ( ) *.
		u.Path, u.RawPath = escaped, ""
		if strings.ContainsAny(escaped, "!'()*") {
			u.RawPath = escaped
		}
		return nil
	}
	dec, err := url.PathUnescape(escaped)
	if err != nil {
		return fmt.Errorf("%w: bad percent-encoding", ErrBadPath)
	}
	u.Path, u.RawPath = dec, ""
	if u.EscapedPath() != escaped {
		u.RawPath = escaped
	}
	return nil
}

// checkQuery allows the query characters of RFC 3986 and valid
// percent-encodings of printable bytes.
func checkQuery(q string) error {
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return fmt.Errorf("%w: bad percent-encoding in the query", ErrBadPath)
			}
			if d := unhex(q[i+1])<<4 | unhex(q[i+2]); d < ' ' || d == 0x7f {
				return fmt.Errorf("%w: an encoded control byte in the query", ErrBadPath)
			}
			i += 2
		case c == '/' || c == '?' || pchar(c):
		default:
			return fmt.Errorf("%w: byte 0x%02x is not allowed in a query (encode it)", ErrBadPath, c)
		}
	}
	return nil
}

// pchar: RFC 3986 unreserved, sub-delims, ':' and '@' (not '%': checked
// apart).
func pchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@", c) >= 0
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// clip bounds a client's string quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// HeaderCallback names the URL a job's settled record is POSTed to; it is
// checked against the lane's results.callback_urls (Prefixes).
const HeaderCallback = "Throttle-Callback"

// ErrCallbackNotAllowed: a Throttle-Callback under none of the lane's
// results.callback_urls, or a lane without them.
var ErrCallbackNotAllowed = errors.New("the callback URL is not under any of the lane's results.callback_urls")

// Prefixes are a checked list of URL prefixes (results.callback_urls),
// compared as target.http.job_urls are: scheme, host, port, and the path
// on a segment boundary. Immutable and safe for concurrent use; nil
// allows nothing.
type Prefixes struct{ list []prefix }

// NewPrefixes checks urls; an error is a *FieldError naming the entry
// ("[2]").
func NewPrefixes(urls []string) (*Prefixes, error) {
	p := &Prefixes{}
	for i, s := range urls {
		pr, err := parsePrefix(s)
		if err != nil {
			return nil, &FieldError{fmt.Sprintf("[%d]", i), err.Error()}
		}
		p.list = append(p.list, pr)
	}
	return p, nil
}

// CheckCallback checks a Throttle-Callback value; an *Error names the
// header.
func (p *Prefixes) CheckCallback(s string) (*url.URL, error) {
	if p == nil || len(p.list) == 0 {
		return nil, refuse(HeaderCallback, ErrCallbackNotAllowed, "the lane lists no results.callback_urls")
	}
	u, err := parseJobURL(s)
	if err != nil {
		if errors.Is(err, ErrPathEscapes) {
			return nil, &Error{Field: HeaderCallback, Err: ErrPathEscapes, Detail: escapeDetail("the URL's path has ", err)}
		}
		return nil, &Error{Field: HeaderCallback, Err: ErrBadPath, Detail: strings.TrimPrefix(err.Error(), ErrBadPath.Error()+": ")}
	}
	if !under(p.list, u) {
		return nil, refuse(HeaderCallback, ErrCallbackNotAllowed, "scheme, host, port and path are under none of results.callback_urls")
	}
	return u, nil
}

// Uncovered is the index of the first of p's prefixes that no job URL
// prefix of r covers (every URL under it is then under one of r's
// job_urls), or -1 when r covers them all.
func (r *Rules) Uncovered(p *Prefixes) int {
	for i, c := range p.list {
		covered := false
		for _, j := range r.prefixes {
			if j.scheme == c.scheme && j.host == c.host && j.port == c.port &&
				(c.path == j.path || strings.HasPrefix(c.path, j.path+"/")) {
				covered = true
				break
			}
		}
		if !covered {
			return i
		}
	}
	return -1
}

// under reports whether parsed URL u is under one of list.
func under(list []prefix, u *url.URL) bool {
	host, port, path := u.Hostname(), effectivePort(u), u.EscapedPath()
	for _, p := range list {
		if p.scheme == u.Scheme && p.host == host && p.port == port &&
			(path == p.path || strings.HasPrefix(path, p.path+"/")) {
			return true
		}
	}
	return false
}

// A keyed lane with per_key.key_from: url_host takes the key of a job that
// names a URL and no key from the URL's host: the bucket is the receiving
// host's. The key is the host as the URL comparison sees it (lower case;
// an international name only in its ASCII form, xn--…, since a URL with
// non-ASCII bytes is refused), followed by ":<port>" when the URL names a
// port other than its scheme's default. The scheme is not part of it:
// http://a.example and https://a.example are one receiving host, and
// https://a.example:443 is a.example. An IPv6 literal gives "[…]", which no
// key allows: config refuses such a job_urls entry on a url_host lane.

// KeyFromURLHost is the per_key.key_from value that takes a job's key from
// the host of its URL.
const KeyFromURLHost = "url_host"

// HostKey is the key of URL s on a url_host lane, with no check against
// any prefix: what config runs on a job_urls entry. The caller checks the
// key against the key rules.
func HostKey(s string) (string, error) {
	u, err := parseJobURL(s)
	if err != nil {
		return "", err
	}
	return hostKey(u), nil
}

// hostKey is the key of parsed URL u (parseJobURL lowered its host).
func hostKey(u *url.URL) string {
	host := u.Host
	if p := u.Port(); p != "" && p == defaultPort(u.Scheme) {
		host = strings.TrimSuffix(host, ":"+p)
	}
	return host
}

// defaultPort is scheme's default port.
func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

// BaseKey is the key of the lane's own URL (target.http.url) on a url_host
// lane, whether or not job_urls cover it: the one key whose jobs may name
// no URL without the key having its own. "" when the URL makes no key
// (a host HostKey refuses).
func (r *Rules) BaseKey() string { return r.baseKey }

// KeyOf checks URL s against the prefixes, as a job's Throttle-URL is
// checked, and returns its key on a url_host lane. An error is an *Error
// naming Throttle-URL.
func (r *Rules) KeyOf(s string) (string, error) {
	u, err := r.checkURL(s)
	if err != nil {
		return "", err
	}
	return hostKey(u), nil
}
