package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// hostArrival is one job a receiving host got: its id, the Throttle-Key
// the throttler sent, the path, and when.
type hostArrival struct {
	id, key, path string
	at            time.Time
}

// receivingHost is a test receiver on its own port (so its own host:port,
// its own key on a url_host lane) that records what it gets.
type receivingHost struct {
	mu   sync.Mutex
	got  []hostArrival
	srv  *httptest.Server
	host string // host:port, the key the lane gives its jobs
}

func newReceivingHost(t *testing.T) *receivingHost {
	rh := &receivingHost{}
	rh.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rh.mu.Lock()
		rh.got = append(rh.got, hostArrival{id: r.Header.Get("Idempotency-Key"), key: r.Header.Get("Throttle-Key"), path: r.URL.Path, at: time.Now()})
		rh.mu.Unlock()
	}))
	t.Cleanup(rh.srv.Close)
	rh.host = strings.TrimPrefix(rh.srv.URL, "http://")
	return rh
}

func (rh *receivingHost) arrivals() []hostArrival {
	rh.mu.Lock()
	defer rh.mu.Unlock()
	return append([]hostArrival(nil), rh.got...)
}

// keyFromConfig is a keyed lane "demo" with per_key.key_from: url_host
// whose job_urls are the hosts' roots; its base URL is base.
func keyFromConfig(t *testing.T, base string, perRate float64, hosts ...*receivingHost) config.Config {
	cfg := keyedConfig(t, base, 1000, 1000, perRate, 1)
	for _, h := range hosts {
		cfg.Lanes[0].Target.HTTP.JobURLs = append(cfg.Lanes[0].Target.HTTP.JobURLs, h.srv.URL+"/")
	}
	cfg.Lanes[0].PerKey.KeyFrom = "url_host"
	cfg.NATS.Listen = testenv.FreeAddr(t)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// publishURLJob publishes a job on subject with a Throttle-URL (none when
// url is "").
func publishURLJob(t *testing.T, js jetstream.JetStream, subject, id, url string) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte("n")
	m.Header.Set(jetstream.MsgIDHeader, id)
	if url != "" {
		m.Header.Set("Throttle-URL", url)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
}

// TestKeyFromURLHostPacesEachReceiver (real clock): one keyed lane with
// per_key.key_from: url_host (each host 5/s, burst 1; the lane-wide cap
// never binds) and two receiving hosts. Jobs name only a Throttle-URL,
// on all three intake paths (single POST, batch items' url, NATS on
// throttle.<lane> without a key token). Each job reaches its host once,
// with the host:port as its Throttle-Key, in submit order per host; no
// host gets two jobs closer than its period (less the HTTP hop and
// three times the worst stall of this process, as
// TestThousandReceiversEachWithItsURL allows); and the two hosts are paced
// side by side, not as one key: host B's first job arrives before host
// A's last (one shared bucket would put all of A's after or between).
func TestKeyFromURLHostPacesEachReceiver(t *testing.T) {
	a, b := newReceivingHost(t), newReceivingHost(t)
	base := newReceivingHost(t) // the lane's base URL: no job should go there
	const rate = 5.0
	cfg := keyFromConfig(t, base.srv.URL+"/base/", rate, a, b)
	svc, _ := start(t, cfg)
	addr := svc.Addr()
	_, js := testenv.JetStream(t, "nats://"+cfg.NATS.Listen)

	// Per host: 3 single jobs, 3 batch items, 3 NATS jobs, in that order.
	const per = 3
	stalls := testenv.StartStallMeter(t)
	hosts := []*receivingHost{a, b}
	name := func(h, path, i int) string { return fmt.Sprintf("h%d-%d-%d", h, path, i) }
	for h, rh := range hosts {
		for i := range per {
			url := fmt.Sprintf("%s/hook/%d", rh.srv.URL, i)
			if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/jobs", "x", map[string]string{"Idempotency-Key": name(h, 0, i), "Throttle-URL": url}); code != http.StatusAccepted {
				t.Fatalf("single %s: %d %s", name(h, 0, i), code, body)
			}
		}
	}
	for h, rh := range hosts {
		var items []string
		for i := range per {
			items = append(items, fmt.Sprintf(`{"idempotency_key":%q,"payload":1,"url":"%s/hook/b%d"}`, name(h, 1, i), rh.srv.URL, i))
		}
		if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/jobs:batch", "["+strings.Join(items, ",")+"]", map[string]string{"Content-Type": "application/json"}); code != http.StatusAccepted {
			t.Fatalf("batch: %d %s", code, body)
		}
	}
	for h, rh := range hosts {
		for i := range per {
			publishURLJob(t, js, "throttle.demo", name(h, 2, i), fmt.Sprintf("%s/hook/n%d", rh.srv.URL, i))
		}
	}
	waitFor(t, 30*time.Second, "every job at its host", func() bool {
		return len(a.arrivals()) >= 3*per && len(b.arrivals()) >= 3*per
	})
	waitSettled(t, addr)
	if got := base.arrivals(); len(got) != 0 {
		t.Fatalf("jobs with a Throttle-URL went to the lane's base URL: %+v", got)
	}
	jitter := 20*time.Millisecond + 3*stalls.WorstStall()
	period := time.Duration(float64(time.Second) / rate)
	for h, rh := range hosts {
		got := rh.arrivals()
		if len(got) != 3*per {
			t.Fatalf("host %d: %d arrivals, want %d", h, len(got), 3*per)
		}
		// Submit order per host: the single jobs, then the batch's, then
		// NATS (the public intake moves them onto the key in order).
		k := 0
		for path := range 3 {
			for i := range per {
				if c := got[k]; c.id != name(h, path, i) || c.key != rh.host {
					t.Fatalf("host %d: arrival %d is %s with Throttle-Key %q, want %s with %q", h, k, c.id, c.key, name(h, path, i), rh.host)
				}
				k++
			}
		}
		for j := 1; j < len(got); j++ {
			if gap := got[j].at.Sub(got[j-1].at); gap < period-jitter {
				t.Fatalf("host %d: arrivals %d and %d %v apart, under the host's period %v less the jitter %v", h, j-1, j, gap, period, jitter)
			}
		}
	}
	if fa, lb := a.arrivals()[3*per-1].at, b.arrivals()[0].at; !lb.Before(fa) {
		t.Fatalf("host B's first job came at %v, after host A's last at %v: the hosts were not paced side by side", lb, fa)
	}
}

