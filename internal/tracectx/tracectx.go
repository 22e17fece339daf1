// Package tracectx reads, checks and writes W3C trace context (traceparent,
// tracestate; https://www.w3.org/TR/trace-context/) and W3C baggage
// (https://www.w3.org/TR/baggage/) as a job carries them from its submitter
// to its target, and a span's identity (SpanContext: the parent of the
// throttler's spans, and what a target receives as its parent). It knows
// no NATS, HTTP or OpenTelemetry.
//
// A Context is what the throttler stores with a job: the submitter's
// traceparent (re-written in version 00 form), its tracestate and its
// baggage, each checked and bounded. The zero Context carries nothing.
// Values are safe for concurrent use (they are immutable strings).
package tracectx

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Header names, as W3C writes them (lower case; HTTP is case-insensitive,
// NATS headers are written this way).
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
	HeaderBaggage     = "baggage"
)

// Bounds of what a job may carry. A longer value is refused at HTTP intake
// and dropped (logged) at NATS intake.
const (
	// MaxTracestate bounds a tracestate header, in bytes: the 512 every
	// W3C platform must pass on.
	MaxTracestate = 512
	// maxTracestateMembers is W3C's limit of list members.
	maxTracestateMembers = 32
	// MaxBaggage bounds a baggage header, in bytes (W3C's limit).
	MaxBaggage = 8192
	// maxBaggageMembers is W3C's limit of list members.
	maxBaggageMembers = 64
	// maxTraceparent bounds a traceparent of a later version (extra
	// fields after the flags); version 00 is exactly 55 bytes.
	maxTraceparent = 256
)

// ErrInvalid is the error of a header that is not well formed or over its
// bound; the wrapping *Error names the header.
var ErrInvalid = errors.New("tracectx: invalid trace context")

// Error names the header (traceparent, tracestate, baggage) a check refused.
type Error struct {
	Header string
	Msg    string
}

func (e *Error) Error() string { return e.Header + ": " + e.Msg }

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *Error) Unwrap() error { return ErrInvalid }

// TraceID and SpanID are the ids of W3C trace context.
type (
	TraceID [16]byte
	SpanID  [8]byte
)

// Context is the trace context a job carries.
type Context struct {
	// Parent is the submitter's traceparent in version 00 form; empty for
	// none.
	Parent string
	// State is the tracestate that came with Parent; empty for none.
	State string
	// Baggage is the W3C baggage; it may come without a Parent.
	Baggage string
}

// IsZero reports whether c carries nothing.
func (c Context) IsZero() bool { return c.Parent == "" && c.State == "" && c.Baggage == "" }

// Parse checks the three headers as a submitter sent them (each may be
// empty) and returns the context to store. A tracestate without a
// traceparent is refused: it means nothing alone.
func Parse(traceparent, tracestate, baggage string) (Context, error) {
	var c Context
	if traceparent != "" {
		tid, sid, flags, err := ParseParent(traceparent)
		if err != nil {
			return Context{}, err
		}
		c.Parent = Format(tid, sid, flags)
	}
	if tracestate != "" {
		if c.Parent == "" {
			return Context{}, &Error{HeaderTracestate, "a tracestate needs a traceparent"}
		}
		if err := CheckState(tracestate); err != nil {
			return Context{}, err
		}
		c.State = tracestate
	}
	if baggage != "" {
		if err := CheckBaggage(baggage); err != nil {
			return Context{}, err
		}
		c.Baggage = baggage
	}
	return c, nil
}

// ParseParent reads a traceparent: version 00 exactly
// ("00-<32 hex>-<16 hex>-<2 hex>"), or a later version (not ff) whose first
// 55 bytes have that form and whose next byte, if any, is '-'. Hex is lower
// case; an all-zero trace or span id is invalid.
func ParseParent(s string) (tid TraceID, sid SpanID, flags byte, err error) {
	bad := func(msg string) (TraceID, SpanID, byte, error) {
		return TraceID{}, SpanID{}, 0, &Error{HeaderTraceparent, msg + ` (the form is "00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>", lower case)`}
	}
	if len(s) < 55 {
		return bad(fmt.Sprintf("%d bytes, too short", len(s)))
	}
	if len(s) > maxTraceparent {
		return bad(fmt.Sprintf("%d bytes, over %d", len(s), maxTraceparent))
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return bad("the fields are not separated by '-' where expected")
	}
	var ver [1]byte
	if !lowerHex(s[0:2]) || !lowerHex(s[3:35]) || !lowerHex(s[36:52]) || !lowerHex(s[53:55]) {
		return bad("a field is not lower-case hex")
	}
	_, _ = hex.Decode(ver[:], []byte(s[0:2]))
	switch {
	case ver[0] == 0xff:
		return bad("version ff is invalid")
	case ver[0] == 0 && len(s) != 55:
		return bad(fmt.Sprintf("version 00 is 55 bytes, not %d", len(s)))
	case ver[0] != 0 && len(s) > 55 && s[55] != '-':
		return bad("a later version's extra fields must follow a '-'")
	}
	_, _ = hex.Decode(tid[:], []byte(s[3:35]))
	_, _ = hex.Decode(sid[:], []byte(s[36:52]))
	var f [1]byte
	_, _ = hex.Decode(f[:], []byte(s[53:55]))
	if tid == (TraceID{}) {
		return bad("the trace-id is all zeros")
	}
	if sid == (SpanID{}) {
		return bad("the parent-id is all zeros")
	}
	return tid, sid, f[0], nil
}

