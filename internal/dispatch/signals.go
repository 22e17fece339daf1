package dispatch

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxPause caps every wait a downstream asks for (Retry-After, rate-limit
// resets): a longer value is cut to MaxPause, so that a misconfigured or
// hostile downstream cannot stop a lane for days.
const MaxPause = time.Hour

// epochSeconds and epochMillis tell a reset given as a Unix timestamp from
// one given in delta-seconds: no API asks for a 30-year wait.
const (
	epochSeconds = 1e9
	epochMillis  = 1e12
)

// downstreamSignals reads what a response asks of the caller:
//
//   - Retry-After (delta-seconds or HTTP-date) on 429 or 503: retryAfter
//     and pause both get the wait;
//   - X-RateLimit-Remaining: 0 (or the older draft's RateLimit-Remaining)
//     with a reset, on any status: pause until the reset;
//   - the IETF RateLimit header with a policy at remaining 0, on any
//     status: pause for its reset (t).
//
// The longest of the pauses wins; each is capped at MaxPause; garbage,
// negative and past values are ignored. now is the time the response
// arrived (for HTTP-dates and epoch resets).
func downstreamSignals(status int, h http.Header, now time.Time) (retryAfter, pause time.Duration) {
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		if d, ok := parseRetryAfter(h.Get("Retry-After"), now); ok {
			retryAfter, pause = d, d
		}
	}
	// Canonical names, so that every answer does not build and
	// canonicalize them again.
	for _, names := range [...][2]string{{"X-Ratelimit-Remaining", "X-Ratelimit-Reset"}, {"Ratelimit-Remaining", "Ratelimit-Reset"}} {
		if rem, ok := parseRemaining(h.Get(names[0])); ok && rem == 0 {
			if d, ok := parseReset(h.Get(names[1]), now); ok {
				pause = max(pause, d)
			}
		}
	}
	if v := h.Values("Ratelimit"); len(v) > 0 {
		if d, ok := parseRateLimit(strings.Join(v, ", ")); ok {
			pause = max(pause, d)
		}
	}
	return retryAfter, pause
}

// parseRetryAfter parses a Retry-After value (RFC 9110 §10.2.3): a
// non-negative integer of seconds, or an HTTP-date (counted from now; a
// date in the past is no wait). ok is false for a missing or garbage value
// or a zero wait; the result is capped at MaxPause.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil { // overflow: as long as it gets
			return MaxPause, true
		}
		return secondsToPause(float64(n))
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return capPause(t.Sub(now))
}

// parseReset parses a rate-limit reset: delta-seconds (fractions allowed),
// or, above 1e9, a Unix timestamp in seconds, or, above 1e12, one in
// milliseconds. ok is false for garbage, negative or past values.
func parseReset(v string, now time.Time) (time.Duration, bool) {
	f, ok := parseNonNegFloat(v)
	if !ok {
		return 0, false
	}
	switch {
	case f >= epochMillis:
		return capPause(time.UnixMilli(int64(f)).Sub(now))
	case f >= epochSeconds:
		sec, frac := math.Modf(f)
		return capPause(time.Unix(int64(sec), int64(frac*1e9)).Sub(now))
	}
	return secondsToPause(f)
}

// parseRemaining parses a remaining-quota count.
func parseRemaining(v string) (float64, bool) { return parseNonNegFloat(v) }

// parseRateLimit parses the IETF RateLimit header
// (draft-ietf-httpapi-ratelimit-headers) in either form and returns the
// longest reset among the policies whose quota is used up:
//
//	RateLimit: "default";r=0;t=10                (structured list, drafts 08+)
//	RateLimit: "burst";r=0;t=5, "day";r=9;t=80   (several policies)
//	RateLimit: limit=100, remaining=0, reset=10  (dictionary, earlier drafts)
//
// ok is false when no policy is exhausted or its reset is missing or bad.
func parseRateLimit(v string) (time.Duration, bool) {
	var (
		best  time.Duration
		found bool
		// The dictionary form spreads one policy over several members.
		dictRemaining, dictReset string
	)
	for _, member := range splitOutsideQuotes(v, ',') {
		member = strings.TrimSpace(member)
		if member == "" {
			continue
		}
		parts := splitOutsideQuotes(member, ';')
		head := strings.TrimSpace(parts[0])
		if key, val, isDict := strings.Cut(head, "="); isDict && !strings.HasPrefix(head, `"`) {
			switch strings.ToLower(strings.TrimSpace(key)) {
			case "remaining":
				dictRemaining = strings.TrimSpace(val)
			case "reset":
				dictReset = strings.TrimSpace(val)
			}
			continue
		}
		var r, t string
		for _, p := range parts[1:] {
			key, val, _ := strings.Cut(strings.TrimSpace(p), "=")
			switch strings.TrimSpace(key) {
			case "r":
				r = strings.TrimSpace(val)
			case "t":
				t = strings.TrimSpace(val)
			}
		}
		if rem, ok := parseRemaining(r); !ok || rem != 0 {
			continue
		}
		if d, ok := parseDeltaSeconds(t); ok && d > best {
			best, found = d, true
		}
	}
	if rem, ok := parseRemaining(dictRemaining); ok && rem == 0 {
		if d, ok := parseDeltaSeconds(dictReset); ok && d > best {
			best, found = d, true
		}
	}
	return best, found
}

// parseDeltaSeconds parses a non-negative number of seconds.
func parseDeltaSeconds(v string) (time.Duration, bool) {
	f, ok := parseNonNegFloat(v)
	if !ok {
		return 0, false
	}
	return secondsToPause(f)
}

// parseNonNegFloat parses a finite, non-negative decimal number (no sign,
// no hex, no exponent surprises beyond what ParseFloat takes).
func parseNonNegFloat(v string) (float64, bool) {
	v = strings.TrimSpace(v)
	if v == "" || !(v[0] >= '0' && v[0] <= '9') {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	return f, true
}

// secondsToPause turns seconds into a capped duration; zero is no pause.
func secondsToPause(s float64) (time.Duration, bool) {
	if s <= 0 {
		return 0, false
	}
	if s >= MaxPause.Seconds() {
		return MaxPause, true
	}
	return capPause(time.Duration(s * float64(time.Second)))
}

// capPause caps d at MaxPause; ok is false for d ≤ 0.
func capPause(d time.Duration) (time.Duration, bool) {
	if d <= 0 {
		return 0, false
	}
	return min(d, MaxPause), true
}

// isDigits reports whether s is one or more ASCII digits.
func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// splitOutsideQuotes splits s at sep, except inside double-quoted strings
// (with backslash escapes), as structured fields (RFC 8941) need.
func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
