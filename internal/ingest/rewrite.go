package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/throttler/throttler/api"
)

// ProblemMalformedRequest: the HTTP server could not read the request
// head (request line, headers, Host, HTTP version, transfer coding), or
// the request was plain HTTP on the HTTPS port. Nothing of it was handled.
const ProblemMalformedRequest = "urn:throttler:problem:malformed-request"

// Why a rewrite rather than a parser of our own in front of net/http: a
// second parser of the request head must agree with net/http's on every
// byte of every request of a keep-alive connection (bodies, chunked
// coding, pipelining), and where the two disagree an attacker chooses
// which one wins. net/http stays the only parser; what changes is only the
// bytes of its refusal. It writes each refusal in one Write on the
// connection, of one fixed shape (net/http's serve: "HTTP/1.1 " + status +
// errorHeaders + body, then it closes), and only while no request is
// being handled: the listener rewrites nothing from the moment a handler
// starts until the server takes the connection for idle, so no answer of
// a handler (whose body a client may choose) is ever taken for a refusal.
// The shapes matched are exactly net/http's, so a change of them in a new
// Go release shows as a failing test (TestServerRefusalsAreProblems),
// never as a wrong rewrite.
//
// Under TLS the listener terminates TLS itself and rewrites above it, on
// HTTP/1 connections (tlslisten.go); plain HTTP on the TLS port is
// answered by the listener, as the handshake fails.
const (
	serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
	// expectFailedPrefix and expectFailedSuffix frame net/http's answer to
	// an Expect header other than 100-continue (its Date between them).
	expectFailedPrefix = "HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: "
	expectFailedSuffix = "\r\nContent-Length: 0\r\n\r\n"
	// maxRewriteDetail bounds the detail taken from a refusal.
	maxRewriteDetail = 200
)

// rewriteServerError returns the problem+json answer that replaces b when b
// is one of net/http's own plain-text refusals, whole; ok is false for any
// other bytes.
func rewriteServerError(b []byte) (out []byte, ok bool) {
	switch {
	case len(b) < 12 || b[0] != 'H':
		return nil, false // TLS records, most writes
	case bytes.HasPrefix(b, []byte(expectFailedPrefix)) && bytes.HasSuffix(b, []byte(expectFailedSuffix)) &&
		len(b) == len(expectFailedPrefix)+len(http.TimeFormat)+len(expectFailedSuffix):
		return problemAnswer("HTTP/1.1", http.StatusExpectationFailed, api.Problem{Field: "Expect",
			Detail: "the only Expect this server understands is 100-continue"}), true
	}
	rest, found := bytes.CutPrefix(b, []byte("HTTP/1.1 "))
	if !found {
		return nil, false
	}
	// The headers follow the status line: a look at its end, not a
	// search of the whole write (every answer passes here).
	i := bytes.IndexByte(rest, '\r')
	if i < 0 || !bytes.HasPrefix(rest[i:], []byte(serverErrorHeaders)) {
		return nil, false
	}
	status, body := string(rest[:i]), string(rest[i+len(serverErrorHeaders):])
	code, text, reason := parseStatus(status)
	if code < 400 || code > 599 || text != http.StatusText(code) {
		return nil, false
	}
	switch {
	case body == status: // "400 Bad Request: invalid header name", "431 …"
	case code == http.StatusNotImplemented && reason == "" && body == "Unsupported transfer encoding":
		reason = body
	default:
		return nil, false
	}
	return problemAnswer("HTTP/1.1", code, serverProblem(code, reason)), true
}

// parseStatus splits "400 Bad Request: why" into its code, status text and
// reason; code is 0 when status does not start with three digits and a
// space.
func parseStatus(status string) (code int, text, reason string) {
	if len(status) < 5 || status[3] != ' ' {
		return 0, "", ""
	}
	code, err := strconv.Atoi(status[:3])
	if err != nil {
		return 0, "", ""
	}
	text = status[4:]
	if j := bytes.Index([]byte(text), []byte(": ")); j >= 0 {
		text, reason = text[:j], text[j+2:]
	}
	return code, text, reason
}

// serverProblem says what net/http refused, naming the part of the request
// where its reason does.
func serverProblem(code int, reason string) api.Problem {
	p := api.Problem{Detail: reason}
	switch {
	case code == http.StatusRequestHeaderFieldsTooLarge:
		p.Field, p.Detail = "headers", "the request's headers are larger than the server reads (1 MiB)"
	case code == http.StatusHTTPVersionNotSupported:
		p.Field, p.Detail = "version", "the request's HTTP version is not served here (HTTP/1.0 and HTTP/1.1 are, and HTTP/2 over TLS)"
	case code == http.StatusNotImplemented:
		p.Field, p.Detail = "Transfer-Encoding", "the request's Transfer-Encoding is not one this server reads (chunked)"
	case reason == "missing required Host header" || reason == "malformed Host header":
		p.Field = "Host"
	case reason == "invalid header name" || reason == "invalid header value":
		p.Field, p.Detail = "headers", reason+": a header holds a byte HTTP does not allow there (a control character, a space in a name)"
	case reason == "":
		p.Detail = "the request head is not valid HTTP/1.1: a malformed request line or header line (a control character, no colon), two Host headers, or a bad Content-Length"
	}
	if len(p.Detail) > maxRewriteDetail {
		p.Detail = p.Detail[:maxRewriteDetail]
	}
	if !utf8.ValidString(p.Detail) {
		p.Detail = "the request head is not valid HTTP/1.1"
	}
	return p
}

// problemAnswer is a whole HTTP response carrying p (type malformed-request)
// that closes the connection.
func problemAnswer(proto string, code int, p api.Problem) []byte {
	p.Type, p.Title, p.Status = ProblemMalformedRequest, http.StatusText(code), code
	body, _ := json.Marshal(p)
	return fmt.Appendf(nil, "%s %d %s\r\nContent-Type: %s\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		proto, code, http.StatusText(code), problemContentType, len(body), body)
}
