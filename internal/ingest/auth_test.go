package ingest

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/throttler/throttler/api"
)

// do sends one request through the handler; secret "" sends no
// Authorization header.
func do(h http.Handler, method, target, secret, body string, hdr map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Host = "localhost:8080"
	if secret != "" {
		r.Header.Set("Authorization", "Bearer "+secret)
	}
	for k, v := range hdr {
		if k == "Host" {
			r.Host = v
			continue
		}
		r.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field"`
}

func readProblem(t *testing.T, rec *httptest.ResponseRecorder) problemBody {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d with Content-Type %q: %s", rec.Code, ct, rec.Body)
	}
	var p problemBody
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body, err)
	}
	if p.Status != rec.Code {
		t.Fatalf("problem status %d, response %d", p.Status, rec.Code)
	}
	return p
}

// routes are every route of the API with what it needs and what it
// answers when allowed.
var routes = []struct {
	method, path, body string
	need               need
	ok                 int
}{
	{"POST", "/v1/lanes/demo/jobs", "{}", needSubmit, 202},
	{"GET", "/v1/lanes", "", needRead, 200},
	{"PATCH", "/v1/lanes/demo", `{"rate":5}`, needAdmin, 200},
	{"GET", "/v1/lanes/demo/dead", "", needRead, 200},
	{"GET", "/v1/lanes/demo/dead/1", "", needAdmin, 200},
	{"POST", "/v1/lanes/demo/dead/1/replay", "", needAdmin, 200},
	{"POST", "/v1/lanes/demo/dead/replay", "", needAdmin, 200},
	{"DELETE", "/v1/lanes/demo/dead/1", "", needAdmin, 204},
	{"DELETE", "/v1/lanes/demo/dead", "", needAdmin, 204},
	{"GET", "/metrics", "", needRead, 200},
	{"GET", "/healthz", "", needNothing, 200},
	{"GET", "/readyz", "", needNothing, 200},
	{"GET", "/v1/whoami", "", needKey, 200},
	// The status page's files hold no data.
	{"GET", "/ui/", "", needNothing, 200},
	{"GET", "/ui/app.js", "", needNothing, 200},
}

// TestRouteScopes: every route × every kind of caller. No key or an
// unknown one: 401; a key without the scope: 403; else the route runs.
func TestRouteScopes(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Auth.Keys = tableKeys })
	callers := []struct {
		name, secret string
		may          func(need) bool
	}{
		{"none", "", func(n need) bool { return n == needNothing }},
		{"unknown", "secret-nobody", func(n need) bool { return n == needNothing }},
		{"admin", "secret-admin", func(need) bool { return true }},
		{"read", "secret-read", func(n need) bool { return n == needNothing || n == needKey || n == needRead }},
		{"submit", "secret-submit", func(n need) bool { return n == needNothing || n == needKey || n == needSubmit }},
		{"submit-demo", "secret-submit-demo", func(n need) bool { return n == needNothing || n == needKey || n == needSubmit }},
		{"submit-other", "secret-submit-other", func(n need) bool { return n == needNothing || n == needKey }},
	}
	for _, rt := range routes {
		for _, c := range callers {
			t.Run(rt.method+" "+rt.path+" as "+c.name, func(t *testing.T) {
				rec := do(f.h, rt.method, rt.path, c.secret, rt.body, nil)
				switch {
				case c.may(rt.need):
					if rec.Code != rt.ok {
						t.Fatalf("status %d, want %d: %s", rec.Code, rt.ok, rec.Body)
					}
				case c.secret == "" || c.name == "unknown":
					p := readProblem(t, rec)
					if rec.Code != 401 || p.Type != ProblemUnauthorized || p.Field != "Authorization" ||
						!strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Bearer") {
						t.Fatalf("status %d %+v WWW-Authenticate %q, want 401 naming Authorization",
							rec.Code, p, rec.Header().Get("WWW-Authenticate"))
					}
				default:
					p := readProblem(t, rec)
					if rec.Code != 403 || p.Type != ProblemForbidden || p.Field != "Authorization" || !strings.Contains(p.Detail, c.name) {
						t.Fatalf("status %d %+v, want 403 naming Authorization and the key", rec.Code, p)
					}
				}
			})
		}
	}
}

