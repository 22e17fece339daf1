package service_test

import (
	"encoding/json"
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
func TestBatchIntake(t *testing.T) {
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
	time.Sleep(100 * time.Millisecond)
	got := rec.snapshot()
	if len(got) != 4 {
		t.Fatalf("%d deliveries, want 4", len(got))
	}
	for i, want := range []string{"j0", "j1", "j2", "j3"} {
		if got[i].id != want || got[i].body != `{"id":"`+want+`"}` || got[i].ct != "application/json" {
			t.Errorf("delivery %d: %+v, want %s", i, got[i], want)
		}
	}
}
