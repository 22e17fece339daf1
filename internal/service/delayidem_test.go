package service_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
)

// idemAnswer is what a submission (or one batch item) was answered.
type idemAnswer struct {
	Status    int
	ID        string
	State     api.JobState
	Duplicate bool
}

// submitIdem posts a job with Idempotency-Key id to lane demo, with a
// Throttle-Delay when delay is not empty: as a single submission, or as
// the one item of a batch.
func submitIdem(t *testing.T, addr, id, key, delay string, batch bool) idemAnswer {
	t.Helper()
	if !batch {
		hdr := map[string]string{}
		if delay != "" {
			hdr["Throttle-Delay"] = delay
		}
		if key != "" {
			hdr["Throttle-Key"] = key
		}
		code, a := submitWith(t, addr, id, hdr)
		return idemAnswer{Status: code, ID: a.ID, State: api.JobState(a.State), Duplicate: a.Duplicate}
	}
	item := map[string]any{"idempotency_key": id, "payload": "x"}
	if delay != "" {
		item["delay"] = delay
	}
	if key != "" {
		item["throttle_key"] = key
	}
	body, _ := json.Marshal([]any{item})
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/demo/jobs:batch", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatalf("submit %s: %v", id, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var ba api.BatchAccepted
	if err := json.Unmarshal(raw, &ba); err != nil || len(ba.Results) != 1 {
		t.Fatalf("batch answer %d %q: %v", resp.StatusCode, raw, err)
	}
	r := ba.Results[0]
	return idemAnswer{Status: r.Status, ID: r.ID, State: r.State, Duplicate: r.Duplicate}
}

// TestIdempotencyKeyOneJobWhateverTheDelay: on a lane without job records
// an Idempotency-Key names one job within nats.dedup_window, with or
// without a delay: a delayed job resubmitted without its delay, or with
// another delay, and a job resubmitted with a delay, are each answered
// 202 duplicate with the first job's id (a delayed resubmission of a job
// queued without one gets that job's answer, not "scheduled"), and every
// id reaches the target once. Single submissions and batch items, on a
// plain lane and on a keyed one.
func TestIdempotencyKeyOneJobWhateverTheDelay(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "keyed"}[keyed], func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t)
			var cfg config.Config
			key := ""
			if keyed {
				cfg = keyedConfig(t, rec.srv.URL+"/hook", 100, 10, 50, 5)
				key = "k1"
			} else {
				cfg = testConfig(t, t.TempDir(), rec.srv.URL+"/hook", 100, 10)
			}
			svc, _ := start(t, cfg)
			addr := svc.Addr()
			var ids []string
			for _, batch := range []bool{false, true} {
				kind := map[bool]string{false: "single", true: "batch"}[batch]
				// Delayed first, then without a delay, then another delay.
				late := "late-" + kind
				if a := submitIdem(t, addr, late, key, "1s", batch); a.Status != http.StatusAccepted || a.State != api.StateScheduled || a.Duplicate {
					t.Fatalf("%s: delayed %s answered %+v, want 202 scheduled", kind, late, a)
				}
				for _, delay := range []string{"", "2s"} {
					if a := submitIdem(t, addr, late, key, delay, batch); a.Status != http.StatusAccepted || !a.Duplicate || a.ID != late || a.State != api.StateScheduled {
						t.Errorf("%s: %s resubmitted with delay %q answered %+v, want 202 duplicate scheduled", kind, late, delay, a)
					}
				}
				// Without a delay first, then delayed.
				now := "now-" + kind
				first := submitIdem(t, addr, now, key, "", batch)
				if first.Status != http.StatusAccepted || first.Duplicate || first.State == api.StateScheduled {
					t.Fatalf("%s: %s answered %+v, want 202 not scheduled", kind, now, first)
				}
				if a := submitIdem(t, addr, now, key, "1s", batch); a.Status != http.StatusAccepted || !a.Duplicate || a.ID != now || a.State != first.State {
					t.Errorf("%s: %s resubmitted with a delay answered %+v, want 202 duplicate %s", kind, now, a, first.State)
				}
				ids = append(ids, late, now)
			}
			for _, id := range ids {
				waitFor(t, 15*time.Second, id+" delivered", func() bool { return len(arrivalsOfID(rec, id)) > 0 })
			}
			waitSettled(t, addr)
			for _, id := range ids {
				if n := len(arrivalsOfID(rec, id)); n != 1 {
					t.Errorf("%s reached the target %d times, want once", id, n)
				}
			}
			if t.Failed() {
				t.Log(fmt.Sprint(rec.snapshot()))
			}
		})
	}
}
