package service_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/testenv"
)

// TestKeyedLaneAdaptivePerKey: with per_key.adaptive, the target answers
// every request of key "bad" 500 for its first 4 s: that key slows down to
// its floor (0.2 of 10/s) and climbs back to 10/s once the target is well,
// while keys "a" and "b" keep their 10/s all along.
//
// Rates that load can only lower are checked from above by counts and from
// below by the median gap between arrivals (checkPaced): a stall of the
// loaded machine stretches a few gaps, a key paced slower moves them all.
func TestKeyedLaneAdaptivePerKey(t *testing.T) {
	natsSrv := testenv.StartNATS(t)
	var (
		mu    sync.Mutex
		first time.Time
		reqs  = map[string][]time.Time{}
	)
	tgt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		key := r.Header.Get("Throttle-Key")
		mu.Lock()
		reqs[key] = append(reqs[key], now)
		if key == "bad" && first.IsZero() {
			first = now
		}
		failing := key == "bad" && now.Sub(first) < 4*time.Second
		mu.Unlock()
		if failing {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(tgt.Close)
	cfg := keyedConfig(t, tgt.URL, 100, 10, 10, 1)
	cfg.NATS.URL = natsSrv.ClientURL()
	cfg.Lanes[0].Retry.MaxAttempts = 1 // a 500 dead-letters: no retries in the counts
	cfg.Lanes[0].PerKey.Adaptive = config.Adaptive{Enabled: true, Decrease: 0.5, Increase: 0.4, Min: 0.2, Interval: config.Duration(time.Second)}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	svc, _ := start(t, cfg)
	for _, k := range []string{"bad", "a", "b"} {
		publishKeyed(t, natsSrv.ClientURL(), k, 150)
	}
	waitFor(t, 30*time.Second, "the bad key's first request", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !first.IsZero()
	})
	mu.Lock()
	t0 := first
	mu.Unlock()
	// While it fails: its rate on this instance is lowered, and shows.
	// Decreases at about 0 s, 1 s and 2 s (10 → 5 → 2.5 → the floor of
	// 2); the climb back starts a second after the target is well at 4 s,
	// so until 5 s the key shows at most 2.5 (then 6, then 10).
	var st api.KeyStatus
	testenv.EventuallyNil(t, max(time.Until(t0.Add(5*time.Second)), 0), "key bad's effective_rate lowered while its target fails", func() error {
		if code := keyCall(t, "GET", svc.Addr(), "/v1/lanes/demo/keys/bad", "", &st); code != http.StatusOK {
			return fmt.Errorf("GET key: %d", code)
		}
		if st.Rate != 10 || st.EffectiveRate > 2.5 || st.EffectiveRate < 1.9 {
			return fmt.Errorf("key bad: rate %v, effective_rate %v, want 10 and about 2", st.Rate, st.EffectiveRate)
		}
		return nil
	})
	if code := keyCall(t, "GET", svc.Addr(), "/v1/lanes/demo/keys/a", "", &st); code != http.StatusOK || st.EffectiveRate != 10 {
		t.Errorf("key a: effective_rate %v (%d), want 10", st.EffectiveRate, code)
	}
	waitFor(t, 30*time.Second, "10 s after the bad key's first request", func() bool { return time.Since(t0) > 10*time.Second })
	mu.Lock()
	defer mu.Unlock()
	in := func(key string, from, to time.Duration) float64 {
		n := 0
		for _, at := range reqs[key] {
			if d := at.Sub(t0); d >= from && d < to {
				n++
			}
		}
		return float64(n) / (to - from).Seconds()
	}
	// Decreases at 0 s, 1 s and 2 s: 5/s, 2.5/s, then the floor of 2/s.
	if r := in("bad", 2200*time.Millisecond, 4*time.Second); r > 3.4 {
		t.Errorf("key bad at %.2f/s while its target failed, want about 2/s", r)
	}
	// Well again from 4 s: +4/s a second from about 5 s, full rate by 6 s;
	// measured over 3 s from a second later.
	if r := in("bad", 7*time.Second, 10*time.Second); r > 11 {
		t.Errorf("key bad at %.2f/s after recovering, want about 10/s", r)
	}
	if g := medianGap(between(reqs["bad"], t0, 7*time.Second, 10*time.Second)); g < 90*time.Millisecond || g > 111*time.Millisecond {
		t.Errorf("key bad: median gap %v after recovering, want about 100ms (10/s)", g)
	}
	for _, k := range []string{"a", "b"} {
		if r := in(k, 0, 10*time.Second); r > 10.5 {
			t.Errorf("key %s at %.2f/s, over its own 10/s", k, r)
		}
		// All along, and while bad's target failed (where a lane-wide
		// slow-down would show).
		checkPaced(t, k, between(reqs[k], t0, 0, 10*time.Second), 100*time.Millisecond)
		checkPaced(t, k+" (while bad failed)", between(reqs[k], t0, 0, 5*time.Second), 100*time.Millisecond)
	}
}

// between keeps the times from t0+from to t0+to, as arrivals.
func between(ats []time.Time, t0 time.Time, from, to time.Duration) []arrival {
	var out []arrival
	for _, at := range ats {
		if d := at.Sub(t0); d >= from && d < to {
			out = append(out, arrival{at: at})
		}
	}
	return out
}
