package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// fmtInt writes n with thousands separators: 12,345.
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtRate writes a per-second rate: "12,345/s", or "97.3/s" below 1,000.
func fmtRate(r float64) string {
	if r < 1000 {
		return strconv.FormatFloat(r, 'f', 1, 64) + "/s"
	}
	return fmtInt(int64(r+0.5)) + "/s"
}

// fmtDur writes a duration with three significant digits in µs, ms or s.
func fmtDur(d time.Duration) string {
	switch {
	case d < 999500*time.Nanosecond: // 999.5 µs would print as "1000 µs"
		return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', 0, 64) + " µs"
	case d < 9995*time.Microsecond:
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + " ms"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + " s"
}

// fmtRatio writes a/b as "1.23×", or "—" when b is zero.
func fmtRatio(a, b float64) string {
	if b == 0 {
		return "—"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64) + "×"
}

// fmtLat writes "p50 1.2 ms · p99 3.4 ms".
func fmtLat(l latencies) string {
	return fmt.Sprintf("p50 %s · p99 %s", fmtDur(l.P50), fmtDur(l.P99))
}

// fmtMB writes a size in bytes as MB (10^6).
func fmtMB(b int64) string {
	return strconv.FormatFloat(float64(b)/1e6, 'f', 1, 64) + " MB"
}

func verdict(ok bool) Verdict {
	if ok {
		return Met
	}
	return Missed
}

// skipRow is a row that could not be measured for reason.
func skipRow(id, scenario, goal, reason string) Result {
	return Result{ID: id, Scenario: scenario, Ours: "—", Reference: "—", Ratio: "—", Goal: goal, Verdict: Skipped, Note: reason}
}
