package ingest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/quota"
)

func mustRate(t testing.TB, s string) bucket.Rate {
	t.Helper()
	r, err := bucket.ParseRate(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// callerFixture is a handler with keys and caller quotas on an in-memory
// limiter under a manual clock: plan free is 10/min burst 10, the per-IP
// layer 120 per minute.
func callerFixture(t testing.TB, c *clock.Manual, edit func(*Config)) *fixture {
	t.Helper()
	keys := []Key{testKey("shop", Scopes{Submit: true}), testKey("admin", Scopes{Admin: true})}
	keys[0].Plan = "free"
	return newFixture(t, func(cfg *Config) {
		cfg.Auth = Auth{Keys: keys}
		cfg.Callers = &Callers{
			Limiter: &quota.Memory{Clock: c}, Lanes: []string{"demo", "other"}, Clock: c,
			Policy: CallerPolicy{
				PerIP:         quota.Window{Limit: 120, Length: time.Minute},
				Plans:         map[string]Plan{"free": {Rate: mustRate(t, "10/min"), Burst: 10}, "anonymous": {Rate: mustRate(t, "2/min"), Burst: 2}},
				AnonymousPlan: "anonymous",
			},
		}
		if edit != nil {
			edit(cfg)
		}
	})
}

func post(h http.Handler, path, key, ip string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", path, strings.NewReader("{}"))
	r.RemoteAddr = ip + ":4242"
	if key != "" {
		r.Header.Set("Authorization", "Bearer secret-"+key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// policies parses RateLimit-Policy and RateLimit with a structured-field
// parser and returns, per policy name, its q, w, r and t.
func policies(t *testing.T, h http.Header) map[string]map[string]int64 {
	t.Helper()
	out := map[string]map[string]int64{}
	for _, field := range []string{"RateLimit-Policy", "RateLimit"} {
		list, err := httpsfv.UnmarshalList(h.Values(field))
		if err != nil {
			t.Fatalf("%s %q: %v", field, h.Values(field), err)
		}
		for _, m := range list {
			it, ok := m.(httpsfv.Item)
			if !ok {
				t.Fatalf("%s: member %v is not an item", field, m)
			}
			name, ok := it.Value.(string)
			if !ok {
				t.Fatalf("%s: %v is not a string", field, it.Value)
			}
			if out[name] == nil {
				out[name] = map[string]int64{}
			}
			for _, k := range it.Params.Names() {
				v, _ := it.Params.Get(k)
				n, ok := v.(int64)
				if !ok {
					t.Fatalf("%s: %s;%s=%v is not an integer", field, name, k, v)
				}
				out[name][k] = n
			}
		}
	}
	return out
}

// TestPlanTenPerMinute: a key on 10/min gets 10 × 202, then 429 with
// Retry-After 6 and the plan's headers (parsed as structured fields); 6 s
// later it gets one more.
func TestPlanTenPerMinute(t *testing.T) {
	c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	f := callerFixture(t, c, nil)
	for i := range 10 {
		rec := post(f.h, "/v1/lanes/demo/jobs", "shop", "192.0.2.1")
		if rec.Code != http.StatusAccepted {
			t.Fatalf("job %d: %d %s", i+1, rec.Code, rec.Body)
		}
		p := policies(t, rec.Header())
		if got := p["plan:free"]; got["q"] != 10 || got["w"] != 60 || got["r"] != int64(9-i) {
			t.Fatalf("job %d: plan policy %v", i+1, got)
		}
		if got := p["demo"]; got["q"] != 20 || got["w"] != 1 {
			t.Fatalf("job %d: the lane's 20/s policy is %v, want q=20;w=1", i+1, got)
		}
		if got := p["callers:ip"]; got["q"] != 120 || got["w"] != 60 || got["r"] != int64(119-i) {
			t.Fatalf("job %d: per-IP policy %v", i+1, got)
		}
		if rec.Header().Get("X-RateLimit-Limit") != "10" || rec.Header().Get("X-RateLimit-Remaining") != strconv.Itoa(9-i) {
			t.Fatalf("job %d: X-RateLimit-* %v, want the plan's", i+1, rec.Header())
		}
	}
	rec := post(f.h, "/v1/lanes/demo/jobs", "shop", "192.0.2.1")
	p := readProblem(t, rec)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "6" || p.Type != ProblemCallerQuota || p.Field != "plan" {
		t.Fatalf("11th: %d Retry-After %q %+v", rec.Code, rec.Header().Get("Retry-After"), p)
	}
	if got := policies(t, rec.Header())["plan:free"]; got["r"] != 0 {
		t.Fatalf("11th: plan policy %v", got)
	}
	if rec.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("11th: X-RateLimit-Remaining %q", rec.Header().Get("X-RateLimit-Remaining"))
	}
	if f.pub.n.Load() != 10 {
		t.Fatalf("%d jobs stored, want 10", f.pub.n.Load())
	}
	if n := testutil.ToFloat64(f.h.cfg.Metrics.Callers.Rejections.WithLabelValues("demo", "free", "plan")); n != 1 {
		t.Fatalf("rejections counter %v", n)
	}
	line := lastLine(t, f.logs.String(), "caller refused")
	for _, want := range []string{`"caller":"shop"`, `"ip":"192.0.2.1"`, `"plan":"free"`, `"lane":"demo"`, `"layer":"plan"`, `"reason":"plan_limit"`, `"at":"2026-12-01T12:00:00Z"`} {
		if !strings.Contains(line, want) {
			t.Errorf("refusal log %s lacks %s", line, want)
		}
	}
	c.Advance(6 * time.Second)
	if rec := post(f.h, "/v1/lanes/demo/jobs", "shop", "192.0.2.1"); rec.Code != http.StatusAccepted {
		t.Fatalf("after 6s: %d", rec.Code)
	}
}

func lastLine(t *testing.T, logs, msg string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], `"msg":"`+msg+`"`) {
			return lines[i]
		}
	}
	t.Fatalf("no %q log line in\n%s", msg, logs)
	return ""
}

// TestPerIPBeforeAuth: the 121st request in a minute from one IP gets 429
// even with a bad key, and before any 401; a good key from that IP too;
// another IP is not affected.
func TestPerIPBeforeAuth(t *testing.T) {
	c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	f := callerFixture(t, c, nil)
	for i := range 120 {
		if rec := post(f.h, "/v1/lanes/demo/jobs", "nobody", "198.51.100.9"); rec.Code != http.StatusUnauthorized {
			t.Fatalf("request %d with a bad key: %d", i+1, rec.Code)
		}
		c.Advance(100 * time.Millisecond)
	}
	rec := post(f.h, "/v1/lanes/demo/jobs", "nobody", "198.51.100.9")
	p := readProblem(t, rec)
	if rec.Code != http.StatusTooManyRequests || p.Field != "per_ip" || rec.Header().Get("WWW-Authenticate") != "" {
		t.Fatalf("121st with a bad key: %d %+v %v", rec.Code, p, rec.Header())
	}
	retry, err := strconv.Atoi(rec.Header().Get("Retry-After"))
	// 12 s into the window: the next request fits 48 s + 0.5 s later.
	if err != nil || retry != 49 {
		t.Fatalf("Retry-After %q, want 49", rec.Header().Get("Retry-After"))
	}
	if got := policies(t, rec.Header())["callers:ip"]; got["r"] != 0 || got["t"] != 49 {
		t.Fatalf("per-IP policy %v", got)
	}
	if rec := post(f.h, "/v1/lanes/demo/jobs", "shop", "198.51.100.9"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("good key from the same IP: %d", rec.Code)
	}
	if rec := post(f.h, "/v1/lanes/demo/jobs", "nobody", "198.51.100.10"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("another IP: %d", rec.Code)
	}
	// Other routes: a refused key meets the layer, a valid one does not
	// count (a status page polling with its key).
	for key, want := range map[string]int{"nobody": http.StatusTooManyRequests, "admin": http.StatusOK} {
		r := httptest.NewRequest("GET", "/v1/lanes", nil)
		r.RemoteAddr = "198.51.100.9:1"
		r.Header.Set("Authorization", "Bearer secret-"+key)
		get := httptest.NewRecorder()
		f.h.ServeHTTP(get, r)
		if get.Code != want {
			t.Fatalf("GET /v1/lanes from the refused IP with key %s: %d, want %d", key, get.Code, want)
		}
	}
	if n := testutil.ToFloat64(f.h.cfg.Metrics.Callers.Rejections.WithLabelValues("demo", "none", "ip")); n != 1 {
		t.Fatalf("ip rejections with no plan: %v", n)
	}
}

// TestObservationMode: an observed plan lets everything through and logs
// and counts each refusal it would have made; an observed lane does the same
// for a plan that is enforced elsewhere.
func TestObservationMode(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		lane *fakeLanes
	}{
		{"plan", func(cfg *Config) {
			p := cfg.Callers.Policy.Plans["free"]
			p.Observe = true
			cfg.Callers.Policy.Plans["free"] = p
		}, nil},
		{"lane", nil, &fakeLanes{maxBody: 1 << 10, observe: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
			f := callerFixture(t, c, func(cfg *Config) {
				if tc.edit != nil {
					tc.edit(cfg)
				}
				if tc.lane != nil {
					cfg.Lanes = tc.lane
				}
			})
			for i := range 25 {
				if rec := post(f.h, "/v1/lanes/demo/jobs", "shop", "192.0.2.1"); rec.Code != http.StatusAccepted {
					t.Fatalf("job %d: %d", i+1, rec.Code)
				}
			}
			if n := strings.Count(f.logs.String(), `"msg":"caller would be refused (observe)"`); n != 15 {
				t.Fatalf("%d would-be refusals logged, want 15", n)
			}
			if n := testutil.ToFloat64(f.h.cfg.Metrics.Callers.Observed.WithLabelValues("demo", "free", "plan")); n != 15 {
				t.Fatalf("observed counter %v, want 15", n)
			}
			if n := testutil.ToFloat64(f.h.cfg.Metrics.Callers.Rejections.WithLabelValues("demo", "free", "plan")); n != 0 {
				t.Fatalf("rejections counter %v, want 0", n)
			}
		})
	}
}

