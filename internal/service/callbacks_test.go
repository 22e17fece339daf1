package service_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// callbackSecret signs the callback lane's requests (24 random-looking
// bytes, Standard Webhooks form).
const callbackSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// callbackCall is one request the callback receiver got.
type callbackCall struct {
	at     time.Time
	path   string
	header http.Header
	body   []byte
}

// callbackReceiver records every request; a path under /hooks/fail
// answers 500.
type callbackReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls []callbackCall
}

func newCallbackReceiver(t *testing.T) *callbackReceiver {
	c := &callbackReceiver{}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.calls = append(c.calls, callbackCall{time.Now(), r.URL.Path, r.Header.Clone(), b})
		c.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/hooks/fail") {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// to are the calls made to path.
func (c *callbackReceiver) to(path string) []callbackCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []callbackCall
	for _, k := range c.calls {
		if k.path == path {
			out = append(out, k)
		}
	}
	return out
}

// verify checks a call's Standard Webhooks signature with callbackSecret.
func verifySigned(t *testing.T, k callbackCall) {
	t.Helper()
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(callbackSecret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", k.header.Get("Webhook-Id"), k.header.Get("Webhook-Timestamp"), k.body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range strings.Fields(k.header.Get("Webhook-Signature")) {
		if s == want {
			return
		}
	}
	t.Fatalf("callback to %s: signature %q, want %q", k.path, k.header.Get("Webhook-Signature"), want)
}

