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
	f.raise("a", 3_000, "3.000", time.Minute)
	if got := f.get("a"); got != "3.000" {
		t.Fatalf("floor %q, want the later tat 3.000", got)
	}
	f.raise("due", 4_000, "4.000", 0) // due now: still sent for floorSlack
	if got := f.get("due"); got != "4.000" {
		t.Fatalf("floor %q of a tat due now, want it kept for %v", got, floorSlack)
	}
	if got := f.get("b"); got != "" {
		t.Fatalf("floor of an unseen key %q", got)
	}
	f.raise("early", -2_000, "-2.000", time.Minute) // any tat, also before 1970
	if got := f.get("early"); got != "-2.000" {
		t.Fatalf("floor %q, want -2.000", got)
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
	kept := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, ok := f.m["old"]
		return ok
	}
	// The sweep comes at every sweepEvery-th raise, not before: 6 so far.
	for range sweepEvery - 7 {
		f.raise("a", 3_000, "3.000", time.Minute)
	}
	if !kept() {
		t.Fatalf("swept before the %dth raise", sweepEvery)
	}
	f.raise("a", 3_000, "3.000", time.Minute)
	if kept() || f.get("a") != "3.000" || f.get("early") != "-2.000" {
		t.Fatalf("after a sweep: old kept %v, a %q, early %q; want old dropped, the floors ahead kept", kept(), f.get("a"), f.get("early"))
	}
	// And again sweepEvery raises later, not before.
	f.raise("old", 5_000, "5.000", -time.Hour)
	f.mu.Lock()
	e = f.m["old"]
	e.until = time.Now().Add(-time.Millisecond)
	f.m["old"] = e
	f.mu.Unlock()
	for range sweepEvery - 2 {
		f.raise("a", 3_000, "3.000", time.Minute)
	}
	if !kept() {
		t.Fatal("swept before the next sweepEvery raises")
	}
	f.raise("a", 3_000, "3.000", time.Minute)
	if kept() {
		t.Fatalf("not swept %d raises after the last sweep", sweepEvery)
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