// TestRefusedReachesNothing reproduces what anyone who reached the port
// could do (PATCH a lane, read a dead letter's payload, delete and purge
// dead letters): with keys, the same requests without a key, or with a
// read key, change and reveal nothing.
func TestRefusedReachesNothing(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Auth.Keys = tableKeys })
	for _, secret := range []string{"", "secret-read", "secret-submit"} {
		if rec := do(f.h, "PATCH", "/v1/lanes/demo", "", `{"rate":1000000}`, nil); rec.Code != 401 {
			t.Fatalf("PATCH: %d", rec.Code)
		}
		for _, rt := range routes {
			if rt.need != needAdmin {
				continue
			}
			rec := do(f.h, rt.method, rt.path, secret, rt.body, nil)
			if rec.Code != 401 && rec.Code != 403 || strings.Contains(rec.Body.String(), "secret payload") {
				t.Fatalf("%s %s with %q: %d %s", rt.method, rt.path, secret, rec.Code, rec.Body)
			}
		}
	}
	if n := f.dir.setLimit.Load(); n != 0 {
		t.Fatalf("SetLimit called %d times", n)
	}
	if n := f.dead.total(); n != 0 {
		t.Fatalf("dead-letter store called %d times: %v", n, f.dead.calls)
	}
	// The listing (read) shows no payload.
	rec := do(f.h, "GET", "/v1/lanes/demo/dead", "secret-read", "", nil)
	if rec.Code != 200 || strings.Contains(rec.Body.String(), "payload") {
		t.Fatalf("listing: %d %s", rec.Code, rec.Body)
	}
}

// TestAnonymousIsOpen: without keys every route is open (the service
// allows that on loopback or with auth.anonymous).
func TestAnonymousIsOpen(t *testing.T) {
	f := newFixture(t, nil)
	for _, rt := range routes {
		if rec := do(f.h, rt.method, rt.path, "", rt.body, nil); rec.Code != rt.ok {
			t.Errorf("%s %s: %d %s", rt.method, rt.path, rec.Code, rec.Body)
		}
	}
}

func TestPublicMetrics(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Auth.Keys = tableKeys; c.Auth.PublicMetrics = true })
	if rec := do(f.h, "GET", "/metrics", "", "", nil); rec.Code != 200 {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	if rec := do(f.h, "GET", "/v1/lanes", "", "", nil); rec.Code != 401 {
		t.Fatalf("/v1/lanes: %d", rec.Code)
	}
}

func TestBearerForms(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Auth.Keys = tableKeys })
	for _, tc := range []struct {
		auth string
		code int
		www  string
	}{
		{"Bearer secret-read", 200, ""},
		{"bearer secret-read", 200, ""},
		{"Bearer   secret-read", 200, ""},
		{"Basic c2VjcmV0LXJlYWQ=", 401, `Bearer realm="throttler"`},
		{"Bearer ", 401, `Bearer realm="throttler"`},
		{"Bearer secret-reads", 401, `Bearer realm="throttler", error="invalid_token"`},
		{"secret-read", 401, `Bearer realm="throttler"`},
	} {
		r := httptest.NewRequest("GET", "/v1/lanes", nil)
		r.Header.Set("Authorization", tc.auth)
		rec := httptest.NewRecorder()
		f.h.ServeHTTP(rec, r)
		if rec.Code != tc.code || rec.Header().Get("WWW-Authenticate") != tc.www {
			t.Errorf("%q: %d %q, want %d %q", tc.auth, rec.Code, rec.Header().Get("WWW-Authenticate"), tc.code, tc.www)
		}
	}
}

