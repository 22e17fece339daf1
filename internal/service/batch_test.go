package service_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
)

// TestBatchIntake: a batch on the real queue and admission: the lane's
// burst is admitted, the next jobs are queued, the jobs over max_backlog are
// refused one by one while the others stay stored, a repeated id is stored
// once, and every stored job is delivered.
//
// Outcomes only: at 0.5/s a token refills in 2 s, far longer than the
// batch takes to store even on a loaded machine, so the states do not
// depend on the machine's speed.
func TestBatchIntake(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 0.5, 2)
	cfg.Lanes[0].MaxBacklog = 4
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	var items []string
	for _, id := range []string{"j0", "j1", "j2", "j1", "j3", "j4", "j5"} {
		items = append(items, `{"idempotency_key":"`+id+`","payload":{"id":"`+id+`"}}`)
	}
	resp, err := client.Post("http://"+svc.Addr()+"/v1/lanes/demo/jobs:batch", "application/json", strings.NewReader("["+strings.Join(items, ",")+"]"))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMultiStatus {
		t.Fatalf("status %d, want 207: %s", resp.StatusCode, raw)
	}
	var a api.BatchAccepted
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatal(err)
	}
	if a.Accepted != 5 || a.Failed != 2 || len(a.Results) != 7 {
		t.Fatalf("answer %s", raw)
	}
	r := a.Results
	admitted := 0
	for i, want := range []string{"j0", "j1", "j2", "j1", "j3"} {
		if r[i].Status != 202 || r[i].ID != want {
			t.Errorf("item %d: %+v, want %s stored", i, r[i], want)
		}
		if r[i].State == api.StateAdmitted && i != 3 {
			admitted++
		}
	}
	// The burst of 2 is all the room there is; on a loaded machine a free
	// slot may come too late to count as "at once".
	if admitted > 2 || r[2].State != api.StateQueued || r[4].State != api.StateQueued || r[4].ETAMillis <= 0 {
		t.Errorf("states %+v: at most the burst (2) admitted, then queued with an ETA", r[:5])
	}
	if !r[3].Duplicate || r[3].State != r[1].State {
		t.Errorf("repeated j1: %+v, want a duplicate of %+v", r[3], r[1])
	}
	for i := 5; i < 7; i++ {
		if r[i].Status != 429 || r[i].Problem == nil || r[i].Problem.Field != "max_backlog" {
			t.Errorf("item %d over max_backlog 4: %+v", i, r[i])
		}
	}
	waitFor(t, 15*time.Second, "4 deliveries", func() bool { return len(rec.snapshot()) >= 4 })
	waitSettled(t, svc.Addr())
	got := rec.snapshot()
	if len(got) != 4 {
		t.Fatalf("%d deliveries, want 4", len(got))
	}
	// The burst's two jobs start together and may reach the target in
	// either order; the queued ones come after them, in order.
	if got[0].id > got[1].id {
		got[0], got[1] = got[1], got[0]
	}
	for i, want := range []string{"j0", "j1", "j2", "j3"} {
		if got[i].id != want || got[i].body != `{"id":"`+want+`"}` || got[i].ct != "application/json" {
			t.Errorf("delivery %d: %+v, want %s", i, got[i], want)
		}
	}
}

// TestKeyedBatch: on a keyed lane a batch item without a throttle_key
// refuses the whole batch with a problem naming the item's field, and
// nothing is stored; with keys, every item is stored under its key, each
// key's jobs reach the target in order with their Throttle-Key, and a key's
// burst is decided on its own bucket, not its neighbour's.
//
// Outcomes only: at 2/s per key a key's next slot is 500 ms after its
// first, far longer than the batch takes to be decided on a loaded
// machine, so the states do not depend on the machine's speed.
func TestKeyedBatch(t *testing.T) {
	t.Parallel()
	kt := newKeyedTarget(t)
	cfg := keyedConfig(t, kt.srv.URL, 100, 10, 2, 1)
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	post := func(body string) (int, []byte) {
		t.Helper()
		resp, err := client.Post("http://"+svc.Addr()+"/v1/lanes/demo/jobs:batch", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, raw
	}

	code, raw := post(`[{"idempotency_key":"n0","payload":1,"throttle_key":"a"},{"idempotency_key":"n1","payload":2}]`)
	var p api.Problem
	if err := json.Unmarshal(raw, &p); err != nil || code != http.StatusBadRequest || p.Field != "/1/throttle_key" {
		t.Fatalf("item without a key: %d %s, want 400 naming /1/throttle_key", code, raw)
	}

	var items []string
	for i, key := range []string{"a", "b", "a", "b", "a"} {
		items = append(items, fmt.Sprintf(`{"idempotency_key":"k%d","payload":%d,"throttle_key":%q}`, i, i, key))
	}
	code, raw = post("[" + strings.Join(items, ",") + "]")
	answered := time.Now()
	var a api.BatchAccepted
	if err := json.Unmarshal(raw, &a); err != nil || code != http.StatusAccepted || a.Accepted != 5 {
		t.Fatalf("keyed batch: %d %s", code, raw)
	}
	// Each key's burst is 1: the first job of a and of b may start at once;
	// the later ones of each key wait for their key's own slot.
	for _, i := range []int{2, 3, 4} {
		if a.Results[i].State != api.StateQueued {
			t.Errorf("item %d: %+v, want queued behind its key's first job", i, a.Results[i])
		}
	}
	waitFor(t, 15*time.Second, "5 deliveries", func() bool { return kt.count("a")+kt.count("b") >= 5 })
	for key, want := range map[string][]string{"a": {"k0", "k2", "k4"}, "b": {"k1", "k3"}} {
		got := kt.of(key)
		if len(got) != len(want) {
			t.Fatalf("key %s: %d deliveries, want %d", key, len(got), len(want))
		}
		for i := range want {
			if got[i].id != want[i] {
				t.Errorf("key %s delivery %d: %s, want %s", key, i, got[i].id, want[i])
			}
		}
	}
	// The keys had nothing waiting: their runtime must hear of the batch's
	// jobs at once, not at its next sweep of stored keys (every 5 s from
	// the lane's start), which is how they were found before batch intake
	// told it. The batch is posted within moments of the start, so the
	// sweep is about 5 s away; each key's first job is due at once, and 1 s
	// is far beyond a loaded machine's stall.
	for _, key := range []string{"a", "b"} {
		if late := kt.of(key)[0].at.Sub(answered); late > time.Second {
			t.Errorf("key %s: first delivery %v after the answer, want at once (its slot was free)", key, late.Round(time.Millisecond))
		}
	}
	if n := kt.count("") + kt.count("n0"); n != 0 {
		t.Errorf("%d deliveries without a key or from the refused batch", n)
	}
}