// TestAnonymousPlanPerIP: without keys, callers share the anonymous plan, a
// bucket per IP.
func TestAnonymousPlanPerIP(t *testing.T) {
	c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	f := callerFixture(t, c, func(cfg *Config) { cfg.Auth = Auth{} })
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		for i, want := range []int{202, 202, 429} {
			r := httptest.NewRequest("POST", "/v1/lanes/demo/jobs", strings.NewReader("{}"))
			r.RemoteAddr, r.Host = ip+":1", "localhost"
			rec := httptest.NewRecorder()
			f.h.ServeHTTP(rec, r)
			if rec.Code != want {
				t.Fatalf("%s request %d: %d, want %d", ip, i+1, rec.Code, want)
			}
			if want == 429 && rec.Header().Get("Retry-After") != "30" {
				t.Fatalf("Retry-After %q, want 30 (2/min)", rec.Header().Get("Retry-After"))
			}
		}
	}
}

// TestLaneCostAndBatchCharge: a lane's cost is charged per job; a batch
// charges n jobs once its size is known, and one that costs more than the
// burst gets 413.
func TestLaneCostAndBatchCharge(t *testing.T) {
	c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	f := callerFixture(t, c, func(cfg *Config) { cfg.Lanes = &fakeLanes{maxBody: 1 << 10, cost: 3} })
	for i, want := range []int{202, 202, 202, 429} {
		if rec := post(f.h, "/v1/lanes/demo/jobs", "shop", "192.0.2.1"); rec.Code != want {
			t.Fatalf("job %d of cost 3: %d, want %d", i+1, rec.Code, want)
		}
	}
	// A batch route: guard charges nothing, the handler charges n jobs.
	f.h.mux.HandleFunc("POST /v1/lanes/{lane}/test-batch", f.h.guard(needSubmit, 0, func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		lane, _ := f.h.cfg.Lanes.Lane(r.PathValue("lane"))
		if f.h.chargeJobs(w, r, lane, n) {
			w.WriteHeader(http.StatusAccepted)
		}
	}))
	c.Advance(time.Minute) // full again: 10 tokens, 3 a job
	for _, tc := range []struct {
		n, want int
	}{{2, 202}, {1, 202}, {1, 429}, {4, 413}} {
		rec := post(f.h, fmt.Sprintf("/v1/lanes/demo/test-batch?n=%d", tc.n), "shop", "192.0.2.1")
		if rec.Code != tc.want {
			t.Fatalf("batch of %d: %d %s, want %d", tc.n, rec.Code, rec.Body, tc.want)
		}
		if tc.want == 413 && readProblem(t, rec).Field != "cost" {
			t.Fatalf("413 without field cost")
		}
	}
}

