package redisbucket

import (
	"testing"
	"time"
)

func TestStateFormatRoundTrip(t *testing.T) {
	for _, ns := range []int64{0, 1, 999, 1000, -1, -999, -1000, -1001, 1767323045123456789, -1767323045123456789} {
		s := formatNow(time.Unix(0, ns))
		got, ok := parseState(s)
		if !ok || got != ns {
			t.Errorf("parseState(formatNow(%d)) = %q → %d %v", ns, s, got, ok)
		}
	}
	for _, bad := range []string{"", "1", "1.", "1.12", "1.1234", "x.000", "1.-01", "1.+01", "99999999999999999999.000"} {
		if _, ok := parseState(bad); ok {
			t.Errorf("parseState(%q) accepted", bad)
		}
	}
}

func TestFloorsKeepTheLatestAndForgetPassedOnes(t *testing.T) {
	var f floors
	f.raise("a", 2_000, "2.000", time.Minute)
	f.raise("a", 1_000, "1.000", time.Minute) // an older answer arriving late
	if got := f.get("a"); got != "2.000" {
		t.Fatalf("floor %q, want the later tat 2.000", got)
	}
	if got := f.get("b"); got != "" {
		t.Fatalf("floor of an unseen key %q", got)
	}
	// A floor whose tat has passed is not sent, and a sweep drops it.
	f.raise("old", 5_000, "5.000", -time.Hour)
	f.mu.Lock()
	e := f.m["old"]
	e.until = time.Now().Add(-time.Millisecond)
	f.m["old"] = e
	f.mu.Unlock()
	if got := f.get("old"); got != "" {
		t.Fatalf("passed floor sent: %q", got)
	}
	for i := 0; i < sweepEvery; i++ {
		f.raise("a", 2_000, "2.000", time.Minute)
	}
	f.mu.Lock()
	_, kept := f.m["old"]
	n := len(f.m)
	f.mu.Unlock()
	if kept || n != 1 {
		t.Fatalf("after a sweep: old kept %v, %d entries; want only a", kept, n)
	}
}

// TestStateFormatBounds: the state format's range is ±2^62 ns; its ends are
// read, one microsecond past them is not.
func TestStateFormatBounds(t *testing.T) {
	const top = (1 << 62) / 1000 // µs
	for s, want := range map[string]bool{
		"4611686018427387.000":  true,
		"4611686018427388.000":  false,
		"-4611686018427387.000": true,
		"-4611686018427388.000": false,
	} {
		got, ok := parseState(s)
		if ok != want {
			t.Errorf("parseState(%q) ok %v, want %v", s, ok, want)
		}
		if ok && got/1000 != top && got/1000 != -top {
			t.Errorf("parseState(%q) = %d", s, got)
		}
	}
}
