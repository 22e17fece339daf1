package service_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/testenv"
)

// TestKeyedQueuedETAIsHonest: on a keyed lane (keys at 5/s under a lane
// cap of 100/s) two keys get 20 jobs each, submitted one after the other,
// one key's 10 of them in one batch: every queued answer's eta_ms counts
// the jobs of its key ahead of it and is within ±20 % (or ±100 ms) of the
// real wait, as on unkeyed lanes (TestQueuedETAIsHonest), on each pacer.
// As there, a delivery delayed on its own by a stall of the loaded machine
// may miss the tolerance: at most 3 % of the answers may (one of about
// 38), and none by more than a second; a wrong estimate misses it for a
// run of jobs and still fails. The two pacers run side by side, as in
// TestQueuedETAIsHonest, still in the real-clock phase.
func TestKeyedQueuedETAIsHonest(t *testing.T) {
	for _, pacer := range []string{"memory", "redis"} {
		t.Run(pacer, func(t *testing.T) {
			t.Parallel()
			natsSrv := testenv.StartNATS(t)
			tgt := newKeyedTarget(t)
			cfg := keyedConfig(t, tgt.srv.URL, 100, 10, 5, 1)
			cfg.NATS.URL = natsSrv.ClientURL()
			if pacer == "redis" {
				cfg.Redis.URL = testenv.StartRedis(t).URL()
			}
			svc, _ := start(t, cfg)
			client := &http.Client{Timeout: 5 * time.Second}
			defer client.CloseIdleConnections()
			type answer struct {
				at  time.Time
				eta time.Duration
				st  api.JobState
			}
			answers := map[string]answer{}
			post := func(key, id string) {
				req, _ := http.NewRequest("POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs", bytes.NewBufferString("x"))
				req.Header.Set("Idempotency-Key", id)
				req.Header.Set("Throttle-Key", key)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var a api.Accepted
				if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != http.StatusAccepted {
					t.Fatalf("submit %s: %d %v", id, resp.StatusCode, err)
				}
				answers[id] = answer{at: time.Now(), eta: time.Duration(a.ETAMillis) * time.Millisecond, st: a.State}
			}
			for i := range 10 {
				post("a", fmt.Sprintf("a-%05d", i))
				post("b", fmt.Sprintf("b-%05d", i))
			}
			// Ten more of a in one batch.
			var items []map[string]string
			for i := 10; i < 20; i++ {
				items = append(items, map[string]string{"idempotency_key": fmt.Sprintf("a-%05d", i), "payload": "x", "throttle_key": "a"})
			}
			body, _ := json.Marshal(items)
			req, _ := http.NewRequest("POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs:batch", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var ba api.BatchAccepted
			err = json.NewDecoder(resp.Body).Decode(&ba)
			resp.Body.Close()
			batch := ba.Results
			if err != nil || len(batch) != 10 || ba.Accepted != 10 {
				t.Fatalf("batch: %d answers (%d accepted), %v", len(batch), ba.Accepted, err)
			}
			now := time.Now()
			for i, b := range batch {
				answers[fmt.Sprintf("a-%05d", 10+i)] = answer{at: now, eta: time.Duration(b.ETAMillis) * time.Millisecond, st: b.State}
			}
			for i := 10; i < 20; i++ {
				post("b", fmt.Sprintf("b-%05d", i))
			}
			waitFor(t, 30*time.Second, "every job delivered", func() bool { return tgt.count("a") >= 20 && tgt.count("b") >= 20 })
			queued, missed := 0, 0
			for _, key := range []string{"a", "b"} {
				for _, arr := range tgt.of(key) {
					ans := answers[arr.id]
					if ans.st != api.StateQueued {
						continue
					}
					queued++
					real := arr.at.Sub(ans.at)
					tol := max(real/5, 100*time.Millisecond)
					if diff := ans.eta - real; diff > tol || diff < -tol {
						missed++
						t.Logf("job %s: eta %v, real wait %v (tolerance ±%v)", arr.id, ans.eta, real.Round(time.Millisecond), tol)
						if diff.Abs() > time.Second {
							t.Errorf("job %s: eta %v, real wait %v: off by more than a second", arr.id, ans.eta, real.Round(time.Millisecond))
						}
					}
				}
			}
			if queued < 30 {
				t.Fatalf("%d queued answers, want about 38", queued)
			}
			if missed*100 > 3*queued {
				t.Errorf("%d of %d queued answers outside the tolerance, want at most 3 %%", missed, queued)
			}
		})
	}
}
