package service_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/testenv"
)

// laneOf is lane demo's status as addr answers it.
func laneOf(t *testing.T, addr string) api.LaneStatus {
	t.Helper()
	for _, l := range lanesOf(t, addr) {
		if l.Name == "demo" {
			return l
		}
	}
	t.Fatalf("%s lists no lane demo", addr)
	return api.LaneStatus{}
}

// metricLine returns the line of /metrics at addr that starts with series.
func metricLine(t *testing.T, addr, series string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, series+" ") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// TestLanePauseHoldsEveryInstanceAndOutlivesRestarts: a lane paused on
// instance A is held on instance B too; jobs submitted to B are still
// taken (202) and queued, and none reaches the target: at the moment both
// drains hold jobs in hand (in flight, fetched) the target has seen none.
// Both instances stop; a new one starts held, and resuming it drains the
// backlog.
//
// Outcomes only (the target's count at a known moment, states polled), in
// the parallel phase.
func TestLanePauseHoldsEveryInstanceAndOutlivesRestarts(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 50, 5)
	cfg.NATS.URL = natsSrv.ClientURL()
	cfg.Redis.URL = redis.URL()
	a, stopA := start(t, cfg)
	cfgB := cfg
	cfgB.NATS.DataDir = t.TempDir()
	b, stopB := start(t, cfgB)

	for body, field := range map[string]string{`{"paused":"yes"}`: "paused", `{"paused":true,"rate":"5/s"}`: "paused"} {
		req, _ := http.NewRequest("PATCH", "http://"+a.Addr()+"/v1/lanes/demo", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := pollClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var p api.Problem
		_ = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || p.Field != field {
			t.Errorf("PATCH %s: %d naming %q, want 400 naming %q", body, resp.StatusCode, p.Field, field)
		}
	}
	var st api.LaneStatus
	if code := keyCall(t, "PATCH", a.Addr(), "/v1/lanes/demo", `{"paused":true}`, &st); code != http.StatusOK || !st.Paused || !st.PausedByOperator {
		t.Fatalf("pause on A: %d %+v", code, st)
	}
	waitFor(t, 5*time.Second, "B holds the lane", func() bool { return laneOf(t, b.Addr()).PausedByOperator })
	if s := laneOf(t, b.Addr()); !s.Paused || !strings.Contains(s.PauseReason, "operator") && !strings.Contains(s.PauseReason, "paused by") {
		t.Errorf("B's status of the held lane: paused %v, reason %q", s.Paused, s.PauseReason)
	}
	if got := metricLine(t, b.Addr(), `throttler_lane_paused_by_operator{lane="demo"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("B's gauge: %q, want 1", got)
	}

	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for i := range 10 {
		addr := b.Addr()
		if i%2 == 0 {
			addr = a.Addr()
		}
		if code, acc, _ := submit(t, client, addr, "demo", "held-"+string(rune('a'+i)), "x"); code != http.StatusAccepted || acc.State != "queued" {
			t.Fatalf("job %d while paused: %d %q, want 202 queued", i, code, acc.State)
		}
	}
	// The known moment: the drains have fetched jobs (in flight, held in
	// hand), so they have reached the hold; nothing was delivered.
	waitFor(t, 10*time.Second, "the drains holding fetched jobs", func() bool {
		s := laneOf(t, a.Addr())
		return s.Backlog == 10 && s.InFlight > 0
	})
	if n := len(rec.snapshot()); n != 0 {
		t.Fatalf("%d jobs reached the target while the lane was paused", n)
	}
	if got := metricLine(t, a.Addr(), `throttler_dispatches_total{lane="demo",outcome="done"}`); !strings.HasSuffix(got, " 0") {
		t.Fatalf("A's done counter while paused: %q", got)
	}

	stopA()
	stopB()
	c, _ := start(t, cfg)
	waitFor(t, 5*time.Second, "the restarted instance holds the lane", func() bool { return laneOf(t, c.Addr()).PausedByOperator })
	// A job the stopped drains held and could not hand back is fetched
	// again only after the consumer's ack wait (5 s): the poll allows for
	// that and a loaded machine; it bounds nothing the test checks.
	waitFor(t, 30*time.Second, "the restarted drain holding fetched jobs", func() bool {
		s := laneOf(t, c.Addr())
		return s.Backlog == 10 && s.InFlight > 0
	})
	if n := len(rec.snapshot()); n != 0 {
		t.Fatalf("%d jobs reached the target after the restart, while paused", n)
	}
	if code := keyCall(t, "PATCH", c.Addr(), "/v1/lanes/demo", `{"paused":false}`, &st); code != http.StatusOK || st.PausedByOperator {
		t.Fatalf("resume: %d %+v", code, st)
	}
	waitFor(t, 10*time.Second, "the backlog drained after the resume", func() bool { return len(rec.snapshot()) >= 10 })
	if got := metricLine(t, c.Addr(), `throttler_lane_paused_by_operator{lane="demo"}`); !strings.HasSuffix(got, " 0") {
		t.Errorf("gauge after the resume: %q, want 0", got)
	}
}

// TestKeyedLanePause: a keyed lane held by an operator starts no key's job.
// The known moment: the lane's keys are known to the drain (keys_active)
// and its jobs stored (backlog), so an unheld lane would be starting them;
// the target has seen none and no slot pair was reserved. Resumed, every
// key drains.
//
// Outcomes only, in the parallel phase.
func TestKeyedLanePause(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	tgt := newKeyedTarget(t)
	cfg := keyedConfig(t, tgt.srv.URL, 200, 10, 50, 5)
	cfg.NATS.URL = natsSrv.ClientURL()
	svc, _ := start(t, cfg)
	var st api.LaneStatus
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo", `{"paused":true}`, &st); code != http.StatusOK || !st.PausedByOperator {
		t.Fatalf("pause: %d %+v", code, st)
	}
	reserved := metricLine(t, svc.Addr(), `throttler_pacer_calls_total{lane="demo",op="reserve_pair"}`)
	publishKeyed(t, natsSrv.ClientURL(), "a", 5)
	publishKeyed(t, natsSrv.ClientURL(), "b", 5)
	waitFor(t, 10*time.Second, "the held lane's keys known and jobs stored", func() bool {
		s := laneOf(t, svc.Addr())
		return s.Backlog == 10 && s.Keyed != nil && s.Keyed.KeysActive == 2
	})
	if n := tgt.count("a") + tgt.count("b"); n != 0 {
		t.Fatalf("%d jobs of the held keyed lane reached the target", n)
	}
	if got := metricLine(t, svc.Addr(), `throttler_pacer_calls_total{lane="demo",op="reserve_pair"}`); got != reserved {
		t.Fatalf("slot pairs reserved while held: %q, then %q", reserved, got)
	}
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo", `{"paused":false}`, &st); code != http.StatusOK || st.PausedByOperator {
		t.Fatalf("resume: %d %+v", code, st)
	}
	waitFor(t, 10*time.Second, "both keys drained after the resume", func() bool { return tgt.count("a") == 5 && tgt.count("b") == 5 })
}