// TestPlanAdmin: a plan changed through the admin API, and a key moved to
// another plan, take effect on the next request; both are audited.
func TestPlanAdmin(t *testing.T) {
	c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	f := callerFixture(t, c, nil)
	call := func(method, path, key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer secret-"+key)
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, r)
		return rec
	}
	if rec := call("PUT", "/v1/callers/plans/gold", "shop", `{"rate":"1/min","burst":1}`); rec.Code != http.StatusForbidden {
		t.Fatalf("PUT by a submit key: %d", rec.Code)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"rate":"1/week"}`, "rate"}, {`{"burst":3}`, "rate"}, {`{"rate":"1/s","burst":-2}`, "burst"}, {`{"rat":"1/s"}`, "body"},
	} {
		rec := call("PUT", "/v1/callers/plans/gold", "admin", tc.body)
		if p := readProblem(t, rec); rec.Code != 400 || p.Field != tc.field {
			t.Fatalf("%s: %d %+v, want 400 naming %s", tc.body, rec.Code, p, tc.field)
		}
	}
	if rec := call("PUT", "/v1/callers/plans/gold", "admin", `{"rate":"1/min","burst":1}`); rec.Code != 200 {
		t.Fatalf("PUT plan: %d %s", rec.Code, rec.Body)
	}
	if rec := call("PUT", "/v1/callers/keys/shop/plan", "admin", `{"plan":"platinum"}`); rec.Code != 400 {
		t.Fatalf("unknown plan: %d", rec.Code)
	}
	if rec := call("PUT", "/v1/callers/keys/nobody/plan", "admin", `{"plan":"gold"}`); rec.Code != 404 {
		t.Fatalf("unknown key: %d", rec.Code)
	}
	if rec := call("PUT", "/v1/callers/keys/shop/plan", "admin", `{"plan":"gold"}`); rec.Code != 200 {
		t.Fatalf("PUT key plan: %d %s", rec.Code, rec.Body)
	}
	for i, want := range []int{202, 429} {
		if rec := post(f.h, "/v1/lanes/demo/jobs", "shop", "192.0.2.1"); rec.Code != want {
			t.Fatalf("job %d on gold: %d, want %d", i+1, rec.Code, want)
		}
	}
	rec := call("GET", "/v1/callers/plans", "admin", "")
	var body api.Plans
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != 200 {
		t.Fatalf("GET plans: %d %v", rec.Code, err)
	}
	if body.KeyPlans["shop"] != "gold" || len(body.Plans) != 3 || body.PerIP.Limit != 120 {
		t.Fatalf("GET plans: %+v", body)
	}
	for _, want := range []string{`"audit":"set_plan"`, `"audit":"set_key_plan"`} {
		if !strings.Contains(f.logs.String(), want) {
			t.Errorf("no %s audit line", want)
		}
	}
	// A reload puts the file's plans back.
	if err := f.h.SetCallers(f.h.cfg.Callers.Policy); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Hour)
	for i := range 10 {
		if rec := post(f.h, "/v1/lanes/demo/jobs", "shop", "192.0.2.1"); rec.Code != 202 {
			t.Fatalf("after reload, job %d: %d", i+1, rec.Code)
		}
	}
}

// TestUtilization: the lanes API and the metrics show each plan's and lane's
// use over the last minute.
func TestUtilization(t *testing.T) {
	c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	f := callerFixture(t, c, nil)
	for range 5 {
		post(f.h, "/v1/lanes/demo/jobs", "shop", "192.0.2.1")
	}
	r := httptest.NewRequest("GET", "/v1/lanes", nil)
	r.Header.Set("Authorization", "Bearer secret-admin")
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, r)
	var out api.Lanes
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	var free api.PlanStatus
	for _, p := range out.Plans {
		if p.Name == "free" {
			free = p
		}
	}
	// 5 tokens of the 10 a minute one caller may take.
	if free.Utilization != 0.5 || free.Callers != 1 {
		t.Fatalf("plan free: %+v", free)
	}
	// 5 jobs of the 1200 a minute lane demo (20/s) drains.
	if u := out.Lanes[0].CallerUtilization; u == nil || *u != 5.0/1200 {
		t.Fatalf("lane demo caller utilization %v", u)
	}
	plans, lanes := f.h.utilization()
	if plans["free"] != 0.5 || lanes["demo"] != 5.0/1200 {
		t.Fatalf("metrics: %v %v", plans, lanes)
	}
}

func TestResolveClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	for _, tc := range []struct {
		name, peer string
		headers    map[string][]string
		want       string
	}{
		{"untrusted peer ignores the header", "203.0.113.5:1", map[string][]string{"X-Forwarded-For": {"1.2.3.4"}}, "203.0.113.5"},
		{"trusted peer, one hop", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"198.51.100.7"}}, "198.51.100.7"},
		{"rightmost untrusted hop", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.7, 10.1.1.1"}}, "198.51.100.7"},
		{"several header lines", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"6.6.6.6", "198.51.100.7"}}, "198.51.100.7"},
		{"all trusted: the leftmost", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"10.2.2.2, 10.1.1.1"}}, "10.2.2.2"},
		{"garbage stops the walk", "10.0.0.1:1", map[string][]string{"X-Forwarded-For": {"198.51.100.7, nonsense"}}, "10.0.0.1"},
		{"Forwarded", "[::1]:1", map[string][]string{"Forwarded": {`for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711"`}}, "2001:db8:cafe::17"},
		// A proxy writes one of the two headers and passes the other on
		// as the client sent it: when both name different clients, the
		// one the proxy wrote cannot be told, and the client is the
		// proxy (a client rotating for= escapes no per-IP window).
		{"both headers disagree: the peer", "10.0.0.1:1", map[string][]string{"Forwarded": {"for=192.0.2.60"}, "X-Forwarded-For": {"6.6.6.6"}}, "10.0.0.1"},
		{"a client's Forwarded through a proxy writing X-Forwarded-For", "10.0.0.1:1", map[string][]string{"Forwarded": {"for=6.6.6.7"}, "X-Forwarded-For": {"198.51.100.7"}}, "10.0.0.1"},
		{"a client's X-Forwarded-For through a proxy writing Forwarded", "10.0.0.1:1", map[string][]string{"Forwarded": {"for=198.51.100.7"}, "X-Forwarded-For": {"6.6.6.7"}}, "10.0.0.1"},
		{"both headers agree", "10.0.0.1:1", map[string][]string{"Forwarded": {"for=198.51.100.7"}, "X-Forwarded-For": {"198.51.100.7, 10.1.1.1"}}, "198.51.100.7"},
		{"no header", "10.0.0.1:1", nil, "10.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			for k, vs := range tc.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			if got := resolveClientIP(r, trusted); got != tc.want {
				t.Fatalf("%s, want %s", got, tc.want)
			}
		})
	}
	if got := ipKey("2001:db8:cafe::17"); got != "2001:db8:cafe::/64" {
		t.Fatalf("ipKey of IPv6: %s", got)
	}
}