// TestKeyCompareIsConstantTime: the presented secret's digest is compared
// with every key, whichever matches (first, last, none), so the time does
// not tell which key matched.
func TestKeyCompareIsConstantTime(t *testing.T) {
	var compared int
	orig := compareDigest
	compareDigest = func(a, b []byte) int { compared++; return orig(a, b) }
	t.Cleanup(func() { compareDigest = orig })

	set := &keySet{keys: tableKeys}
	for _, tc := range []struct{ secret, want string }{
		{"secret-admin", "admin"},
		{"secret-submit-other", "submit-other"},
		{"secret-read", "read"},
		{"nobody", ""},
		{"", ""},
	} {
		compared = 0
		k := set.match(tc.secret)
		got := ""
		if k != nil {
			got = k.ID
		}
		if got != tc.want || compared != 2*len(tableKeys) {
			t.Errorf("match(%q) = %q after %d comparisons; want %q after %d", tc.secret, got, compared, tc.want, 2*len(tableKeys))
		}
	}
}

// TestKeyHashedWithNewline: the documented recipe, openssl rand -hex 32 |
// tee secret | sha256sum, hashes the secret and its newline; the client
// sends the secret alone ($(cat secret)).
func TestKeyHashedWithNewline(t *testing.T) {
	secret := "3f1c0e4b9a7d2e6f8a1b3c5d7e9f0a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e1f"
	set := &keySet{keys: []Key{{ID: "line", SHA256: sha256.Sum256([]byte(secret + "\n"))}}}
	if k := set.match(secret); k == nil || k.ID != "line" {
		t.Fatalf("match = %v", k)
	}
	if k := set.match(secret + "x"); k != nil {
		t.Fatalf("another secret matched %s", k.ID)
	}
}

// TestSetKeys swaps the keys at once; an empty list, or keys for an API
// started without them, are refused and change nothing.
func TestSetKeys(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Auth.Keys = tableKeys })
	newKey := testKey("new", Scopes{Read: true})
	if err := f.h.SetKeys([]Key{newKey}); err != nil {
		t.Fatal(err)
	}
	if rec := do(f.h, "GET", "/v1/lanes", "secret-new", "", nil); rec.Code != 200 {
		t.Fatalf("new key: %d", rec.Code)
	}
	if rec := do(f.h, "GET", "/v1/lanes", "secret-read", "", nil); rec.Code != 401 {
		t.Fatalf("old key: %d", rec.Code)
	}
	if err := f.h.SetKeys(nil); !errors.Is(err, ErrNoKeys) {
		t.Fatalf("SetKeys(nil) = %v", err)
	}
	if rec := do(f.h, "GET", "/v1/lanes", "secret-new", "", nil); rec.Code != 200 {
		t.Fatalf("after a refused SetKeys: %d", rec.Code)
	}
	open := newFixture(t, nil)
	if err := open.h.SetKeys([]Key{newKey}); !errors.Is(err, ErrAnonymous) {
		t.Fatalf("SetKeys on an open API = %v", err)
	}
}

// TestHostCheck reproduces DNS rebinding against the loopback default: a
// page on rebind.attacker.example whose name now resolves to 127.0.0.1
// sends Host: rebind.attacker.example. Without keys only loopback names and
// auth.hosts are answered; with keys and auth.hosts, only auth.hosts.
func TestHostCheck(t *testing.T) {
	anon := newFixture(t, func(c *Config) { c.Auth.Hosts = []string{"throttler.internal", "api.example:8443"} })
	keyed := newFixture(t, func(c *Config) { c.Auth.Keys = tableKeys })
	keyedHosts := newFixture(t, func(c *Config) { c.Auth.Keys = tableKeys; c.Auth.Hosts = []string{"api.example"} })
	for _, tc := range []struct {
		name string
		h    *Handler
		host string
		ok   bool
	}{
		{"AnonRebind", anon.h, "rebind.attacker.example:8080", false},
		{"AnonRebindNoPort", anon.h, "rebind.attacker.example", false},
		{"AnonLocalhost", anon.h, "localhost:8080", true},
		{"AnonLocalhostUpper", anon.h, "LOCALHOST:8080", true},
		{"AnonLoopback4", anon.h, "127.0.0.1:8080", true},
		{"AnonLoopback4Other", anon.h, "127.1.2.3", true},
		{"AnonLoopback6", anon.h, "[::1]:8080", true},
		{"AnonLANAddress", anon.h, "192.168.1.10:8080", false},
		{"AnonListed", anon.h, "throttler.internal:8080", true},
		{"AnonListedPort", anon.h, "api.example:8443", true},
		{"AnonListedWrongPort", anon.h, "api.example:8080", false},
		{"AnonEmpty", anon.h, "", false},
		{"AnonLocalhostSuffix", anon.h, "localhost.attacker.example", false},
		{"KeyedAnyHost", keyed.h, "rebind.attacker.example", true},
		{"KeyedHostsListed", keyedHosts.h, "API.example:443", true},
		{"KeyedHostsOther", keyedHosts.h, "localhost:8080", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := do(tc.h, "GET", "/v1/lanes", "secret-admin", "", map[string]string{"Host": tc.host})
			if tc.ok {
				if rec.Code != 200 {
					t.Fatalf("Host %q: %d %s", tc.host, rec.Code, rec.Body)
				}
				return
			}
			p := readProblem(t, rec)
			if rec.Code != http.StatusMisdirectedRequest || p.Type != ProblemUnknownHost || p.Field != "Host" {
				t.Fatalf("Host %q: %d %+v, want 421 naming Host", tc.host, rec.Code, p)
			}
			// Probes address the pod by IP: health stays open.
			if rec := do(tc.h, "GET", "/healthz", "", "", map[string]string{"Host": tc.host}); rec.Code != 200 {
				t.Fatalf("/healthz with Host %q: %d", tc.host, rec.Code)
			}
		})
	}
	if !strings.Contains(anon.logs.String(), `"reason":"unknown_host"`) {
		t.Fatalf("no log of the refused Host:\n%s", anon.logs)
	}
}

