package service_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/testenv"
)

// keyCall sends method path with body to addr and decodes a JSON answer into out.
func keyCall(t *testing.T, method, addr, path, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+addr+path, bytes.NewBufferString(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode
}

// TestKeyOverridesStoredAndApplied: a key's override (PATCH
// /v1/lanes/{lane}/keys/{key}) sets its own rate at once, pausing a key
// holds it alone, and overrides and a lane's PATCHed limit outlive a
// restart (stored in the limits bucket).
func TestKeyOverridesStoredAndApplied(t *testing.T) {
	natsSrv := testenv.StartNATS(t)
	tgt := newKeyedTarget(t)
	cfg := keyedConfig(t, tgt.srv.URL, 200, 10, 10, 1)
	cfg.NATS.URL = natsSrv.ClientURL()
	svc, stop := start(t, cfg)

	var st api.KeyStatus
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo/keys/fast", `{"rate":"50/s"}`, &st); code != http.StatusOK {
		t.Fatalf("PATCH key: %d", code)
	}
	if st.Rate != 50 || !st.Overridden || st.Burst != 1 {
		t.Fatalf("PATCH answered %+v", st)
	}
	for body, field := range map[string]string{`{"rate":"fast"}`: "rate", `{"burst":0}`: "burst", `{"weight":-1}`: "weight", `{}`: "body", `{"colour":1}`: "body"} {
		if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo/keys/fast", body, nil); code != http.StatusBadRequest {
			t.Errorf("PATCH %s: %d, want 400 naming %s", body, code, field)
		}
	}
	if code := keyCall(t, "GET", svc.Addr(), "/v1/lanes/demo/keys/a%20b", "", nil); code != http.StatusBadRequest {
		t.Errorf("GET of an invalid key: %d, want 400", code)
	}
	publishKeyed(t, natsSrv.ClientURL(), "fast", 60)
	publishKeyed(t, natsSrv.ClientURL(), "slow", 40)
	waitFor(t, 15*time.Second, "fast's jobs", func() bool { return tgt.count("fast") >= 60 })
	// The override's 50/s, not per_key's 10/s: never over it, and far
	// over 10/s (a slot woken too late for on a loaded machine is given
	// up, so the rate can fall a little under 50/s).
	if r := spacingRate(tgt.of("fast")); r > 50*1.03 || r < 30 {
		t.Errorf("overridden key ran at %.2f/s, want 50 (never over, far over per_key's 10)", r)
	}
	buckettest.CheckWindows(t, startsOf(tgt.of("fast")), bucket.Limit{Rate: 50, Burst: 1}, 20*time.Millisecond)
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo/keys/slow", `{"paused":true}`, &st); code != http.StatusOK || !st.Paused {
		t.Fatalf("pause: %d %+v", code, st)
	}
	held := tgt.count("slow")
	// The absence of starts, at a known moment: meanwhile a third key's 5
	// jobs (0.4 s at per_key's 10/s) went through the same drain, where an
	// unpaused slow would have started about 4.
	publishKeyed(t, natsSrv.ClientURL(), "witness", 5)
	waitFor(t, 10*time.Second, "the witness key's jobs", func() bool { return tgt.count("witness") >= 5 })
	if n := tgt.count("slow"); n > held+1 {
		t.Errorf("paused key started %d jobs", n-held)
	}
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo/keys/slow", `{"paused":false}`, nil); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	waitFor(t, 10*time.Second, "slow resumes", func() bool { return tgt.count("slow") > held+2 })
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo", `{"rate":"300/s"}`, nil); code != http.StatusOK {
		t.Fatalf("PATCH lane: %d", code)
	}

	stop()
	svc, _ = start(t, cfg)
	waitFor(t, 5*time.Second, "the stored override", func() bool {
		return keyCall(t, "GET", svc.Addr(), "/v1/lanes/demo/keys/fast", "", &st) == http.StatusOK && st.Rate == 50 && st.Overridden
	})
	var lanes api.Lanes
	waitFor(t, 5*time.Second, "the stored lane limit", func() bool {
		return keyCall(t, "GET", svc.Addr(), "/v1/lanes", "", &lanes) == http.StatusOK && len(lanes.Lanes) == 1 && lanes.Lanes[0].Rate == 300
	})
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo/keys/fast", `{"reset":true}`, &st); code != http.StatusOK || st.Overridden && st.Rate != 10 {
		t.Fatalf("reset: %d %+v", code, st)
	}
}
