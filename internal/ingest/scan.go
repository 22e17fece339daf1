package ingest

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/throttler/throttler/api"
)

// scanBatch decodes a batch body of the usual form in one pass without
// reflection: a JSON array of objects whose keys are the fields of
// api.BatchItem spelled exactly, each at most once; whose string values
// are printable ASCII without escapes; and whose payloads are valid JSON.
// It appends the items to items and answers false on anything else (an
// escape, a key spelled otherwise, bad JSON, an empty array, more than
// maxItems, data after the array): encoding/json then decides, and
// FuzzParseBatch holds both ways to the same jobs and problems.
//
// A payload is a slice of body, not a copy: the body is read into a
// buffer of its own for each request and never written again.
func scanBatch(body []byte, items []api.BatchItem, maxItems int) ([]api.BatchItem, bool) {
	s := scanner{b: body}
	s.space()
	if !s.byte('[') {
		return items, false
	}
	for {
		if len(items) >= maxItems {
			return items, false
		}
		s.space()
		var it api.BatchItem
		if !s.item(&it) {
			return items, false
		}
		items = append(items, it)
		s.space()
		if s.byte(']') {
			break
		}
		if !s.byte(',') {
			return items, false
		}
	}
	s.space()
	return items, s.i == len(s.b)
}

// scanner reads a JSON body from b at i.
type scanner struct {
	b []byte
	i int
}

// maxScanDepth bounds the nesting of a payload scanBatch reads itself;
// deeper ones go to encoding/json (which refuses past 10,000).
const maxScanDepth = 64

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// byte consumes c when it is next.
func (s *scanner) byte(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// Fields of an item, one bit each, to refuse a key given twice.
const (
	fieldKey = 1 << iota
	fieldPayload
	fieldBase64
	fieldContentType
	fieldThrottleKey
)

// item reads one object of the array into it.
func (s *scanner) item(it *api.BatchItem) bool {
	if !s.byte('{') {
		return false
	}
	s.space()
	if s.byte('}') {
		return true
	}
	seen := 0
	for {
		s.space()
		key, ok := s.plainString()
		if !ok {
			return false
		}
		s.space()
		if !s.byte(':') {
			return false
		}
		s.space()
		var bit int
		var dst *string
		switch string(key) { // no allocation: compared in place
		case "idempotency_key":
			bit, dst = fieldKey, &it.IdempotencyKey
		case "payload":
			bit = fieldPayload
		case "payload_base64":
			bit, dst = fieldBase64, &it.PayloadBase64
		case "content_type":
			bit, dst = fieldContentType, &it.ContentType
		case "throttle_key":
			bit, dst = fieldThrottleKey, &it.ThrottleKey
		default:
			return false
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		if dst != nil {
			v, ok := s.plainString()
			if !ok {
				return false
			}
			*dst = string(v)
		} else {
			start := s.i
			if !s.value(0) {
				return false
			}
			it.Payload = json.RawMessage(s.b[start:s.i:s.i])
		}
		s.space()
		if s.byte('}') {
			return true
		}
		if !s.byte(',') {
			return false
		}
	}
}

// plainString reads a string of printable ASCII without escapes and
// answers its contents.
func (s *scanner) plainString() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], true
		case c < ' ' || c > '~' || c == '\\':
			return nil, false
		}
		s.i++
	}
	return nil, false
}

// value reads one JSON value, as encoding/json's scanner accepts it.
func (s *scanner) value(depth int) bool {
	if s.i >= len(s.b) || depth > maxScanDepth {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		s.i++
		s.space()
		if s.byte('}') {
			return true
		}
		for {
			s.space()
			if !s.str() {
				return false
			}
			s.space()
			if !s.byte(':') {
				return false
			}
			s.space()
			if !s.value(depth + 1) {
				return false
			}
			s.space()
			if s.byte('}') {
				return true
			}
			if !s.byte(',') {
				return false
			}
		}
	case c == '[':
		s.i++
		s.space()
		if s.byte(']') {
			return true
		}
		for {
			s.space()
			if !s.value(depth + 1) {
				return false
			}
			s.space()
			if s.byte(']') {
				return true
			}
			if !s.byte(',') {
				return false
			}
		}
	case c == '"':
		return s.str()
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return false
}

func (s *scanner) literal(word string) bool {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return false
	}
	s.i += len(word)
	return true
}

// str reads a JSON string: no control characters, valid escapes, valid
// UTF-8.
func (s *scanner) str() bool {
	if !s.byte('"') {
		return false
	}
	for s.i < len(s.b) {
		c := s.b[s.i]
		s.i++
		switch {
		case c == '"':
			return true
		case c < ' ':
			return false
		case c >= utf8.RuneSelf:
			// Not valid UTF-8: decodeStrict refuses it, naming where.
			r, n := utf8.DecodeRune(s.b[s.i-1:])
			if r == utf8.RuneError && n == 1 {
				return false
			}
			s.i += n - 1
		case c == '\\':
			if s.i >= len(s.b) {
				return false
			}
			e := s.b[s.i]
			s.i++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(s.b)-s.i < 4 {
					return false
				}
				for _, h := range s.b[s.i : s.i+4] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return false
					}
				}
				s.i += 4
			default:
				return false
			}
		}
	}
	return false
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func (s *scanner) number() bool {
	s.byte('-')
	switch {
	case s.byte('0'):
	case s.i < len(s.b) && s.b[s.i] >= '1' && s.b[s.i] <= '9':
		s.digits()
	default:
		return false
	}
	if s.byte('.') && !s.digits() {
		return false
	}
	if s.byte('e') || s.byte('E') {
		if !s.byte('+') {
			s.byte('-')
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits reads one or more digits.
func (s *scanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}