// TestDestKeyFromURLHostRefusals: on a url_host lane a job needs a
// Throttle-Key or a Throttle-URL (400 naming Throttle-Key, the detail
// saying url_host); a key other than its URL's host is refused (400
// naming Throttle-Key), the same key is taken; a URL outside job_urls is
// refused naming Throttle-URL; a batch item names its member. On NATS the
// same faults make the job a dead letter at once, with the reason, and
// nothing reaches a target.
func TestDestKeyFromURLHostRefusals(t *testing.T) {
	t.Parallel()
	a := newReceivingHost(t)
	base := newReceivingHost(t)
	cfg := keyFromConfig(t, base.srv.URL+"/base/", 1000, a)
	logs := &testenv.LogBuffer{}
	svc := service.New(cfg, logs.Logger(), nil)
	servicetest.Run(t, svc)
	addr := svc.Addr()

	for _, c := range []struct {
		name   string
		h      map[string]string
		batch  string
		field  string
		detail string
	}{
		{"neither", map[string]string{}, "", "Throttle-Key", "per_key.key_from url_host"},
		{"key disagrees", map[string]string{"Throttle-Key": "other.example", "Throttle-URL": a.srv.URL + "/x"}, "", "Throttle-Key", "is not the host of its URL"},
		{"key of another port", map[string]string{"Throttle-Key": "127.0.0.1", "Throttle-URL": a.srv.URL + "/x"}, "", "Throttle-Key", "is not the host of its URL"},
		{"url outside", map[string]string{"Throttle-URL": "http://169.254.169.254/latest"}, "", "Throttle-URL", "job_urls"},
		{"two urls", nil, "", "Throttle-URL", "at most one"},
		{"batch neither", nil, `[{"payload":1,"url":"` + a.srv.URL + `/ok"},{"payload":1}]`, "/1/throttle_key", "url_host"},
		{"batch disagrees", nil, `[{"payload":1,"throttle_key":"x","url":"` + a.srv.URL + `/ok"}]`, "/0/throttle_key", "is not the host of its URL"},
		{"batch url outside", nil, `[{"payload":1,"url":"http://127.0.0.1:1/"}]`, "/0/url", "job_urls"},
	} {
		var code int
		var body []byte
		var h http.Header
		switch {
		case c.batch != "":
			code, body, h = postTrace(t, addr, "/v1/lanes/demo/jobs:batch", c.batch, map[string]string{"Content-Type": "application/json"})
		case c.h == nil:
			req, _ := http.NewRequest("POST", "http://"+addr+"/v1/lanes/demo/jobs", strings.NewReader("x"))
			req.Header.Set("Idempotency-Key", "refused-two-urls")
			req.Header.Add("Throttle-URL", a.srv.URL+"/1")
			req.Header.Add("Throttle-URL", a.srv.URL+"/2")
			resp, err := servicetest.Client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			code, h = resp.StatusCode, resp.Header
		default:
			c.h["Idempotency-Key"] = "refused-" + strings.ReplaceAll(c.name, " ", "-")
			code, body, h = postTrace(t, addr, "/v1/lanes/demo/jobs", "x", c.h)
		}
		var p api.Problem
		_ = json.Unmarshal(body, &p)
		if code != http.StatusBadRequest || h.Get("Content-Type") != "application/problem+json" || p.Field != c.field || !strings.Contains(p.Detail, c.detail) {
			t.Errorf("%s: %d %s, want a 400 problem naming %q with %q in its detail", c.name, code, body, c.field, c.detail)
		}
	}
	// Taken: the key that is the URL's host; a key alone that is the host
	// of the lane's URL (to that URL).
	for id, h := range map[string]map[string]string{
		"agrees":   {"Throttle-Key": a.host, "Throttle-URL": a.srv.URL + "/agrees"},
		"key-only": {"Throttle-Key": base.host},
	} {
		h["Idempotency-Key"] = id
		if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/jobs", "x", h); code != http.StatusAccepted {
			t.Errorf("%s: %d %s, want 202", id, code, body)
		}
	}

	// NATS: published on throttle.demo (no key token) or on a key.
	_, js := testenv.JetStream(t, "nats://"+cfg.NATS.Listen)
	publishURLJob(t, js, "throttle.demo", "nats-ok", a.srv.URL+"/n")
	publishURLJob(t, js, "throttle.demo."+a.host, "nats-key-agrees", a.srv.URL+"/n2")
	publishURLJob(t, js, "throttle.demo", "nats-neither", "")
	publishURLJob(t, js, "throttle.demo.other", "nats-disagrees", a.srv.URL+"/n3")
	publishURLJob(t, js, "throttle.demo", "nats-outside", "http://169.254.169.254/latest")
	waitFor(t, 10*time.Second, "the jobs delivered", func() bool {
		ids := map[string]bool{}
		for _, c := range append(a.arrivals(), base.arrivals()...) {
			ids[c.id] = true
		}
		return ids["agrees"] && ids["key-only"] && ids["nats-ok"] && ids["nats-key-agrees"]
	})
	page := waitDead(t, addr, "demo", "three dead letters", func(page api.DeadLetters) bool { return len(page.Dead) == 3 })
	want := map[string]string{
		"nats-neither":   "or on throttle.demo with a Throttle-URL whose host is the key",
		"nats-disagrees": "is not the host of its Throttle-URL",
		"nats-outside":   "invalid Throttle-URL",
	}
	for _, d := range page.Dead {
		if w, ok := want[d.ID]; !ok || !strings.Contains(d.Reason, w) {
			t.Errorf("dead letter %s: reason %q, want it to say %q", d.ID, d.Reason, w)
		}
	}
	waitSettled(t, addr)
	for _, c := range a.arrivals() {
		switch c.id {
		case "agrees", "nats-ok", "nats-key-agrees":
			if c.key != a.host {
				t.Errorf("%s: Throttle-Key %q, want %q", c.id, c.key, a.host)
			}
		default:
			t.Errorf("%s reached the receiving host", c.id)
		}
	}
	for _, c := range base.arrivals() {
		if c.id != "key-only" || c.key != base.host || c.path != "/base/" {
			t.Errorf("base URL got %+v, want only key-only", c)
		}
	}
}

