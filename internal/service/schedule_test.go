package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/queue"
)

// arrivalsOfID lists the arrivals of the job id.
func arrivalsOfID(rec *recorder, id string) []arrival {
	var out []arrival
	for _, a := range rec.snapshot() {
		if a.id == id {
			out = append(out, a)
		}
	}
	return out
}

// submitWith posts one job to lane demo with hdr and decodes the answer.
func submitWith(t *testing.T, addr, id string, hdr map[string]string) (int, accepted) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/demo/jobs", bytes.NewBufferString("x"))
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set("Idempotency-Key", id)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatalf("submit %s: %v", id, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var a accepted
	if resp.StatusCode == http.StatusAccepted {
		if err := json.Unmarshal(raw, &a); err != nil {
			t.Fatalf("202 body %q: %v", raw, err)
		}
	}
	return resp.StatusCode, a
}

// TestDelayedJobSurvivesRestartAndStartsWhenDue: a job submitted with
// Throttle-Delay: 2s is answered "scheduled" with the delay as its eta_ms,
// outlives a restart of the only instance before it is due, and reaches
// the target once, no earlier than its delay; a job without a delay
// submitted after it is delivered first, and one whose Throttle-Expires
// comes before its delay ends is dead-lettered ("expired") while it waits;
// while they wait both delayed jobs count in the lane's retrying. On a
// plain lane and on a keyed one (the delayed job keeps its key).
//
// Outcomes with a margin: the delay is checked from below only (a stall
// may only make it later), and the restart takes well under the delay; in
// the parallel phase, with its two lanes side by side.
func TestDelayedJobSurvivesRestartAndStartsWhenDue(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "keyed"}[keyed], func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t)
			var cfg config.Config
			if keyed {
				cfg = keyedConfig(t, rec.srv.URL+"/hook", 50, 5, 10, 2)
			} else {
				cfg = testConfig(t, t.TempDir(), rec.srv.URL+"/hook", 50, 5)
			}
			svc, stop := start(t, cfg)
			hdr := map[string]string{"Throttle-Delay": "3s"}
			now := map[string]string{}
			if keyed {
				hdr["Throttle-Key"], now["Throttle-Key"] = "k1", "k1"
			}
			sent := time.Now()
			code, a := submitWith(t, svc.Addr(), "d-late", hdr)
			if code != http.StatusAccepted || a.State != "scheduled" || a.ETA < 2900 || a.ETA > 3000 {
				t.Fatalf("delayed job: status %d %+v, want 202 scheduled with eta_ms ≈ 3000", code, a)
			}
			if code, a := submitWith(t, svc.Addr(), "d-now", now); code != http.StatusAccepted || a.State == "scheduled" {
				t.Fatalf("job without delay: status %d %+v", code, a)
			}
			// Delayed past its own expiry: it expires while it waits.
			stale := map[string]string{"Throttle-Expires": time.Now().Add(1500 * time.Millisecond).UTC().Format(time.RFC3339Nano)}
			for k, v := range hdr {
				stale[k] = v
			}
			if code, a := submitWith(t, svc.Addr(), "d-stale", stale); code != http.StatusAccepted || a.State != "scheduled" {
				t.Fatalf("job delayed past its expiry: status %d %+v", code, a)
			}
			// Delayed jobs wait in the retry stream: GET /v1/lanes counts
			// them in retrying (docs/API.md), never in backlog.
			if st := laneOf(t, svc.Addr()); st.Retrying != 2 {
				t.Fatalf("with two delayed jobs waiting GET /v1/lanes answers retrying %d, backlog %d; want retrying 2", st.Retrying, st.Backlog)
			}
			waitFor(t, 10*time.Second, "the job without delay delivered", func() bool { return len(arrivalsOfID(rec, "d-now")) == 1 })
			if got := arrivalsOfID(rec, "d-late"); len(got) != 0 {
				t.Fatalf("the delayed job arrived %v after its submission", got[0].at.Sub(sent))
			}
			stop()
			svc2, _ := start(t, cfg)
			waitFor(t, 15*time.Second, "the delayed job delivered after the restart", func() bool { return len(arrivalsOfID(rec, "d-late")) == 1 })
			waitSettled(t, svc2.Addr())
			got := arrivalsOfID(rec, "d-late")
			if wait := got[0].at.Sub(sent); wait < 3*time.Second {
				t.Fatalf("the delayed job arrived %v after its submission, before its delay of 3s", wait)
			}
			if len(got) != 1 {
				t.Fatalf("the delayed job arrived %d times, want once", len(got))
			}
			waitFor(t, 10*time.Second, "the stale job a dead letter", func() bool { return len(deadList(t, svc2.Addr())) > 0 })
			dead := deadList(t, svc2.Addr())
			if len(dead) != 1 || dead[0].ID != "d-stale" || dead[0].Reason != queue.ReasonExpired || len(arrivalsOfID(rec, "d-stale")) != 0 {
				t.Fatalf("dead letters %+v, want d-stale expired while it waited, never delivered", dead)
			}
		})
	}
}

