package service_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// startRecords runs one instance of recordsConfig on a nats-server and a
// Redis of its own, delivering to recordsTarget: the instance and the
// target's count of calls.
func startRecords(t *testing.T) (*service.Service, *atomic.Int64) {
	t.Helper()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, calls := recordsTarget(t)
	svc, _ := servicetest.Start(t, recordsConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL), nil)
	return svc, calls
}

// recordsTarget answers by the job's body: "fail-<n>" fails (500) its
// first n attempts, "big" answers 100 bytes, "slow" answers after 1.5 s,
// anything else 201 with a JSON echo and an X-Upstream-Id header.
func recordsTarget(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var calls atomic.Int64
	var mu sync.Mutex
	tries := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		body := string(b)
		mu.Lock()
		tries[r.Header.Get("Idempotency-Key")]++
		n := tries[r.Header.Get("Idempotency-Key")]
		mu.Unlock()
		var fails int
		if _, err := fmt.Sscanf(body, "fail-%d", &fails); err == nil && n <= fails {
			http.Error(w, "not yet", http.StatusInternalServerError)
			return
		}
		if body == "slow" {
			time.Sleep(1500 * time.Millisecond)
		}
		if body == "big" {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, strings.Repeat("x", 100))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream-Id", "up-"+body)
		w.Header().Set("X-Secret", "not kept")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"echo":%q}`, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func recordsConfig(t *testing.T, natsURL, redisURL, target string) config.Config {
	t.Helper()
	y := configHead(t, natsURL, redisURL) + fmt.Sprintf(`lanes:
  - name: demo
    rate: 50
    burst: 5
    max_inflight: 8
    retry: {max_attempts: 4, backoff_base: 20ms, backoff_max: 50ms}
    results: {keep: 1h, max_body: 32, max_wait: 20s, headers: [X-Upstream-Id]}
    target: {http: {url: %q}}
  - name: plain
    rate: 50
    burst: 5
    target: {http: {url: %q}}
