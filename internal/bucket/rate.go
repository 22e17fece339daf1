package bucket

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Rate is a number of jobs per window, read and written the way quotas are:
// "20/s", "120/min", "1000/h", "2/d", "900/15min", or a bare number of jobs
// per second ("0.5", "20"). It keeps the count and the window as written, so
// that "1000/h" stays 1000 per hour instead of becoming 0.2777…/s; PerSecond
// gives the rate the bucket math uses.
//
// The count has at most 6 decimal places and 12 integer digits; the window
// is a whole number of seconds, minutes, hours or days, at most 366 days.
// The zero value is a rate of zero, which no Limit accepts. Rates are
// comparable: equal when their canonical forms (String) are equal, so 1/s
// and 60/min are different values with the same PerSecond.
type Rate struct {
	micro int64         // jobs per window, in millionths
	per   time.Duration // the window; 0 only in the zero value
}

// blanks may surround the count, the "/" and the unit.
const blanks = " \t"

// Bounds of the written form.
const (
	maxRateText   = 64
	maxCountInt   = 12 // integer digits of the count
	maxCountFrac  = 6  // decimal places of the count
	maxRateWindow = 366 * 24 * time.Hour
	microPerJob   = 1_000_000
)

// ErrInvalidRate matches every error of ParseRate (and of the YAML, text
// and JSON forms of Rate).
var ErrInvalidRate = errors.New("bucket: invalid rate")

// RateError is the error of ParseRate. It matches ErrInvalidRate.
type RateError struct {
	// Text is the refused input, cut to 64 bytes.
	Text string
	// Msg says what is wrong with it.
	Msg string
}

// rateForm says what ParseRate accepts; every RateError ends with it.
const rateForm = "write a rate like 20/s, 120/min, 1000/h, 2/d, 900/15min, or a bare number of jobs per second like 0.5"

// Error implements error: "\"20/w\" is not a rate: unknown unit \"w\"; write …".
func (e *RateError) Error() string {
	return fmt.Sprintf("%q is not a rate: %s; %s", e.Text, e.Msg, rateForm)
}

// Is reports whether target is ErrInvalidRate.
func (e *RateError) Is(target error) bool { return target == ErrInvalidRate }

// rateUnits maps a window's unit to its length. The canonical names come
// first in canonicalUnits.
var rateUnits = map[string]time.Duration{
	"s": time.Second, "sec": time.Second, "secs": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "mins": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
}

// canonicalUnits are the units String writes, longest first.
var canonicalUnits = []struct {
	name string
	d    time.Duration
}{{"d", 24 * time.Hour}, {"h", time.Hour}, {"min", time.Minute}, {"s", time.Second}}

// ParseRate reads a rate: a count, optionally followed by "/" and a window,
// with spaces (or tabs) allowed around the "/":
//
//	20  0.5  1e3        a bare number: jobs per second
//	20/s  120/min  5/m  1000/h  2/d       per one unit (m is a minute)
//	900/15min  100 / 10 s                 per a whole number of units
//
// Units: s, sec, second; m, min, minute; h, hour; d, day (plurals too). The
// count is a non-negative decimal number (no sign, an exponent allowed),
// with at most 6 decimal places. ParseRate checks the form only: a zero
// rate parses, and Limit.Validate decides whether a rate is usable. Errors
// are *RateError values that say the expected form.
func ParseRate(s string) (Rate, error) {
	bad := func(format string, args ...any) (Rate, error) {
		return Rate{}, &RateError{Text: s[:min(len(s), maxRateText)], Msg: fmt.Sprintf(format, args...)}
	}
	if len(s) > maxRateText {
		return bad("longer than %d bytes", maxRateText)
	}
	count, window, hasWindow := strings.Cut(s, "/")
	count = strings.Trim(count, blanks)
	micro, msg := parseCount(count)
	if msg != "" {
		return bad("%s", msg)
	}
	per := time.Second
	if hasWindow {
		window = strings.Trim(window, blanks)
		digits := len(window) - len(strings.TrimLeft(window, "0123456789"))
		n := int64(1)
		if digits > 0 {
			var err error
			if n, err = strconv.ParseInt(window[:digits], 10, 64); err != nil || n < 1 || digits > 6 {
				return bad("the window %q must be a whole number of units from 1 to 999999", window[:digits])
			}
		}
		unit := strings.Trim(window[digits:], blanks)
		d, ok := rateUnits[unit]
		// An if chain rather than a switch: a mutation run sees if
		// conditions, not case expressions (docs/MUTATION.md).
		if unit == "" {
			return bad("no unit after the /")
		}
		if !ok {
			return bad("unknown unit %q (s, min, h or d)", unit)
		}
		if time.Duration(n) > maxRateWindow/d {
			return bad("the window is longer than 366 days")
		}
		per = time.Duration(n) * d
	}
	return Rate{micro: micro, per: per}, nil
}