func callbacksConfig(t *testing.T, natsURL, redisURL, target, receiver string) config.Config {
	t.Helper()
	y := configHead(t, natsURL, redisURL) + fmt.Sprintf(`lanes:
  - name: demo
    rate: 50
    burst: 5
    retry: {max_attempts: 2, backoff_base: 20ms, backoff_max: 50ms}
    results: {keep: 1h, max_wait: 20s, callback_urls: [%q], callback_lane: callbacks}
    target: {http: {url: %q}}
  - name: callbacks
    rate: 4
    burst: 1
    retry: {max_attempts: 3, backoff_base: 20ms, backoff_max: 50ms}
    target: {http: {url: %q, job_urls: [%q], signing_secrets: [%q]}}
`, receiver+"/hooks", target, receiver+"/hooks", receiver+"/hooks", callbackSecret)
	cfg, err := config.Parse("callbacks.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// submitWithCallback submits body to lane with an Idempotency-Key and a
// Throttle-Callback.
func submitWithCallback(t *testing.T, addr, lane, idem, callback, body string) jobCall {
	t.Helper()
	return asKey(t, "", "POST", "http://"+addr+"/v1/lanes/"+lane+"/jobs", body, "Idempotency-Key", idem, "Throttle-Callback", callback)
}

func TestCallbacksEndToEnd(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, _ := recordsTarget(t)
	recv := newCallbackReceiver(t)
	cfg := callbacksConfig(t, natsSrv.ClientURL(), redis.URL(), target.URL, recv.srv.URL)
	svc, _ := servicetest.Start(t, cfg, nil)
	addr := svc.Addr()

	t.Run("refused callback URLs store nothing", func(t *testing.T) {
		for i, u := range []string{
			recv.srv.URL + "/other",                                       // outside the prefix
			recv.srv.URL + "/hooksmith",                                   // not on a segment boundary
			recv.srv.URL + "/hooks/../admin",                              // a dot segment
			recv.srv.URL + "/hooks/%2e%2e/x",                              // an encoded dot
			"http://169.254.169.254/hooks",                                // another host
			"ftp://127.0.0.1/hooks",                                       // another scheme
			"http://user@" + recv.srv.Listener.Addr().String() + "/hooks", // user info
		} {
			id := fmt.Sprintf("refused-%d", i)
			c := submitWithCallback(t, addr, "demo", id, u, "x")
			var p struct {
				Type   string `json:"type"`
				Field  string `json:"field"`
				Detail string `json:"detail"`
			}
			_ = json.Unmarshal(c.body, &p)
			if c.code != http.StatusBadRequest || c.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(c.body), "Throttle-Callback") {
				t.Fatalf("%s: %d %s %q; want a 400 problem naming Throttle-Callback", u, c.code, c.header.Get("Content-Type"), c.body)
			}
			if code, _ := getRecord(t, addr, "demo", id); code != http.StatusNotFound {
				t.Fatalf("%s: a refused job has a record (%d)", u, code)
			}
		}
		// The callback lane takes no submission at all
		// (TestCallbackLaneTakesNoOutsideJobs).
		if c := submitWithCallback(t, addr, "callbacks", "no-cb", recv.srv.URL+"/hooks/x", "x"); c.code != http.StatusForbidden || !strings.Contains(string(c.body), `"field":"lane"`) {
			t.Fatalf("callback on the callback lane: %d %q", c.code, c.body)
		}
	})

	t.Run("the settled record is POSTed once, signed and paced", func(t *testing.T) {
		const n = 4
		for i := range n {
			if c := submitWithCallback(t, addr, "demo", fmt.Sprintf("cb-%d", i), fmt.Sprintf("%s/hooks/ok/%d", recv.srv.URL, i), fmt.Sprintf("p%d", i)); c.code != http.StatusAccepted {
				t.Fatalf("submit %d: %d %q", i, c.code, c.body)
			}
		}
		testenv.Eventually(t, 20*time.Second, "every callback", func() bool {
			for i := range n {
				if len(recv.to(fmt.Sprintf("/hooks/ok/%d", i))) == 0 {
					return false
				}
			}
			return true
		})
		var first, last time.Time
		for i := range n {
			got := recv.to(fmt.Sprintf("/hooks/ok/%d", i))
			if len(got) != 1 {
				t.Fatalf("callback %d came %d times", i, len(got))
			}
			k := got[0]
			verifySigned(t, k)
			if want := fmt.Sprintf("demo.cb-%d.callback", i); k.header.Get("Idempotency-Key") != want {
				t.Fatalf("callback %d: Idempotency-Key %q, want %q", i, k.header.Get("Idempotency-Key"), want)
			}
			var rec api.JobRecord
			if err := json.Unmarshal(k.body, &rec); err != nil || k.header.Get("Content-Type") != "application/json" {
				t.Fatalf("callback %d: %v %q", i, err, k.body)
			}
			if rec.ID != fmt.Sprintf("cb-%d", i) || rec.Lane != "demo" || rec.State != api.StateDelivered || rec.Response == nil ||
				rec.Response.Status != http.StatusCreated || rec.Response.Body != fmt.Sprintf(`{"echo":"p%d"}`, i) || len(rec.Attempts) != 1 {
				t.Fatalf("callback %d: record %+v", i, rec)
			}
			if first.IsZero() || k.at.Before(first) {
				first = k.at
			}
			if k.at.After(last) {
				last = k.at
			}
		}
		// The callback lane (4/s, burst 1) paces them: n callbacks span at
		// least (n-1) intervals of 250 ms less a third for the clock's
		// granularity. Load only slows them; this lower bound cannot flake.
		if spread := last.Sub(first); spread < time.Duration(n-1)*250*time.Millisecond*2/3 {
			t.Fatalf("%d callbacks within %v: not paced by the callback lane", n, spread)
		}
		if _, rec := getRecord(t, addr, "demo", "cb-0"); rec.Callback != recv.srv.URL+"/hooks/ok/0" {
			t.Fatalf("the record does not name its callback: %+v", rec)
		}
	})

	t.Run("a failing receiver is retried, then dead-lettered on the callback lane", func(t *testing.T) {
		if c := submitWithCallback(t, addr, "demo", "cb-fail", recv.srv.URL+"/hooks/fail", "f"); c.code != http.StatusAccepted {
			t.Fatalf("submit: %d %q", c.code, c.body)
		}
		var dead api.DeadLetters
		testenv.Eventually(t, 20*time.Second, "the callback dead-lettered", func() bool {
			dead = api.DeadLetters{}
			keyCall(t, "GET", addr, "/v1/lanes/callbacks/dead", "", &dead)
			return len(dead.Dead) > 0
		})
		if d := dead.Dead[0]; d.ID != "demo.cb-fail.callback" || d.Attempts != 3 || d.LastStatus != http.StatusInternalServerError {
			t.Fatalf("dead letter %+v", d)
		}
		if got := len(recv.to("/hooks/fail")); got != 3 {
			t.Fatalf("the failing receiver was called %d times; want 3 (max_attempts)", got)
		}
	})

	t.Run("batch items name their callback", func(t *testing.T) {
		post := func(body string) jobCall {
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Post("http://"+addr+"/v1/lanes/demo/jobs:batch", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return jobCall{resp.StatusCode, resp.Header, b}
		}
		c := post(fmt.Sprintf(`[{"idempotency_key":"b-ok","payload":"b","callback":%q},{"idempotency_key":"b-bad","payload":"b","callback":%q}]`,
			recv.srv.URL+"/hooks/batch", recv.srv.URL+"/elsewhere"))
		if c.code != http.StatusBadRequest || !strings.Contains(string(c.body), `"/1/callback"`) {
			t.Fatalf("a batch with a refused callback: %d %q; want 400 naming /1/callback", c.code, c.body)
		}
		for _, id := range []string{"b-ok", "b-bad"} {
			if code, _ := getRecord(t, addr, "demo", id); code != http.StatusNotFound {
				t.Fatalf("refused batch: %s has a record (%d)", id, code)
			}
		}
		if c := post(fmt.Sprintf(`[{"idempotency_key":"b-ok","payload":"b","callback":%q}]`, recv.srv.URL+"/hooks/batch")); c.code != http.StatusOK && c.code != http.StatusMultiStatus && c.code != http.StatusAccepted {
			t.Fatalf("batch: %d %q", c.code, c.body)
		}
		testenv.Eventually(t, 20*time.Second, "the batch item's callback", func() bool { return len(recv.to("/hooks/batch")) > 0 })
		k := recv.to("/hooks/batch")[0]
		verifySigned(t, k)
		var rec api.JobRecord
		if err := json.Unmarshal(k.body, &rec); err != nil || rec.ID != "b-ok" || rec.State != api.StateDelivered {
			t.Fatalf("batch callback: %v %q", err, k.body)
		}
	})

	t.Run("an expired job's record is POSTed", func(t *testing.T) {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/demo/jobs", strings.NewReader("e"))
		req.Header.Set("Idempotency-Key", "cb-expired")
		req.Header.Set("Throttle-Callback", recv.srv.URL+"/hooks/expired")
		req.Header.Set("Throttle-Delay", "5s")
		req.Header.Set("Throttle-Expires", time.Now().Add(2*time.Second).UTC().Format(time.RFC3339))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submit: %d", resp.StatusCode)
		}
		testenv.Eventually(t, 30*time.Second, "the expired job's callback", func() bool { return len(recv.to("/hooks/expired")) > 0 })
		k := recv.to("/hooks/expired")[0]
		verifySigned(t, k)
		var rec api.JobRecord
		if err := json.Unmarshal(k.body, &rec); err != nil || rec.ID != "cb-expired" || rec.State != api.StateExpired || len(rec.Attempts) != 0 {
			t.Fatalf("expired callback: %v %q", err, k.body)
		}
	})

	t.Run("a cancelled job's record is POSTed", func(t *testing.T) {
		if code := keyCall(t, "PATCH", addr, "/v1/lanes/demo", `{"paused":true}`, nil); code != http.StatusOK {
			t.Fatalf("pause: %d", code)
		}
		defer keyCall(t, "PATCH", addr, "/v1/lanes/demo", `{"paused":false}`, nil)
		if c := submitWithCallback(t, addr, "demo", "cb-cancel", recv.srv.URL+"/hooks/cancelled", "c"); c.code != http.StatusAccepted {
			t.Fatalf("submit: %d %q", c.code, c.body)
		}
		if c := callJob(t, "DELETE", "http://"+addr+"/v1/lanes/demo/jobs/cb-cancel", "", ""); c.code != http.StatusOK {
			t.Fatalf("cancel: %d %q", c.code, c.body)
		}
		testenv.Eventually(t, 20*time.Second, "the cancelled job's callback", func() bool {
			return len(recv.to("/hooks/cancelled")) > 0
		})
		k := recv.to("/hooks/cancelled")[0]
		verifySigned(t, k)
		var rec api.JobRecord
		if err := json.Unmarshal(k.body, &rec); err != nil || rec.State != api.StateCancelled || rec.ID != "cb-cancel" || len(rec.Attempts) != 0 {
			t.Fatalf("cancelled callback: %v %q", err, k.body)
		}
		// A second DELETE answers the same record and sends nothing more.
		if c := callJob(t, "DELETE", "http://"+addr+"/v1/lanes/demo/jobs/cb-cancel", "", ""); c.code != http.StatusOK {
			t.Fatalf("cancel again: %d %q", c.code, c.body)
		}
		if got := len(recv.to("/hooks/cancelled")); got != 1 {
			t.Fatalf("cancelled callback came %d times", got)
		}
	})
}

// TestRecordGoneWhileTheJobWaits: a job submitted with a Throttle-Callback
// waits (its lane held) past results.keep, so its record goes while the
// job still waits in its lane. Such a job is not found without its record
// (only jobs without an id of their own, and jobs published over NATS,
// are: those never name a callback), so its cancel answers 404 and writes
// nothing. Once the lane runs again it is delivered: its claim makes the
// record again, with the callback, which the settled record is POSTed to.
func TestRecordGoneWhileTheJobWaits(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	target, calls := recordsTarget(t)
	recv := newCallbackReceiver(t)
	y := fmt.Sprintf(`listen: 127.0.0.1:0
nats: {url: %q, data_dir: %q, dedup_window: 1s}
redis: {url: %q}
dispatch: {allow_networks: [127.0.0.0/8]}
lanes:
  - name: demo
    rate: 50
    burst: 5
    results: {keep: 1s, max_wait: 20s, callback_urls: [%q], callback_lane: callbacks}
    target: {http: {url: %q}}
  - name: callbacks
    rate: 20
    burst: 5
    target: {http: {url: %q, job_urls: [%q], signing_secrets: [%q]}}
`, natsSrv.ClientURL(), t.TempDir(), redis.URL(), recv.srv.URL+"/hooks", target.URL, recv.srv.URL+"/hooks", recv.srv.URL+"/hooks", callbackSecret)
	cfg, err := config.Parse("callbacks.yaml", []byte(y), nil)
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := servicetest.Start(t, cfg, nil)
	addr := svc.Addr()
	base := "http://" + addr + "/v1/lanes/demo/jobs"
	if code := keyCall(t, "PATCH", addr, "/v1/lanes/demo", `{"paused":true}`, nil); code != http.StatusOK {
		t.Fatalf("pause: %d", code)
	}
	hook := recv.srv.URL + "/hooks/late"
	if c := submitWithCallback(t, addr, "demo", "late", hook, "x"); c.code != http.StatusAccepted {
		t.Fatalf("submit: %d %q", c.code, c.body)
	}
	testenv.Eventually(t, 20*time.Second, "the job's record gone (results.keep)", func() bool {
		c := callJob(t, "GET", base, "", "")
		return c.code == http.StatusOK && strings.Contains(string(c.body), `"jobs":[]`)
	})
	if c := callJob(t, "DELETE", base+"/late", "", ""); c.code != http.StatusNotFound || !strings.Contains(string(c.body), `"field":"id"`) {
		t.Fatalf("cancel of a job whose record went: %d %q; want 404 naming id", c.code, c.body)
	}
	if code := keyCall(t, "PATCH", addr, "/v1/lanes/demo", `{"paused":false}`, nil); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	testenv.Eventually(t, 20*time.Second, "the settled record's callback", func() bool { return len(recv.to("/hooks/late")) > 0 })
	k := recv.to("/hooks/late")[0]
	verifySigned(t, k)
	var sent api.JobRecord
	if err := json.Unmarshal(k.body, &sent); err != nil || sent.ID != "late" || sent.State != api.StateDelivered || sent.Callback != hook {
		t.Fatalf("the callback's record: %q", k.body)
	}
	if got := calls.Load(); got != 1 {
		t.Fatalf("target called %d times, want 1", got)
	}
}