`, target, target)
	cfg, err := config.Parse("records.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

type jobCall struct {
	code   int
	header http.Header
	body   []byte
}

func callJob(t *testing.T, method, url, idem, body string) jobCall {
	t.Helper()
	if idem == "" {
		return asKey(t, "", method, url, body)
	}
	return asKey(t, "", method, url, body, "Idempotency-Key", idem)
}

// asKey sends one text/plain request with the API key secret (none when
// empty) and optional headers (name, value pairs).
func asKey(t *testing.T, secret, method, url, body string, headers ...string) jobCall {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewBufferString(body))
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	req.Header.Set("Content-Type", "text/plain")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return jobCall{resp.StatusCode, resp.Header, b}
}

func getRecord(t *testing.T, addr, lane, id string) (int, api.JobRecord) {
	t.Helper()
	c := callJob(t, "GET", "http://"+addr+"/v1/lanes/"+lane+"/jobs/"+id, "", "")
	var rec api.JobRecord
	if c.code == http.StatusOK {
		if err := json.Unmarshal(c.body, &rec); err != nil {
			t.Fatalf("record %q: %v", c.body, err)
		}
	}
	return c.code, rec
}

// TestJobRecordsAcrossTwoInstances: two instances share a lane with
// results. Waited submissions on one are answered with the target's answer
// while the other delivered part of them; GET answers on either; retries
// are recorded as attempts; a body over max_body is cut and marked; an
// Idempotency-Key finds the first job after the dedup window would have
// let it through; bad input is refused naming its field.
func TestJobRecordsAcrossTwoInstances(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, calls := recordsTarget(t)
	cfg := recordsConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL)
	regA, regB := prometheus.NewRegistry(), prometheus.NewRegistry()
	a := runWithRegistry(t, cfg, regA)
	cfg.NATS.DataDir = t.TempDir()
	b := runWithRegistry(t, cfg, regB)

	// Waited submissions, all on a: every one is answered 200 with the
	// target's answer, whichever instance delivered it.
	const n = 30
	var wg sync.WaitGroup
	answers := make([]jobCall, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = callJob(t, "POST", "http://"+a.Addr()+"/v1/lanes/demo/jobs?wait=15s", fmt.Sprintf("w-%02d", i), fmt.Sprintf("p%02d", i))
		}()
	}
	wg.Wait()
	for i, c := range answers {
		want := fmt.Sprintf(`{"echo":"p%02d"}`, i)
		if c.code != http.StatusOK || string(c.body) != want || c.header.Get("Throttle-Target-Status") != "201" ||
			c.header.Get("Throttle-Job-Id") != fmt.Sprintf("w-%02d", i) || c.header.Get("Content-Type") != "application/json" ||
			c.header.Get("X-Upstream-Id") != fmt.Sprintf("up-p%02d", i) || c.header.Get("X-Secret") != "" {
			t.Fatalf("waited job %d: %d %v %q; want 200 %s with Throttle-Target-Status 201 and the kept X-Upstream-Id (not X-Secret)", i, c.code, c.header, c.body, want)
		}
	}
	delivered := func(reg *prometheus.Registry) float64 {
		v, _ := servicetest.Gather(t, reg).Sum("throttler_dispatches_total")
		return v
	}
	if da, db := delivered(regA), delivered(regB); db == 0 || da+db < n {
		t.Fatalf("a delivered %v, b %v: b must have delivered some of the jobs waited for on a", da, db)
	}

	// GET on either instance.
	for _, addr := range []string{a.Addr(), b.Addr()} {
		code, rec := getRecord(t, addr, "demo", "w-07")
		if code != http.StatusOK || rec.State != api.StateDelivered || rec.Response == nil || rec.Response.Status != 201 ||
			rec.Response.Body != `{"echo":"p07"}` || rec.Response.Headers["X-Upstream-Id"] != "up-p07" ||
			rec.Response.Headers["X-Secret"] != "" || len(rec.Attempts) != 1 || rec.StoredAt == nil || rec.FinishedAt == nil {
			t.Fatalf("GET on %s: %d %+v", addr, code, rec)
		}
	}

	// Retries are recorded as attempts.
	if c := callJob(t, "POST", "http://"+b.Addr()+"/v1/lanes/demo/jobs?wait=15s", "retried", "fail-2"); c.code != http.StatusOK {
		t.Fatalf("retried job: %d %q", c.code, c.body)
	}
	_, rec := getRecord(t, a.Addr(), "demo", "retried")
	if rec.State != api.StateDelivered || len(rec.Attempts) != 3 || rec.Attempts[0].Status != 500 || rec.Attempts[2].Status != 201 {
		t.Fatalf("retried record: %+v", rec)
	}

	// A body over max_body is cut and marked.
	c := callJob(t, "POST", "http://"+a.Addr()+"/v1/lanes/demo/jobs?wait=15s", "big", "big")
	if c.code != http.StatusOK || len(c.body) != 32 || c.header.Get("Throttle-Body-Truncated") != "true" {
		t.Fatalf("big answer: %d %v %d bytes", c.code, c.header, len(c.body))
	}
	if _, rec := getRecord(t, b.Addr(), "demo", "big"); !rec.Response.Truncated || len(rec.Response.Body) != 32 {
		t.Fatalf("big record: %+v", rec.Response)
	}

	// The same Idempotency-Key again, on the other instance: the first
	// job answers, nothing is delivered again.
	before := calls.Load()
	c = callJob(t, "POST", "http://"+b.Addr()+"/v1/lanes/demo/jobs", "w-03", "again")
	var acc api.Accepted
	_ = json.Unmarshal(c.body, &acc)
	if c.code != http.StatusAccepted || acc.ID != "w-03" || acc.State != api.StateDelivered || !acc.Duplicate ||
		c.header.Get("Location") != "/v1/lanes/demo/jobs/w-03" {
		t.Fatalf("resubmission: %d %q %v", c.code, c.body, c.header)
	}
	if c := callJob(t, "POST", "http://"+b.Addr()+"/v1/lanes/demo/jobs?wait=1s", "w-04", "again"); c.code != http.StatusOK || string(c.body) != `{"echo":"p04"}` {
		t.Fatalf("waited resubmission: %d %q", c.code, c.body)
	}
	if got := calls.Load(); got != before {
		t.Fatalf("resubmissions reached the target %d times", got-before)
	}

	// A batch's items get their records at intake too: found at once,
	// and their keys last as long as the records.
	batch := func(addr string) api.BatchAccepted {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/demo/jobs:batch",
			strings.NewReader(`[{"idempotency_key":"b-1","payload":"p1"},{"idempotency_key":"b-2","payload":"p2"}]`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := pollClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out api.BatchAccepted
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Accepted != 2 {
			t.Fatalf("batch: %d %+v %v", resp.StatusCode, out, err)
		}
		return out
	}
	if first := batch(a.Addr()); first.Results[0].Duplicate || first.Results[1].Duplicate {
		t.Fatalf("first batch: %+v", first)
	}
	if code, rec := getRecord(t, b.Addr(), "demo", "b-2"); code != http.StatusOK || rec.StoredAt == nil {
		t.Fatalf("a batch item's record: %d %+v", code, rec)
	}
	testenv.Eventually(t, 15*time.Second, "the batch delivered", func() bool {
		_, r1 := getRecord(t, a.Addr(), "demo", "b-1")
		_, r2 := getRecord(t, a.Addr(), "demo", "b-2")
		return r1.State == api.StateDelivered && r2.State == api.StateDelivered
	})
	again := batch(b.Addr())
	for _, r := range again.Results {
		if !r.Duplicate || r.State != api.StateDelivered {
			t.Fatalf("the batch again: %+v; want duplicates of delivered jobs", again)
		}
	}

	// The lane's recent records, by state, on the other instance.
	lc := callJob(t, "GET", "http://"+b.Addr()+"/v1/lanes/demo/jobs?state=delivered&limit=5", "", "")
	var list api.JobList
	if err := json.Unmarshal(lc.body, &list); err != nil || lc.code != http.StatusOK || len(list.Jobs) != 5 {
		t.Fatalf("list: %d %q", lc.code, lc.body)
	}
	for _, j := range list.Jobs {
		if j.State != api.StateDelivered || j.Lane != "demo" {
			t.Fatalf("listed %+v", j)
		}
	}

	// Refusals name their field.
	for _, s := range []struct {
		method, path string
		code         int
		field        string
	}{
		{"POST", "/v1/lanes/demo/jobs?wait=21s", 400, "wait"},
		{"POST", "/v1/lanes/demo/jobs?wait=soon", 400, "wait"},
		{"POST", "/v1/lanes/plain/jobs?wait=1s", 400, "wait"},
		{"GET", "/v1/lanes/demo/jobs/never-stored", 404, "id"},
		{"GET", "/v1/lanes/plain/jobs/x", 404, "id"},
		{"GET", "/v1/lanes/nope/jobs/x", 404, "lane"},
		{"GET", "/v1/lanes/demo/jobs?state=done", 400, "state"},
		{"GET", "/v1/lanes/demo/jobs?limit=0", 400, "limit"},
		{"DELETE", "/v1/lanes/demo/jobs/w-01", 409, "id"},
		{"DELETE", "/v1/lanes/demo/jobs/never-stored", 404, "id"},
	} {
		c := callJob(t, s.method, "http://"+a.Addr()+s.path, "", "x")
		var p api.Problem
		_ = json.Unmarshal(c.body, &p)
		if c.code != s.code || p.Field != s.field || c.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s: %d field %q (%s), want %d naming %s", s.method, s.path, c.code, p.Field, c.header.Get("Content-Type"), s.code, s.field)
		}
	}
}

// TestCancelBeforeStartAndRestartKeepsRecord: a job of a paused lane is
// queued; its record outlives a restart of the instance; cancelled, it is
// never delivered once the lane runs again, while its neighbour is.
func TestCancelBeforeStartAndRestartKeepsRecord(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, calls := recordsTarget(t)
	cfg := recordsConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL)
	svc, stop := servicetest.Start(t, cfg, nil)
	if code := keyCall(t, "PATCH", svc.Addr(), "/v1/lanes/demo", `{"paused":true}`, nil); code != http.StatusOK {
		t.Fatalf("pause: %d", code)
	}
	for _, id := range []string{"keep", "drop"} {
		if c := callJob(t, "POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs", id, id); c.code != http.StatusAccepted {
			t.Fatalf("submit %s: %d %q", id, c.code, c.body)
		}
	}
	// A job without an Idempotency-Key has no record until it starts: it
	// is found in the lane's stream by the id intake made.
	c := callJob(t, "POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs", "", "anon")
	var acc api.Accepted
	if err := json.Unmarshal(c.body, &acc); err != nil || c.code != http.StatusAccepted || c.header.Get("Location") != "/v1/lanes/demo/jobs/"+acc.ID {
		t.Fatalf("submit without a key: %d %q %v", c.code, c.body, c.header)
	}
	anon := acc.ID
	// A request waiting for its job's answer when the instance stops is
	// answered at once with the usual 202, not held until its wait ends.
	waited := make(chan jobCall, 1)
	go func() {
		waited <- callJob(t, "POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs?wait=20s", "held", "held")
	}()
	testenv.Eventually(t, 10*time.Second, "the held job's record", func() bool {
		code, _ := getRecord(t, svc.Addr(), "demo", "held")
		return code == http.StatusOK
	})
	stopped := time.Now()
	stop()
	if w := <-waited; w.code != http.StatusAccepted || w.header.Get("Location") != "/v1/lanes/demo/jobs/held" || time.Since(stopped) > 10*time.Second {
		t.Fatalf("a waiting request at stop: %d %v after %v", w.code, w.header, time.Since(stopped))
	}
	svc2 := service.New(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	servicetest.Run(t, svc2)
	for _, id := range []string{"keep", "drop", anon} {
		if code, rec := getRecord(t, svc2.Addr(), "demo", id); code != http.StatusOK || rec.State != api.StateQueued || rec.StoredAt == nil {
			t.Fatalf("after restart, %s: %d %+v", id, code, rec)
		}
	}
	for _, id := range []string{"drop", anon} {
		c := callJob(t, "DELETE", "http://"+svc2.Addr()+"/v1/lanes/demo/jobs/"+id, "", "")
		var rec api.JobRecord
		_ = json.Unmarshal(c.body, &rec)
		if c.code != http.StatusOK || rec.State != api.StateCancelled {
			t.Fatalf("cancel %s: %d %q", id, c.code, c.body)
		}
	}
	if code := keyCall(t, "PATCH", svc2.Addr(), "/v1/lanes/demo", `{"paused":false}`, nil); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	// A witness stored after the cancelled job: once it is delivered, the
	// drain has met the cancelled job before it (FIFO) and dropped it.
	if c := callJob(t, "POST", "http://"+svc2.Addr()+"/v1/lanes/demo/jobs?wait=15s", "witness", "witness"); c.code != http.StatusOK {
		t.Fatalf("witness: %d %q", c.code, c.body)
	}
	testenv.Eventually(t, 15*time.Second, "the held job delivered", func() bool {
		_, rec := getRecord(t, svc2.Addr(), "demo", "held")
		return rec.State == api.StateDelivered
	})
	if got := calls.Load(); got != 3 {
		t.Fatalf("target called %d times, want 3 (keep, held and the witness; the cancelled jobs never)", got)
	}
	for _, id := range []string{"drop", anon} {
		if _, rec := getRecord(t, svc2.Addr(), "demo", id); rec.State != api.StateCancelled || len(rec.Attempts) != 0 {
			t.Fatalf("cancelled record of %s: %+v", id, rec)
		}
	}
	// Once delivered, a job without a key has its record too.
	c = callJob(t, "POST", "http://"+svc2.Addr()+"/v1/lanes/demo/jobs", "", "anon2")
	_ = json.Unmarshal(c.body, &acc)
	testenv.Eventually(t, 15*time.Second, "the keyless job delivered", func() bool {
		_, rec := getRecord(t, svc2.Addr(), "demo", acc.ID)
		return rec.State == api.StateDelivered && rec.Response != nil && rec.Response.Body == `{"echo":"anon2"}`
	})
	if c := callJob(t, "DELETE", "http://"+svc2.Addr()+"/v1/lanes/demo/jobs/keep", "", ""); c.code != http.StatusConflict {
		t.Fatalf("cancel of a delivered job: %d, want 409", c.code)
	}
}

// TestCancelRacesStartEndToEnd: jobs are cancelled as they are submitted
// to a lane that starts them at once, with and without an
// Idempotency-Key: every job is either cancelled (200) and never reaches
// the target, or refused (409) and delivered once; never both.
func TestCancelRacesStartEndToEnd(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	var mu sync.Mutex
	got := map[string]int{}
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
	}))
	t.Cleanup(target.Close)
	cfg := recordsConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL)
	rate, err := bucket.ParseRate("200/s")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Lanes[0].Rate, cfg.Lanes[0].Burst = rate, 50
	svc := runWithRegistry(t, cfg, prometheus.NewRegistry())
	base := "http://" + svc.Addr() + "/v1/lanes/demo/jobs"

	const n = 160
	cancelled := make([]bool, n)
	ids := make([]string, n)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				idem := ""
				if i%2 == 0 {
					idem = fmt.Sprintf("race-%03d", i)
				}
				c := callJob(t, "POST", base, idem, "x")
				var acc api.Accepted
				if err := json.Unmarshal(c.body, &acc); err != nil || c.code != http.StatusAccepted {
					t.Errorf("submit %d: %d %q", i, c.code, c.body)
					return
				}
				ids[i] = acc.ID
				d := callJob(t, "DELETE", base+"/"+acc.ID, "", "")
				switch d.code {
				case http.StatusOK:
					cancelled[i] = true
				case http.StatusConflict:
				default:
					t.Errorf("cancel %s: %d %q", acc.ID, d.code, d.body)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	nCancelled := 0
	for i, id := range ids {
		if cancelled[i] {
			nCancelled++
			continue
		}
		testenv.Eventually(t, 20*time.Second, id+" delivered", func() bool {
			_, rec := getRecord(t, svc.Addr(), "demo", id)
			return rec.State == api.StateDelivered
		})
	}
	// A witness after them all: once it is delivered, the drain has met
	// every cancelled job before it.
	if c := callJob(t, "POST", base+"?wait=15s", "witness", "x"); c.code != http.StatusOK {
		t.Fatalf("witness: %d", c.code)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, id := range ids {
		switch {
		case cancelled[i] && got[id] != 0:
			t.Errorf("%s was cancelled and delivered %d times", id, got[id])
		case !cancelled[i] && got[id] != 1:
			t.Errorf("%s was refused a cancel and delivered %d times, want once", id, got[id])
		}
		if _, rec := getRecord(t, svc.Addr(), "demo", id); cancelled[i] != (rec.State == api.StateCancelled) {
			t.Errorf("%s: cancel answered %v, record %s", id, cancelled[i], rec.State)
		}
	}
	t.Logf("%d jobs: %d cancelled before their start, %d started first", n, nCancelled, n-nCancelled)
	if nCancelled == 0 || nCancelled == n {
		t.Logf("no race in this run: every cancel came %s its start", map[bool]string{true: "before", false: "after"}[nCancelled == n])
	}
}

// TestBatchRecordsCreatedTogether: a batch's records are created together
// (at most 64 at once), and each item still gets its own answer in its
// place: the items whose keys were submitted before answer duplicates of
// those jobs, every other item a new job with its record, and a held lane
// delivers nothing meanwhile.
func TestBatchRecordsCreatedTogether(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, calls := recordsTarget(t)
	cfg := recordsConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL)
	cfg.Lanes[0].MaxBacklog = 10_000
	svc := runWithRegistry(t, cfg, prometheus.NewRegistry())
	base := "http://" + svc.Addr() + "/v1/lanes/demo"
	if c := callJob(t, "PATCH", base, "", `{"paused":true}`); c.code != http.StatusOK {
		t.Fatalf("hold: %d %q", c.code, c.body)
	}
	const n = 300
	for i := 0; i < n; i += 7 {
		if c := callJob(t, "POST", base+"/jobs", fmt.Sprintf("bk-%03d", i), "before"); c.code != http.StatusAccepted {
			t.Fatalf("single %d: %d %q", i, c.code, c.body)
		}
	}
	var b strings.Builder
	b.WriteString("[")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"idempotency_key":"bk-%03d","payload":"p%d"}`, i, i)
	}
	b.WriteString("]")
	req, _ := http.NewRequest("POST", base+"/jobs:batch", strings.NewReader(b.String()))
	req.Header.Set("Content-Type", "application/json")
	resp, err := pollClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out api.BatchAccepted
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusAccepted || len(out.Results) != n {
		t.Fatalf("batch: %d, %d results, %v", resp.StatusCode, len(out.Results), err)
	}
	for i, r := range out.Results {
		id := fmt.Sprintf("bk-%03d", i)
		if r.ID != id || r.Duplicate != (i%7 == 0) {
			t.Fatalf("item %d: %+v; want id %s, duplicate %v", i, r, id, i%7 == 0)
		}
	}
	for _, i := range []int{0, 1, 6, 7, 150, n - 1} {
		id := fmt.Sprintf("bk-%03d", i)
		if code, rec := getRecord(t, svc.Addr(), "demo", id); code != http.StatusOK || rec.ID != id || rec.State != api.StateQueued {
			t.Fatalf("record of %s: %d %+v; want queued", id, code, rec)
		}
	}
	if got := calls.Load(); got != 0 {
		t.Fatalf("a held lane delivered %d jobs", got)
	}
}
