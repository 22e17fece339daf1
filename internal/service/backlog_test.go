package service_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/bucket"
)

// TestMaxBacklogCountsTheJobInFlight replays, step by step, what
// TestOpenAPIAnswersOfARunningServer once saw on a lane of max_backlog 1 at
// 1/h: a job sent right after a 429 was accepted. The 429 counted the
// admitted job while its delivery was still under way (in flight is held);
// once the target answered it, the lane had room for one job again, and that
// job, waiting an hour for its slot in the drain's hands, is held: it shows
// in backlog (as in_flight, not waiting: the drain has read it) and the lane
// refuses the next one. Never more than max_backlog jobs are held.
func TestMaxBacklogCountsTheJobInFlight(t *testing.T) {
	t.Parallel()
	arrived := make(chan string, 4)
	release := make(chan struct{})
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		arrived <- string(b)
		<-release
	}))
	t.Cleanup(target.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	cfg := testConfig(t, t.TempDir(), target.URL, 50, 10)
	slow, err := bucket.ParseRate("1/h")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Lanes[0].Name, cfg.Lanes[0].Rate, cfg.Lanes[0].Burst, cfg.Lanes[0].MaxBacklog = "full", slow, 1, 1
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	svc, _ := start(t, cfg)
	base := "http://" + svc.Addr()
	post := func(body string) (int, string) {
		t.Helper()
		resp, err := pollClient.Post(base+"/v1/lanes/full/jobs", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	type lane struct {
		Backlog  uint64 `json:"backlog"`
		Waiting  uint64 `json:"waiting"`
		InFlight int    `json:"in_flight"`
	}
	status := func() lane {
		t.Helper()
		resp, err := pollClient.Get(base + "/v1/lanes")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Lanes []lane `json:"lanes"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Lanes) != 1 {
			t.Fatalf("lanes: %v %+v", err, body)
		}
		return body.Lanes[0]
	}

	if code, body := post("a"); code != 202 || !strings.Contains(body, `"admitted"`) {
		t.Fatalf("a: %d %s, want 202 admitted", code, body)
	}
	if got := <-arrived; got != "a" {
		t.Fatalf("the target got %q first", got)
	}
	// a is being delivered: it is held, and the lane is full.
	if code, body := post("b"); code != 429 {
		t.Fatalf("b while a is in flight: %d %s, want 429", code, body)
	}
	close(release)
	waitFor(t, 10*time.Second, "a answered and gone from the lane", func() bool { return status().Backlog == 0 })
	if code, body := post("c"); code != 202 || !strings.Contains(body, `"queued"`) {
		t.Fatalf("c after a is done: %d %s, want 202 queued", code, body)
	}
	if code, body := post("d"); code != 429 {
		t.Fatalf("d while c waits for its slot: %d %s, want 429", code, body)
	}
	waitFor(t, 10*time.Second, "c read by the drain", func() bool {
		st := status()
		return st.Backlog == 1 && st.Waiting == 0 && st.InFlight == 1
	})
	if st := status(); st.Backlog != 1 {
		t.Fatalf("lane %+v, want c held", st)
	}
	if code, body := post("e"); code != 429 {
		t.Fatalf("e while c waits for its slot: %d %s, want 429", code, body)
	}
}