// TestKeyFromURLHostKeyWithoutURL: on a url_host lane a job that names a
// key and no URL is taken only when the key has its own url (PATCH
// …/keys/{key}, whose host must be the key: else 400 naming url) or is
// the host of the lane's own url (not under job_urls here); any other key
// would give the lane's host a bucket of its own. Refused: 400 naming
// Throttle-Key (batch: /<i>/throttle_key), and a job published on
// throttle.<lane>.<key> is a dead letter with the reason. Taken, on all
// three intake paths: the lane host's key goes to the lane's url, a key
// with its own url to that url; nothing reaches a host by another key.
func TestKeyFromURLHostKeyWithoutURL(t *testing.T) {
	t.Parallel()
	a, b := newReceivingHost(t), newReceivingHost(t)
	base := newReceivingHost(t)
	cfg := keyFromConfig(t, base.srv.URL+"/base/", 1000, a, b)
	svc, _ := start(t, cfg)
	addr := svc.Addr()

	patch := func(key, body string) (int, api.Problem) {
		var p api.Problem
		req, _ := http.NewRequest("PATCH", "http://"+addr+"/v1/lanes/demo/keys/"+key, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := pollClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_ = json.NewDecoder(resp.Body).Decode(&p)
		return resp.StatusCode, p
	}
	// A key's own url must be on the key's host.
	for key, body := range map[string]string{
		"made-up": `{"url":"` + a.srv.URL + `/own"}`,
		a.host:    `{"url":"` + b.srv.URL + `/own"}`,
	} {
		if code, p := patch(key, body); code != http.StatusBadRequest || p.Field != "url" || !strings.Contains(p.Detail, "url_host") {
			t.Errorf("PATCH %s %s: %d %+v, want a 400 naming url", key, body, code, p)
		}
	}
	if code, p := patch(a.host, `{"url":"`+a.srv.URL+`/own"}`); code != http.StatusOK {
		t.Fatalf("PATCH %s: %d %+v", a.host, code, p)
	}
	// A key with an override but no url of its own is still refused.
	if code, p := patch("made-up", `{"rate":"5/s"}`); code != http.StatusOK {
		t.Fatalf("PATCH made-up: %d %+v", code, p)
	}

	for _, c := range []struct {
		name, key, batch, field string
	}{
		{"made-up key", "made-up", "", "Throttle-Key"},
		{"a job_urls host without its own url", b.host, "", "Throttle-Key"},
		{"batch made-up key", "", `[{"payload":1,"throttle_key":"` + base.host + `"},{"payload":1,"throttle_key":"made-up"}]`, "/1/throttle_key"},
	} {
		var code int
		var body []byte
		if c.batch != "" {
			code, body, _ = postTrace(t, addr, "/v1/lanes/demo/jobs:batch", c.batch, map[string]string{"Content-Type": "application/json"})
		} else {
			code, body, _ = postTrace(t, addr, "/v1/lanes/demo/jobs", "x", map[string]string{"Idempotency-Key": "refused-" + c.key, "Throttle-Key": c.key})
		}
		var p api.Problem
		_ = json.Unmarshal(body, &p)
		if code != http.StatusBadRequest || p.Field != c.field || !strings.Contains(p.Detail, "no url of its own") || !strings.Contains(p.Detail, "url_host") {
			t.Errorf("%s: %d %s, want a 400 naming %s saying why", c.name, code, body, c.field)
		}
	}

	for id, key := range map[string]string{"base-key": base.host, "own-url": a.host} {
		if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/jobs", "x", map[string]string{"Idempotency-Key": id, "Throttle-Key": key}); code != http.StatusAccepted {
			t.Errorf("%s: %d %s, want 202", id, code, body)
		}
	}
	batch := `[{"idempotency_key":"base-key-batch","payload":1,"throttle_key":"` + base.host + `"},{"idempotency_key":"own-url-batch","payload":1,"throttle_key":"` + a.host + `"}]`
	if code, body, _ := postTrace(t, addr, "/v1/lanes/demo/jobs:batch", batch, map[string]string{"Content-Type": "application/json"}); code != http.StatusAccepted {
		t.Errorf("batch: %d %s, want 202", code, body)
	}
	_, js := testenv.JetStream(t, "nats://"+cfg.NATS.Listen)
	publishURLJob(t, js, "throttle.demo."+base.host, "base-key-nats", "")
	publishURLJob(t, js, "throttle.demo."+a.host, "own-url-nats", "")
	publishURLJob(t, js, "throttle.demo.made-up", "nats-made-up", "")

	want := map[*receivingHost][]string{
		base: {"base-key", "base-key-batch", "base-key-nats"},
		a:    {"own-url", "own-url-batch", "own-url-nats"},
	}
	waitFor(t, 10*time.Second, "the jobs delivered", func() bool {
		return len(base.arrivals()) >= 3 && len(a.arrivals()) >= 3
	})
	page := waitDead(t, addr, "demo", "one dead letter", func(page api.DeadLetters) bool { return len(page.Dead) >= 1 })
	waitSettled(t, addr)
	if len(page.Dead) != 1 || page.Dead[0].ID != "nats-made-up" || !strings.Contains(page.Dead[0].Reason, "no url of its own") {
		t.Errorf("dead letters %+v, want nats-made-up alone, saying the key has no url of its own", page.Dead)
	}
	for rh, ids := range want {
		host, path := base.host, "/base/"
		if rh == a {
			host, path = a.host, "/own"
		}
		got := map[string]bool{}
		for _, c := range rh.arrivals() {
			got[c.id] = true
			if c.key != host || c.path != path {
				t.Errorf("%s reached %s%s with Throttle-Key %q, want %s with %q", c.id, rh.host, c.path, c.key, path, host)
			}
		}
		for _, id := range ids {
			if !got[id] {
				t.Errorf("%s did not reach %s", id, rh.host)
			}
		}
		if len(got) != len(ids) {
			t.Errorf("%s got %v, want %v", rh.host, got, ids)
		}
	}
	if got := b.arrivals(); len(got) != 0 {
		t.Errorf("host B got %+v, want nothing", got)
	}
}