// parseCount reads a count in millionths, or says what is wrong.
func parseCount(s string) (int64, string) {
	if s == "" {
		return 0, "no count"
	}
	if s[0] == '-' {
		return 0, "the count is negative"
	}
	if strings.Trim(s, "0123456789.eE+-") != "" {
		return 0, "the count is not a plain decimal number"
	}
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i != -1 {
		e := strings.TrimLeft(s[i+1:], "+-")
		if len(s[i+1:])-len(e) > 1 || e == "" || len(e) > 3 || !allDigits(e) {
			return 0, "the count's exponent is not a small whole number"
		}
		mant, exp = s[:i], atoi(s[i+1:])
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	if !allDigits(intPart) || !allDigits(frac) || intPart+frac == "" {
		return 0, "the count is not a plain decimal number"
	}
	// The count in millionths is digits·10^shift, with digits free of
	// leading zeros (they add nothing) and of trailing ones (each moves
	// into the shift).
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return 0, ""
	}
	shift := exp - len(frac) + maxCountFrac
	trimmed := strings.TrimRight(digits, "0")
	digits, shift = trimmed, shift+len(digits)-len(trimmed)
	if len(digits)+shift-maxCountFrac > maxCountInt {
		return 0, fmt.Sprintf("the count has more than %d digits before the point", maxCountInt)
	}
	if shift < 0 {
		return 0, fmt.Sprintf("the count has more than %d decimal places", maxCountFrac)
	}
	n, _ := strconv.ParseInt(digits+strings.Repeat("0", shift), 10, 64) // at most 18 digits
	return n, ""
}

// allDigits reports whether s holds only ASCII digits ("" does).
func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// atoi reads a signed exponent that allDigits has checked.
func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// IsZero reports whether r is zero (no jobs at all, or the zero value).
func (r Rate) IsZero() bool { return r.micro == 0 }

// PerSecond is the rate in jobs per second, as a Limit's Rate takes it.
func (r Rate) PerSecond() float64 {
	if r.per == 0 {
		return 0
	}
	return float64(r.micro) / (microPerJob * r.per.Seconds())
}

// String writes the canonical form: the count in plain decimal, "/" and the
// window in the longest unit that divides it ("20/s", "120/min", "949/h",
// "900/15min", "0.5/s"). ParseRate(r.String()) == r for every r that
// ParseRate or Quota.Rate returned; the zero value writes "0/s".
func (r Rate) String() string {
	count := strconv.FormatInt(r.micro/microPerJob, 10)
	if f := r.micro % microPerJob; f != 0 {
		count += "." + strings.TrimRight(fmt.Sprintf("%06d", f), "0")
	}
	per := r.per
	if per == 0 {
		per = time.Second
	}
	for _, u := range canonicalUnits {
		if per%u.d == 0 {
			if n := per / u.d; n != 1 {
				return count + "/" + strconv.FormatInt(int64(n), 10) + u.name
			}
			return count + "/" + u.name
		}
	}
	return count + "/s" // unreachable: windows are whole seconds
}