// TestExpiredJobsDeadLetteredNeverDelivered: a lane (or, keyed, a key) at
// 0.5/s (burst 1)
// with max_age 3s takes five jobs at once: the first starts at once and
// the second about 2 s later, within max_age; the others' turns come 4, 6
// and 8 s after they were stored, past it: each is a dead letter with the
// reason "expired" and never reaches the target. So is a job whose own
// Throttle-Expires (1 s ahead) passes while it waits behind them.
//
// Outcomes with a margin of a second each side of max_age (the period is
// 2 s; on the keyed lane 2 s of 4), in the parallel phase. Both lanes are
// started and take their jobs first, then each is checked in a subtest of
// its own: their waits (7 s plain, 20 s keyed) overlap in the test's one
// slot of the parallel phase. Parallel subtests would queue behind every
// other parallel test of the package and end the phase 20 s after that.
func TestExpiredJobsDeadLetteredNeverDelivered(t *testing.T) {
	t.Parallel()
	type lane struct {
		name string
		rec  *recorder
		addr string
	}
	var lanes []lane
	for _, keyed := range []bool{false, true} {
		rec := newRecorder(t)
		var cfg config.Config
		hdr := map[string]string{}
		if keyed {
			// The key's pace binds (0.25/s, max_age 6 s: margins of
			// 2 s, as a keyed start may come later after its slot),
			// under a lane-wide cap that does not.
			cfg = keyedConfig(t, rec.srv.URL+"/hook", 100, 10, 0.25, 1)
			cfg.Lanes[0].MaxAge = config.Duration(6 * time.Second)
			hdr["Throttle-Key"] = "k"
		} else {
			cfg = testConfig(t, t.TempDir(), rec.srv.URL+"/hook", 0.5, 1)
			cfg.Lanes[0].MaxAge = config.Duration(3 * time.Second)
		}
		svc, _ := start(t, cfg)
		for i := range 5 {
			if code, _ := submitWith(t, svc.Addr(), fmt.Sprintf("e-%d", i), hdr); code != http.StatusAccepted {
				t.Fatalf("job %d: status %d", i, code)
			}
		}
		xh := map[string]string{"Throttle-Expires": time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)}
		for k, v := range hdr {
			xh[k] = v
		}
		if code, _ := submitWith(t, svc.Addr(), "x-0", xh); code != http.StatusAccepted {
			t.Fatalf("job x-0: status %d", code)
		}
		lanes = append(lanes, lane{name: map[bool]string{false: "plain", true: "keyed"}[keyed], rec: rec, addr: svc.Addr()})
	}
	for _, l := range lanes {
		t.Run(l.name, func(t *testing.T) {
			want := map[string]bool{"e-2": true, "e-3": true, "e-4": true, "x-0": true}
			waitFor(t, 40*time.Second, "four expired dead letters", func() bool { return len(deadList(t, l.addr)) >= len(want) })
			waitSettled(t, l.addr)
			for _, d := range deadList(t, l.addr) {
				if !want[d.ID] || d.Reason != queue.ReasonExpired {
					t.Errorf("dead letter %s with reason %q, want one of %v with reason %q", d.ID, d.Reason, want, queue.ReasonExpired)
				}
				delete(want, d.ID)
			}
			if len(want) != 0 {
				t.Errorf("not dead-lettered: %v", want)
			}
			var got []string
			for _, a := range l.rec.snapshot() {
				got = append(got, a.id)
			}
			if fmt.Sprint(got) != "[e-0 e-1]" {
				t.Fatalf("the target received %v, want [e-0 e-1]: an expired job was delivered", got)
			}
		})
	}
}

// TestDelayOverNATS: a job published on the lane's public subject with
// Throttle-Delay reaches the target no earlier than the delay after it was
// published; one with a Throttle-Not-Before it cannot read is a dead
// letter naming the header.
func TestDelayOverNATS(t *testing.T) {
	t.Parallel()
	throttlerURL, publisherURL := natsWithUsers(t)
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL+"/hook", 50, 5)
	cfg.NATS.URL = throttlerURL
	svc, _ := start(t, cfg)
	pub := connectPublisher(t, publisherURL)
	publish := func(id string, h map[string]string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m := nats.NewMsg(queue.Subject("demo", ""))
		m.Header.Set(jetstream.MsgIDHeader, id)
		for k, v := range h {
			m.Header.Set(k, v)
		}
		if _, err := pub.js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
	sent := time.Now()
	publish("n-late", map[string]string{"Throttle-Delay": "2s"})
	publish("n-bad", map[string]string{"Throttle-Not-Before": "next week"})
	waitFor(t, 15*time.Second, "the delayed job delivered", func() bool { return len(arrivalsOfID(rec, "n-late")) == 1 })
	if wait := arrivalsOfID(rec, "n-late")[0].at.Sub(sent); wait < 2*time.Second {
		t.Fatalf("arrived %v after its publish, before its delay of 2s", wait)
	}
	waitFor(t, 10*time.Second, "the bad job a dead letter", func() bool { return len(deadList(t, svc.Addr())) == 1 })
	if d := deadList(t, svc.Addr())[0]; d.ID != "n-bad" || d.Reason == "" || !bytes.Contains([]byte(d.Reason), []byte("Throttle-Not-Before")) {
		t.Fatalf("dead letter %s reason %q, want n-bad naming Throttle-Not-Before", d.ID, d.Reason)
	}
	if len(arrivalsOfID(rec, "n-bad")) != 0 {
		t.Fatal("the job with a bad Throttle-Not-Before was delivered")
	}
}