// TestCrossSite reproduces a cross-site page's "simple" request (no CORS
// preflight): POST …/dead/replay with Content-Type text/plain. Every
// state-changing request that a browser marks as coming from another site
// is refused 403 naming Origin, with or without keys, and reaches nothing;
// requests from the same origin and from non-browser clients pass.
func TestCrossSite(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		f := newFixture(t, func(c *Config) {
			if keyed {
				c.Auth.Keys = tableKeys
			}
		})
		for _, tc := range []struct {
			name string
			hdr  map[string]string
			ok   bool
		}{
			{"CrossSiteOrigin", map[string]string{"Origin": "https://evil.example"}, false},
			{"FetchCrossSite", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, false},
			{"FetchSameSite", map[string]string{"Sec-Fetch-Site": "same-site"}, false},
			{"NullOrigin", map[string]string{"Origin": "null"}, false},
			{"OtherPort", map[string]string{"Origin": "http://localhost:3000"}, false},
			{"SameHostPortOtherScheme", map[string]string{"Origin": "https://localhost:8080"}, true},
			{"SameOrigin", map[string]string{"Origin": "http://localhost:8080", "Sec-Fetch-Site": "same-origin"}, true},
			{"SameOriginCase", map[string]string{"Origin": "http://LocalHost:8080"}, true},
			{"UserTyped", map[string]string{"Sec-Fetch-Site": "none"}, true},
			{"Curl", nil, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := f.dead.count("replay_all")
				hdr := map[string]string{"Content-Type": "text/plain"}
				for k, v := range tc.hdr {
					hdr[k] = v
				}
				rec := do(f.h, "POST", "/v1/lanes/demo/dead/replay", "secret-admin", "x", hdr)
				after := f.dead.count("replay_all")
				if tc.ok {
					if rec.Code != 200 || after != before+1 {
						t.Fatalf("%d %s", rec.Code, rec.Body)
					}
					return
				}
				p := readProblem(t, rec)
				if rec.Code != 403 || p.Type != ProblemCrossSite || p.Field != "Origin" || after != before {
					t.Fatalf("%d %+v, replays %d → %d; want 403 naming Origin and no replay", rec.Code, p, before, after)
				}
			})
		}
		// Reading is not state-changing: a cross-site GET is answered
		// (a browser keeps the answer from the page without CORS).
		if rec := do(f.h, "GET", "/v1/lanes", "secret-read", "", map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}); rec.Code != 200 {
			t.Fatalf("cross-site GET: %d", rec.Code)
		}
	}
}

