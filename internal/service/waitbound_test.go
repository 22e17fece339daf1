package service_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// newWaitsService makes the wait tests' service, not yet run: a
// nats-server and a Redis of its own, and one lane, demo, whose results
// are kept for waits of up to 30s and whose jobs go to the held target it
// returns. head is put before the lanes (auth or http settings), lane
// among demo's settings; each is whole lines of YAML.
func newWaitsService(t *testing.T, head, lane string) (*service.Service, *heldTarget) {
	t.Helper()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	held := newHeldTarget(t)
	y := configHead(t, natsSrv.ClientURL(), redis.URL()) + fmt.Sprintf(`%slanes:
  - name: demo
    rate: 50
    burst: 5
%s    results: {keep: 1h, max_wait: 30s}
    target: {http: {url: %q}}
`, head, lane, held.srv.URL)
	cfg, err := config.Parse("waits.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	return service.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)), prometheus.NewRegistry()), held
}

// TestWaitsAreBounded: requests that wait for a job's answer (POST ?wait=
// and GET ?wait=) hold a slot of the instance's bound while they wait, and
// one caller holds at most its share of them, so that one API key cannot
// hold the instance's waits (and their reads of the records) alone. A
// refused wait stores nothing; a wait that ends gives its slot back.
func TestWaitsAreBounded(t *testing.T) {
	t.Parallel()
	auth := fmt.Sprintf(`auth:
  keys:
    - {id: a, sha256: %s, scopes: [submit]}
    - {id: b, sha256: %s, scopes: [admin]}
`, hexSum("secret-a"), hexSum("secret-b"))
	svc, held := newWaitsService(t, auth, "")
	service.SetMaxWaiters(svc, 8) // a caller's share: 2
	servicetest.Run(t, svc)
	base := "http://" + svc.Addr() + "/v1/lanes/demo/jobs"

	call := func(method, url, secret, idem string) (int, api.Problem, api.JobRecord) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader("x"))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Content-Type", "text/plain")
		if idem != "" {
			req.Header.Set("Idempotency-Key", idem)
		}
		resp, err := (&http.Client{Timeout: 40 * time.Second}).Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", method, url, err)
			return 0, api.Problem{}, api.JobRecord{}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var p api.Problem
		var rec api.JobRecord
		if resp.StatusCode >= 400 {
			_ = json.Unmarshal(b, &p)
		} else {
			_ = json.Unmarshal(b, &rec)
		}
		return resp.StatusCode, p, rec
	}

	// A job that stays in flight until released.
	if code, _, _ := call("POST", base, "secret-a", "hold-1"); code != http.StatusAccepted {
		t.Fatalf("submit: %d", code)
	}
	testenv.Eventually(t, 10*time.Second, "the job in flight", func() bool { return held.holding.Load() == 1 })

	// a waits on it twice (its share), until it settles.
	var wg sync.WaitGroup
	answered := make([]bool, 2)
	defer wg.Wait()
	defer held.let()
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A wait refused while a probe below held a slot tries again.
			for end := time.Now().Add(40 * time.Second); time.Now().Before(end); {
				code, _, rec := call("GET", base+"/hold-1?wait=30s", "secret-a", "")
				if code == http.StatusOK && rec.State == api.StateDelivered {
					answered[i] = true
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	// A third wait of a's is refused: 429 naming wait.
	testenv.Eventually(t, 20*time.Second, "a's third wait refused", func() bool {
		code, p, _ := call("GET", base+"/hold-1?wait=0.2s", "secret-a", "")
		return code == http.StatusTooManyRequests && p.Field == "wait"
	})
	// So is a waited submission of a's, and nothing of it is stored.
	if code, p, _ := call("POST", base+"?wait=5s", "secret-a", "refused-1"); code != http.StatusTooManyRequests || p.Field != "wait" {
		t.Errorf("a's waited submission: %d %+v, want 429 naming wait", code, p)
	}
	if code, _, _ := call("GET", base+"/refused-1", "secret-a", ""); code != http.StatusNotFound {
		t.Errorf("the refused submission's record: %d, want 404", code)
	}
	// b has its own share (an admin key: a job is its submitter's, and
	// only an admin key sees another key's job).
	if code, _, rec := call("GET", base+"/hold-1?wait=0.2s", "secret-b", ""); code != http.StatusOK || rec.State != api.StateInFlight {
		t.Errorf("b's wait: %d %s, want 200 in_flight", code, rec.State)
	}

	held.let()
	wg.Wait()
	if !answered[0] || !answered[1] {
		t.Fatalf("a's waits answered: %v, want both", answered)
	}
	// The waits gave their slots back.
	if code, _, rec := call("GET", base+"/hold-1?wait=1s", "secret-a", ""); code != http.StatusOK || rec.State != api.StateDelivered {
		t.Errorf("a's wait after the others ended: %d %s", code, rec.State)
	}
}

// TestWaitedSubmissionGivesItsBodyBack: a waited submission (POST ?wait=)
// holds its body's bytes of http.max_body_inflight only while it reads and
// stores it, not for the whole wait: else a caller's waits held its share
// of the bodies being read (its next submissions refused 429), and four
// callers waiting on a slow target held the whole budget (every other
// submission refused 503) for up to results.max_wait.
func TestWaitedSubmissionGivesItsBodyBack(t *testing.T) {
	t.Parallel()
	svc, held := newWaitsService(t,
		"http: {max_body_inflight: 8KiB, max_body_inflight_per_caller: 4KiB, max_batch_bytes: 4KiB}\n",
		"    max_body: 4KiB\n")
	servicetest.Run(t, svc)
	base := "http://" + svc.Addr() + "/v1/lanes/demo/jobs"
	body := strings.Repeat("x", 4<<10)
	post := func(url, idem string) (int, api.Problem) {
		t.Helper()
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "text/plain")
		req.Header.Set("Idempotency-Key", idem)
		resp, err := (&http.Client{Timeout: 40 * time.Second}).Do(req)
		if err != nil {
			t.Errorf("POST %s: %v", url, err)
			return 0, api.Problem{}
		}
		defer resp.Body.Close()
		var p api.Problem
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &p)
		return resp.StatusCode, p
	}

	// A waited job that stays in flight until released.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer held.let()
	wg.Go(func() {
		if code, _ := post(base+"?wait=30s", "hold-1"); code != http.StatusOK {
			t.Errorf("the waited submission: %d, want 200 once its job settled", code)
		}
	})
	testenv.Eventually(t, 10*time.Second, "the waited job in flight", func() bool { return held.holding.Load() == 1 })
	// While it waits, the same caller submits a body as large.
	if code, p := post(base, "next-1"); code != http.StatusAccepted {
		t.Errorf("a submission while the caller's waited one waits: %d %+v, want 202", code, p)
	}
	held.let()
}