// Format writes a version 00 traceparent.
func Format(tid TraceID, sid SpanID, flags byte) string {
	var b [55]byte
	b[0], b[1], b[2] = '0', '0', '-'
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	hex.Encode(b[53:55], []byte{flags})
	return string(b[:])
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// CheckState checks a tracestate: at most MaxTracestate bytes and 32 list
// members, each "key=value" with W3C's key (lower-case letters, digits,
// _-*/ and one optional '@' vendor part) and value (printable ASCII but ','
// and '=', not ending in a space) forms; empty members and spaces or tabs
// around members are allowed.
func CheckState(s string) error {
	bad := func(format string, args ...any) error {
		return &Error{HeaderTracestate, fmt.Sprintf(format, args...)}
	}
	if len(s) > MaxTracestate {
		return bad("%d bytes; at most %d are kept", len(s), MaxTracestate)
	}
	n := 0
	seen := map[string]bool{}
	for m := range strings.SplitSeq(s, ",") {
		m = strings.Trim(m, " \t")
		if m == "" {
			continue
		}
		n++
		if n > maxTracestateMembers {
			return bad("more than %d list members", maxTracestateMembers)
		}
		k, v, ok := strings.Cut(m, "=")
		if !ok {
			return bad("list member %d has no '='", n)
		}
		if !stateKey(k) {
			return bad("list member %d: %q is not a valid key", n, k)
		}
		if seen[k] {
			return bad("the key %q appears twice", k)
		}
		seen[k] = true
		if !stateValue(v) {
			return bad("list member %d: the value of %q is not valid (printable ASCII but ',' and '=', at most 256 bytes)", n, k)
		}
	}
	return nil
}

func stateKey(k string) bool {
	tenant, system, multi := strings.Cut(k, "@")
	if !multi {
		return len(k) <= 256 && keyChars(k, true)
	}
	return len(tenant) <= 241 && len(system) <= 14 && keyChars(tenant, false) && keyChars(system, true)
}

// keyChars checks a tracestate key part: lcalpha/digit first (lcalpha only
// for a simple key or a system id), then lcalpha, digits and _-*/.
func keyChars(s string, alphaFirst bool) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		lower, digit := c >= 'a' && c <= 'z', c >= '0' && c <= '9'
		switch {
		case i == 0 && alphaFirst && !lower:
			return false
		case i == 0 && !lower && !digit:
			return false
		case !lower && !digit && c != '_' && c != '-' && c != '*' && c != '/':
			return false
		}
	}
	return true
}

func stateValue(v string) bool {
	if v == "" || len(v) > 256 || v[len(v)-1] == ' ' {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e || c == ',' || c == '=' {
			return false
		}
	}
	return true
}

// CheckBaggage checks a baggage header: at most MaxBaggage bytes and 64
// list members, each "key=value" with optional ";property" parts, keys RFC
// 9110 tokens, values baggage octets (printable ASCII but space, '"', ',',
// ';' and '\'; anything else percent-encoded).
func CheckBaggage(s string) error {
	bad := func(format string, args ...any) error {
		return &Error{HeaderBaggage, fmt.Sprintf(format, args...)}
	}
	if len(s) > MaxBaggage {
		return bad("%d bytes; at most %d are allowed", len(s), MaxBaggage)
	}
	n := 0
	for m := range strings.SplitSeq(s, ",") {
		n++
		if n > maxBaggageMembers {
			return bad("more than %d list members", maxBaggageMembers)
		}
		parts := strings.Split(m, ";")
		k, v, ok := strings.Cut(parts[0], "=")
		k, v = strings.Trim(k, " \t"), strings.Trim(v, " \t")
		if !ok || !token(k) {
			return bad("list member %d is not key=value with a token key", n)
		}
		if !baggageValue(v) {
			return bad("list member %d: the value of %q has a byte that must be percent-encoded", n, k)
		}
		for _, p := range parts[1:] {
			pk, pv, hasV := strings.Cut(p, "=")
			pk, pv = strings.Trim(pk, " \t"), strings.Trim(pv, " \t")
			if !token(pk) || (hasV && !baggageValue(pv)) {
				return bad("list member %d: the property %q is not valid", n, strings.Trim(p, " \t"))
			}
		}
	}
	return nil
}

// token reports whether s is an RFC 9110 token, as a baggage key is.
func token(s string) bool { return httpguts.ValidHeaderFieldName(s) }

func baggageValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= 0x20 || c > 0x7e || c == '"' || c == ',' || c == ';' || c == '\\' {
			return false
		}
	}
	return true
}