// TestAudit: every admin action is logged with the key id, the client IP,
// the lane and what changed; every auth refusal with caller, route and
// reason.
func TestAudit(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Auth.Keys = tableKeys })
	for _, rt := range routes {
		if rt.need == needAdmin && rt.method != "GET" {
			if rec := do(f.h, rt.method, rt.path, "secret-admin", rt.body, nil); rec.Code != rt.ok {
				t.Fatalf("%s %s: %d", rt.method, rt.path, rec.Code)
			}
		}
	}
	do(f.h, "PATCH", "/v1/lanes/demo", "secret-read", `{"rate":5}`, nil)
	do(f.h, "DELETE", "/v1/lanes/demo/dead", "", "", nil)
	logs := f.logs.String()
	for _, want := range []string{
		`"msg":"lane limit changed","audit":"set_limit","caller":"admin","ip":"192.0.2.1","lane":"demo","old_rate":20,"old_burst":10,"rate":5,"burst":10`,
		`"msg":"dead letter replayed","audit":"replay","caller":"admin","ip":"192.0.2.1","lane":"demo","seq":1`,
		`"msg":"dead letters replayed","audit":"replay_all","caller":"admin"`,
		`"msg":"dead letter deleted","audit":"delete","caller":"admin","ip":"192.0.2.1","lane":"demo","seq":1`,
		`"msg":"dead letters purged","audit":"purge","caller":"admin","ip":"192.0.2.1","lane":"demo"`,
		`"msg":"request refused","caller":"read","ip":"192.0.2.1","route":"PATCH /v1/lanes/{lane}","status":403,"field":"Authorization","reason":"missing_scope"`,
		`"msg":"request refused","caller":"anonymous","ip":"192.0.2.1","route":"DELETE /v1/lanes/{lane}/dead","status":401,"field":"Authorization","reason":"no Authorization header`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s", want)
		}
	}
	if t.Failed() {
		t.Log(logs)
	}
	// Anonymous admin actions name the caller anonymous, with the IP.
	open := newFixture(t, nil)
	do(open.h, "DELETE", "/v1/lanes/demo/dead", "", "", nil)
	if !strings.Contains(open.logs.String(), `"audit":"purge","caller":"anonymous","ip":"192.0.2.1"`) {
		t.Fatalf("anonymous audit:\n%s", open.logs)
	}
}

func TestScopesAllow(t *testing.T) {
	s := Scopes{SubmitLanes: []string{"demo"}}
	if !s.allow(needSubmit, "demo") || s.allow(needSubmit, "other") || s.allow(needRead, "") {
		t.Fatal("submit:demo")
	}
	if a := (Scopes{Admin: true}); !a.allow(needRead, "") || !a.allow(needSubmit, "x") || !a.allow(needAdmin, "") {
		t.Fatal("admin implies read and submit")
	}
}

// TestWhoami: GET /v1/whoami names the caller's key and its scopes (the
// status page shows admin controls by it); without keys the caller is
// anonymous and may do everything.
func TestWhoami(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Auth.Keys = tableKeys })
	cases := []struct {
		secret string
		want   api.Whoami
	}{
		{"secret-admin", api.Whoami{Key: "admin", Admin: true, Read: true, Submit: true}},
		{"secret-read", api.Whoami{Key: "read", Read: true}},
		{"secret-submit-demo", api.Whoami{Key: "submit-demo", SubmitLanes: []string{"demo"}}},
	}
	for _, c := range cases {
		rec := do(f.h, "GET", "/v1/whoami", c.secret, "", nil)
		var got api.Whoami
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &got) != nil || !reflect.DeepEqual(got, c.want) {
			t.Fatalf("%s: %d %s, want %+v", c.secret, rec.Code, rec.Body, c.want)
		}
		if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
			t.Fatalf("Cache-Control %q", cc)
		}
	}
	open := newFixture(t, nil)
	rec := do(open.h, "GET", "/v1/whoami", "", "", nil)
	var got api.Whoami
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &got) != nil || !reflect.DeepEqual(got, api.Whoami{Anonymous: true, Admin: true, Read: true, Submit: true}) {
		t.Fatalf("anonymous: %d %s", rec.Code, rec.Body)
	}
}