// Quota is the rate as a whole count per window, for rate-limit headers: the
// written count and window when the count is whole (1000/h gives 1000 per
// hour); otherwise the smallest whole-second window that holds a whole
// count, when there is one within a day (0.5 gives 1 per 2s, 2.5 gives 5 per
// 2s); otherwise the written, fractional count and window.
func (r Rate) Quota() (count float64, window time.Duration) {
	if r.micro%microPerJob == 0 {
		return float64(r.micro / microPerJob), r.per
	}
	// jobs per second = micro / (1e6 · seconds): in lowest terms p/q, q is
	// the smallest whole-second window with a whole count p.
	num, den := uint64(r.micro), uint64(microPerJob)*uint64(r.per/time.Second)
	g := gcd(num, den)
	if q := den / g; q <= 24*60*60 {
		return float64(num / g), time.Duration(q) * time.Second
	}
	return float64(r.micro) / microPerJob, r.per
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseRate (YAML
// scalars, numbers included, reach it through their text).
func (r *Rate) UnmarshalText(text []byte) error {
	v, err := ParseRate(string(text))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// UnmarshalJSON accepts a string ("50/s") or a number (50, jobs per second),
// both read by ParseRate; null leaves r as it is.
func (r *Rate) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		return r.UnmarshalText([]byte(s))
	}
	return r.UnmarshalText(b)
}

// Quota is a provider's documented limit: at most Limit requests in any
// window of length Per, bursts allowed up to Burst.
type Quota struct {
	Limit int64
	Per   time.Duration
	Burst int
}

// Rate derives the rate that, with burst q.Burst, never starts more than
// q.Limit jobs in any window of length q.Per at the target. maxLate is how
// late after its slot the drain may start a job when the period is shorter
// (leaky.DefaultMaxLate); the drain's bound is max(maxLate, period).
//
// Over a window W the GCRA slots number at most burst + rate·W, and a start
// may come up to D = max(maxLate, period) after its slot, so starts number
// at most burst + rate·(W + D). With rate = (limit − burst − k)/W that is
// limit − k + (limit − burst − k)·D/W, within limit when
// k ≥ (limit − burst − k)·D/W: k = 1 when the period is at least maxLate
// (D is one period, worth one start), and k = ⌈(limit − burst)·maxLate/W⌉
// above that rate. So rate = (limit − burst − 1)/per for every quota whose
// derived period is at least maxLate (below 500 jobs/s with 2 ms). A quota
// that leaves no room (limit − burst − k ≤ 0) is refused. Errors are
// *LimitError values naming the quota's field (limit, per or burst).
func (q Quota) Rate(maxLate time.Duration) (Rate, error) {
	bad := func(field, format string, args ...any) (Rate, error) {
		return Rate{}, &LimitError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	// An if chain rather than a switch, as in ParseRate.
	if q.Limit < 1 || q.Limit > 999_999_999_999 {
		return bad("limit", "must be from 1 to 999999999999, got %d", q.Limit)
	}
	if q.Per < time.Second || q.Per%time.Second != 0 || q.Per > maxRateWindow {
		return bad("per", "must be a whole number of seconds from 1s to 366 days, got %v", q.Per)
	}
	if q.Burst < 1 || int64(q.Burst) > q.Limit {
		return bad("burst", "must be from 1 to the limit %d, got %d", q.Limit, q.Burst)
	}
	if maxLate < 0 {
		return bad("per", "cannot be kept with a negative lateness bound %v", maxLate)
	}
	room := uint64(q.Limit - int64(q.Burst))
	k := uint64(1)
	if hi, lo := bits.Mul64(room, uint64(maxLate)); hi < uint64(q.Per) {
		n, rem := bits.Div64(hi, lo, uint64(q.Per))
		if rem != 0 {
			n++
		}
		k = max(k, n)
	} else {
		k = room // no room at all
	}
	if room <= k {
		return bad("limit", "%d with burst %d leaves no room for a steady rate: the rate is (limit - burst - %d) per %v, which must be greater than 0", q.Limit, q.Burst, k, q.Per)
	}
	return Rate{micro: int64(room-k) * microPerJob, per: q.Per}, nil
}