func TestWholeQuota(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		q, w int64
	}{{20, 20, 1}, {0.5, 1, 2}, {1000.0 / 3600, 5, 18}, {2.5, 5, 2}, {10.0 / 60, 1, 6}, {1e6, 1e6, 1}} {
		if q, w := wholeQuota(tc.rate); q != tc.q || w != tc.w {
			t.Errorf("wholeQuota(%v) = %d;%d, want %d;%d", tc.rate, q, w, tc.q, tc.w)
		}
	}
}

// TestRetryableHTTPClient: a real go-retryablehttp client, on the real
// clock, is paced by the Retry-After of the plan's 429s and gets every job
// in.
func TestRetryableHTTPClient(t *testing.T) {
	keys := []Key{testKey("shop", Scopes{Submit: true})}
	keys[0].Plan = "slow"
	f := newFixture(t, func(cfg *Config) {
		cfg.Auth = Auth{Keys: keys}
		cfg.Callers = &Callers{Limiter: &quota.Memory{}, Lanes: []string{"demo"},
			Policy: CallerPolicy{Plans: map[string]Plan{"slow": {Rate: mustRate(t, "1/s"), Burst: 1}}}}
	})
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	var refused int
	var waits []time.Duration
	last := time.Now()
	c := retryablehttp.NewClient()
	c.Logger = nil
	c.RetryMax = 10
	c.RetryWaitMin, c.RetryWaitMax = 10*time.Millisecond, 5*time.Second
	c.ResponseLogHook = func(_ retryablehttp.Logger, resp *http.Response) {
		if resp.StatusCode == http.StatusTooManyRequests {
			refused++
			if resp.Header.Get("Retry-After") == "" {
				t.Error("429 without Retry-After")
			}
		}
	}
	c.RequestLogHook = func(_ retryablehttp.Logger, _ *http.Request, attempt int) {
		if attempt > 0 {
			waits = append(waits, time.Since(last))
		}
		last = time.Now()
	}
	start := time.Now()
	for i := range 3 {
		req, err := retryablehttp.NewRequest("POST", srv.URL+"/v1/lanes/demo/jobs", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer secret-shop")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("job %d: %v", i+1, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("job %d: %d", i+1, resp.StatusCode)
		}
	}
	took := time.Since(start)
	// Jobs 2 and 3 each waited out a 429's Retry-After of 1 s (and no
	// more than a loaded machine adds).
	if refused < 2 || took < 1900*time.Millisecond || took > 15*time.Second {
		t.Fatalf("%d refusals, %v for 3 jobs at 1/s", refused, took)
	}
	for _, w := range waits {
		if w < 950*time.Millisecond {
			t.Fatalf("a retry came %v after its 429: sooner than Retry-After 1 s", w)
		}
	}
	if f.pub.n.Load() != 3 {
		t.Fatalf("%d stored", f.pub.n.Load())
	}
}

// FuzzClientIP: whatever a trusted proxy's headers say, the client IP is an
// address (never a header's text), and an untrusted peer's is its own.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:1", "198.51.100.7, 10.1.1.1", "")
	f.Add("10.0.0.1:1", "", `for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711"`)
	f.Add("203.0.113.5:1", "1.2.3.4", "for=unknown")
	f.Add("10.0.0.1:1", "::ffff:1.2.3.4,,", "for=_hidden, for=\"[::1\"")
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	f.Fuzz(func(t *testing.T, peer, xff, fwd string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		r.Header.Set("X-Forwarded-For", xff)
		if fwd != "" {
			r.Header.Set("Forwarded", fwd)
		}
		got := resolveClientIP(r, trusted)
		host, _, err := net.SplitHostPort(peer)
		if err != nil {
			host = peer
		}
		pa, perr := netip.ParseAddr(host)
		if perr != nil {
			if got != host {
				t.Fatalf("peer %q is no address, got %q", peer, got)
			}
			return
		}
		if _, err := netip.ParseAddr(got); err != nil {
			t.Fatalf("client IP %q is not an address", got)
		}
		if !trusted[0].Contains(pa.Unmap()) && !trusted[1].Contains(pa.Unmap()) && got != pa.Unmap().String() {
			t.Fatalf("untrusted peer %q answered %q", peer, got)
		}
	})
}

// TestBatchChargesItsJobs: a batch of n jobs costs n tokens of the caller's
// plan (the real jobs:batch route), and one over the plan's burst gets 413.
func TestBatchChargesItsJobs(t *testing.T) {
	c := clock.NewManual(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	f := callerFixture(t, c, nil)
	items := func(n int) string {
		var parts []string
		for i := range n {
			parts = append(parts, fmt.Sprintf(`{"idempotency_key":"b-%d-%d","payload":{"n":%d}}`, n, i, i))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	auth := map[string]string{"Authorization": "Bearer secret-shop"}
	for _, tc := range []struct{ n, want int }{{11, 413}, {6, 202}, {4, 202}, {1, 429}} {
		rec, _, p := postBatch(t, f, "demo", items(tc.n), auth)
		if rec.Code != tc.want {
			t.Fatalf("batch of %d: %d %+v, want %d", tc.n, rec.Code, p, tc.want)
		}
		if tc.want == 202 && policies(t, rec.Header())["plan:free"]["r"] != int64(10-6-map[bool]int{true: 4}[tc.n == 4]) {
			t.Fatalf("batch of %d: plan policy %v", tc.n, policies(t, rec.Header())["plan:free"])
		}
	}
}
