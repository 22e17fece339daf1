package dest_test

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/throttler/throttler/internal/dest"
)

func rules(t testing.TB) *dest.Rules {
	t.Helper()
	r, err := dest.New(dest.Config{
		URL: "https://api.example.com/v1/", Method: "POST", Methods: []string{"GET", "DELETE"},
		ForwardHeaders: []string{"x-api-key", "Accept"},
		JobURLs:        []string{"https://api.example.com/v2/", "http://hooks.example.net:8080/in"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestResolvePath(t *testing.T) {
	t.Parallel()
	r := rules(t)
	for _, tc := range []struct {
		path, want string
	}{
		{"repos/a/b", "https://api.example.com/v1/repos/a/b"},
		{"/repos//a/./b/", "https://api.example.com/v1/repos/a/b"},
		{"issues?state=open&q=a%20b", "https://api.example.com/v1/issues?state=open&q=a%20b"},
		{"users/j%C3%BCrgen", "https://api.example.com/v1/users/j%C3%BCrgen"},
		{"a:b@c", "https://api.example.com/v1/a:b@c"},
		// Sent as written, though Go's own escaping would encode them.
		{"a!b/(c)*'d;e=f", "https://api.example.com/v1/a!b/(c)*'d;e=f"},
		{"x%21y/a!b", "https://api.example.com/v1/x%21y/a!b"},
		{"/", "https://api.example.com/v1"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			res, err := r.Resolve(dest.Request{Path: tc.path}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := res.URL.String(); got != tc.want {
				t.Errorf("URL = %s, want %s", got, tc.want)
			}
			// Path is the decoded form of the escaped path sent.
			if dec, err := url.PathUnescape(res.URL.EscapedPath()); err != nil || dec != res.URL.Path {
				t.Errorf("Path = %q, the escaped path %q decodes to %q (%v)", res.URL.Path, res.URL.EscapedPath(), dec, err)
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	r := rules(t)
	for _, tc := range []struct {
		name  string
		req   dest.Request
		field string
		err   error
	}{
		{"dotdot", dest.Request{Path: "../admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"inner dotdot", dest.Request{Path: "a/../../admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"encoded dots", dest.Request{Path: "%2e%2e/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"upper encoded dots", dest.Request{Path: "%2E%2E/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"encoded slash", dest.Request{Path: "a%2F..%2Fadmin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"double encoding", dest.Request{Path: "%252e%252e/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"backslash", dest.Request{Path: `..\admin`}, dest.HeaderPath, dest.ErrPathEscapes},
		{"encoded backslash", dest.Request{Path: "%5c..%5cadmin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"NUL", dest.Request{Path: "a\x00b"}, dest.HeaderPath, dest.ErrBadPath},
		{"encoded NUL", dest.Request{Path: "a%00b"}, dest.HeaderPath, dest.ErrBadPath},
		{"fragment", dest.Request{Path: "a#b"}, dest.HeaderPath, dest.ErrBadPath},
		{"space", dest.Request{Path: "a b"}, dest.HeaderPath, dest.ErrBadPath},
		{"overlong dots", dest.Request{Path: "%c0%ae%c0%ae/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"bad escape", dest.Request{Path: "a%zz"}, dest.HeaderPath, dest.ErrBadPath},
		// A dot segment with path parameters: Tomcat, Jetty and Spring drop
		// ";…" from a segment before they resolve dot segments.
		{"dotdot params", dest.Request{Path: "..;/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"inner dotdot params", dest.Request{Path: "a/..;x=1/..;/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"dot params", dest.Request{Path: ".;/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"dotdot encoded params", dest.Request{Path: "..%3b/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"encoded semicolon", dest.Request{Path: "a%3Bb"}, dest.HeaderPath, dest.ErrPathEscapes},
		// Characters a Unicode normalisation (NFKC) or a Windows best-fit
		// mapping turns into '.', '/', '\', ';' or '%'.
		{"fullwidth dots", dest.Request{Path: "%ef%bc%8e%ef%bc%8e/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"one dot leader", dest.Request{Path: "%e2%80%a4%e2%80%a4/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"two dot leader", dest.Request{Path: "%e2%80%a5/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"small full stop", dest.Request{Path: "%ef%b9%92%ef%b9%92/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"ideographic full stop", dest.Request{Path: "%e3%80%82%e3%80%82/admin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"fullwidth slash", dest.Request{Path: "a%ef%bc%8f..%ef%bc%8fadmin"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"division slash", dest.Request{Path: "a%e2%88%95b"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"fullwidth backslash", dest.Request{Path: "a%ef%bc%bcb"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"fullwidth percent", dest.Request{Path: "a%ef%bc%852e"}, dest.HeaderPath, dest.ErrPathEscapes},
		{"url dotdot params", dest.Request{URL: "https://api.example.com/v2/..;/admin"}, dest.HeaderURL, dest.ErrPathEscapes},
		{"url fullwidth dots", dest.Request{URL: "https://api.example.com/v2/%ef%bc%8e%ef%bc%8e/admin"}, dest.HeaderURL, dest.ErrPathEscapes},
		{"query control", dest.Request{Path: "a?x=%0d%0aHost:evil"}, dest.HeaderPath, dest.ErrBadPath},
		{"too long", dest.Request{Path: strings.Repeat("a", dest.MaxPath+1)}, dest.HeaderPath, dest.ErrBadPath},
		{"method", dest.Request{Method: "PUT"}, dest.HeaderMethod, dest.ErrMethodNotAllowed},
		{"method lower", dest.Request{Method: "get"}, dest.HeaderMethod, dest.ErrMethodNotAllowed},
		{"header not listed", dest.Request{Headers: map[string]string{"Authorization": "x"}}, "Throttle-Forward-Authorization", dest.ErrHeaderNotAllowed},
		{"header never", dest.Request{Headers: map[string]string{"Host": "x"}}, "Throttle-Forward-Host", dest.ErrHeaderNotAllowed},
		{"header value", dest.Request{Headers: map[string]string{"X-Api-Key": "a\r\nb"}}, "Throttle-Forward-X-Api-Key", dest.ErrBadHeaderValue},
		{"url outside", dest.Request{URL: "https://api.example.com/v3/x"}, dest.HeaderURL, dest.ErrURLNotAllowed},
		{"url segment boundary", dest.Request{URL: "https://api.example.com/v2evil"}, dest.HeaderURL, dest.ErrURLNotAllowed},
		{"url host suffix", dest.Request{URL: "https://api.example.com.evil.net/v2/"}, dest.HeaderURL, dest.ErrURLNotAllowed},
		{"url userinfo", dest.Request{URL: "https://api.example.com@evil.net/v2/"}, dest.HeaderURL, dest.ErrBadPath},
		{"url userinfo kept", dest.Request{URL: "https://u:p@api.example.com/v2/"}, dest.HeaderURL, dest.ErrBadPath},
		{"url scheme", dest.Request{URL: "http://api.example.com/v2/x"}, dest.HeaderURL, dest.ErrURLNotAllowed},
		{"url port", dest.Request{URL: "https://api.example.com:8443/v2/x"}, dest.HeaderURL, dest.ErrURLNotAllowed},
		{"url dotdot", dest.Request{URL: "https://api.example.com/v2/../admin"}, dest.HeaderURL, dest.ErrPathEscapes},
		{"url encoded dotdot", dest.Request{URL: "https://api.example.com/v2/%2e%2e/admin"}, dest.HeaderURL, dest.ErrPathEscapes},
		{"url backslash", dest.Request{URL: `https://api.example.com\@evil.net/v2/`}, dest.HeaderURL, dest.ErrBadPath},
		{"url fragment", dest.Request{URL: "https://api.example.com/v2/#x"}, dest.HeaderURL, dest.ErrBadPath},
		{"url scheme file", dest.Request{URL: "file:///etc/passwd"}, dest.HeaderURL, dest.ErrBadPath},
		{"url trailing dot host", dest.Request{URL: "https://api.example.com./v2/x"}, dest.HeaderURL, dest.ErrBadPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Resolve(tc.req, nil)
			var de *dest.Error
			if !errors.As(err, &de) || !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want a *dest.Error with %v", err, tc.err)
			}
			if de.Field != tc.field {
				t.Errorf("Field = %q, want %q", de.Field, tc.field)
			}
			if v, ok := tc.req.Headers["X-Api-Key"]; ok && strings.Contains(err.Error(), v) {
				t.Errorf("the error %q holds the header's value", err)
			}
		})
	}
}

// TestPathRefusalsSayWhat: a path that could leave the base path is
// refused naming what in it would: the caller learns which segment or
// byte to change.
func TestPathRefusalsSayWhat(t *testing.T) {
	t.Parallel()
	r := rules(t)
	for _, tc := range []struct {
		req  dest.Request
		want string
	}{
		{dest.Request{Path: "a/../../admin"}, "Throttle-Path: the path could leave the lane's base path: it has a .. segment"},
		{dest.Request{Path: "a%2F..%2Fadmin"}, `it has an encoded '/'`},
		{dest.Request{Path: `..\admin`}, "it has a backslash"},
		{dest.Request{Path: "..;/admin"}, "it has a dot segment with path parameters"},
		{dest.Request{Path: "%e2%80%a5/admin"}, "it has an encoded U+2025"},
		{dest.Request{URL: "https://api.example.com/v2/../admin"}, "Throttle-URL: the path could leave the lane's base path: the URL's path has a .. segment"},
	} {
		_, err := r.Resolve(tc.req, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want it to say %q", tc.req, err, tc.want)
		}
	}
}

func TestResolveURLAndHeaders(t *testing.T) {
	t.Parallel()
	r := rules(t)
	for _, tc := range []struct{ in, want string }{
		{"https://API.example.com:443/v2/hooks/1", "https://api.example.com:443/v2/hooks/1"},
		{"https://api.example.com/v2", "https://api.example.com/v2"},
		{"http://hooks.example.net:8080/in/a?x=1", "http://hooks.example.net:8080/in/a?x=1"},
	} {
		res, err := r.Resolve(dest.Request{URL: tc.in, Method: "DELETE", Headers: map[string]string{"x-api-key": "s3cret"}}, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if res.URL.String() != tc.want || res.Method != "DELETE" || res.Header.Get("X-Api-Key") != "s3cret" {
			t.Errorf("%s: got %s %s %v", tc.in, res.Method, res.URL, res.Header)
		}
	}
	// A path goes under the job's URL.
	res, err := r.Resolve(dest.Request{URL: "https://api.example.com/v2/a", Path: "b?c=d"}, nil)
	if err != nil || res.URL.String() != "https://api.example.com/v2/a/b?c=d" {
		t.Errorf("URL and path: %v %v", res.URL, err)
	}
	// A key's URL replaces the base; a job's own URL wins over it.
	key, _ := url.Parse("https://api.example.com/v2/key7")
	if res, _ := r.Resolve(dest.Request{}, key); res.URL.String() != key.String() || res.Method != "POST" {
		t.Errorf("key URL: %v %s", res.URL, res.Method)
	}
	if res, _ := r.Resolve(dest.Request{Path: "x"}, key); res.URL.String() != "https://api.example.com/v2/key7/x" {
		t.Errorf("key URL and path: %v", res.URL)
	}
	if res, _ := r.Resolve(dest.Request{URL: "https://api.example.com/v2/own"}, key); res.URL.String() != "https://api.example.com/v2/own" {
		t.Errorf("own URL over key URL: %v", res.URL)
	}
	// Nothing asked: the target as configured.
	if res, err := r.Resolve(dest.Request{}, nil); err != nil || res.URL != nil || res.Header != nil || res.Method != "POST" {
		t.Errorf("zero request: %+v %v", res, err)
	}
}

func TestNewRefusesLists(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   dest.Config
		field string
	}{
		{dest.Config{URL: "https://a.example/", Methods: []string{"TRACE"}}, "methods[0]"},
		{dest.Config{URL: "https://a.example/", ForwardHeaders: []string{"Accept", "Connection"}}, "forward_headers[1]"},
		{dest.Config{URL: "https://a.example/", ForwardHeaders: []string{"Idempotency-Key"}}, "forward_headers[0]"},
		{dest.Config{URL: "https://a.example/", ForwardHeaders: []string{"Webhook-Signature"}}, "forward_headers[0]"},
		{dest.Config{URL: "https://a.example/", ForwardHeaders: []string{"Throttle-Key"}}, "forward_headers[0]"},
		{dest.Config{URL: "https://a.example/", ForwardHeaders: []string{"Content-Length"}}, "forward_headers[0]"},
		{dest.Config{URL: "https://a.example/", ForwardHeaders: []string{"bad name"}}, "forward_headers[0]"},
		{dest.Config{URL: "https://a.example/", JobURLs: []string{"ftp://a.example/"}}, "job_urls[0]"},
		{dest.Config{URL: "https://a.example/", JobURLs: []string{"https://u@a.example/"}}, "job_urls[0]"},
		{dest.Config{URL: "https://a.example/", JobURLs: []string{"https://a.example/x?y=1"}}, "job_urls[0]"},
		{dest.Config{URL: "https://a.example/", JobURLs: []string{"https://a.example/../x"}}, "job_urls[0]"},
	} {
		_, err := dest.New(tc.cfg)
		var fe *dest.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%+v: err = %v, want one naming %s", tc.cfg, err, tc.field)
		}
	}
}

// TestResolveIntoHeaders: what a delivery runs writes the same headers as
// Resolve, keeps the key's headers it does not replace, and is
// deterministic where a map's order is not: the first refusal in name
// order is named, and of two spellings of one header the last in name
// order is sent.
func TestResolveIntoHeaders(t *testing.T) {
	t.Parallel()
	r := rules(t)
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    map[string]string // nil: refused
		field   string
	}{
		{"canonical", map[string]string{"X-Api-Key": "k", "Accept": "a/b"}, map[string]string{"X-Api-Key": "k", "Accept": "a/b"}, ""},
		{"other case", map[string]string{"x-api-key": "k"}, map[string]string{"X-Api-Key": "k"}, ""},
		{"two spellings", map[string]string{"x-api-key": "low", "X-Api-Key": "canon", "X-API-KEY": "up"}, map[string]string{"X-Api-Key": "low"}, ""},
		{"first refusal named", map[string]string{"Accept": "a", "X-Zzz": "z", "X-Aaa": "a", "X-Api-Key": "k"}, nil, dest.ForwardPrefix + "X-Aaa"},
		{"control byte", map[string]string{"Accept": "a\r\nX-Evil: 1", "X-Api-Key": "k"}, nil, dest.ForwardPrefix + "Accept"},
		{"never forwarded", map[string]string{"Host": "h", "X-Api-Key": "k"}, nil, dest.ForwardPrefix + "Host"},
		{"too large", map[string]string{"Accept": strings.Repeat("a", dest.MaxHeaderBytes)}, nil, dest.ForwardPrefix + "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 { // map order changes from one range to the next
				h := http.Header{"X-Api-Key": {"from the key"}, "X-Key-Only": {"kept"}}
				_, _, err := r.ResolveInto(dest.Request{Path: "a", Headers: tc.headers}, nil, h)
				res, rerr := r.Resolve(dest.Request{Path: "a", Headers: tc.headers}, nil)
				if tc.want == nil {
					var de *dest.Error
					if !errors.As(err, &de) || de.Field != tc.field || rerr == nil || rerr.Error() != err.Error() {
						t.Fatalf("err = %v, Resolve %v; want a refusal of %s", err, rerr, tc.field)
					}
					continue
				}
				if err != nil || rerr != nil {
					t.Fatalf("ResolveInto: %v, Resolve: %v", err, rerr)
				}
				for k, v := range tc.want {
					if got := h[k]; len(got) != 1 || got[0] != v {
						t.Fatalf("%s = %q, want %q (header %v)", k, got, v, h)
					}
					if got := res.Header[k]; len(got) != 1 || got[0] != v {
						t.Fatalf("Resolve: %s = %q, want %q", k, got, v)
					}
				}
				if len(res.Header) != len(tc.want) || h.Get("X-Key-Only") != "kept" || len(h) != len(tc.want)+1+boolInt(tc.want["X-Api-Key"] == "") {
					t.Fatalf("headers: %v, Resolve: %v", h, res.Header)
				}
			}
		})
	}
	if _, _, err := r.ResolveInto(dest.Request{Headers: map[string]string{"Accept": "a"}}, nil, nil); err == nil {
		t.Error("ResolveInto with headers and a nil header: no error")
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestKeyOf: a url_host lane's key is the URL's host, lower case, with the
// port only when it is not the scheme's default; a URL the prefixes refuse
// gives no key, and the refusal names Throttle-URL.
func TestKeyOf(t *testing.T) {
	t.Parallel()
	r, err := dest.New(dest.Config{URL: "https://api.example.com/", JobURLs: []string{
		"https://api.example.com/v2/", "http://hooks.example.net:8080/in", "https://xn--bcher-kva.example/", "http://api.example.com/"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ url, key string }{
		{"https://api.example.com/v2/x", "api.example.com"},
		{"https://API.Example.COM/v2/x", "api.example.com"},
		{"https://api.example.com:443/v2/x?a=1", "api.example.com"},
		{"http://api.example.com:80/any", "api.example.com"},
		{"http://hooks.example.net:8080/in/a", "hooks.example.net:8080"},
		{"https://xn--bcher-kva.example/", "xn--bcher-kva.example"},
	} {
		got, err := r.KeyOf(tc.url)
		if err != nil || got != tc.key {
			t.Errorf("KeyOf(%q) = %q, %v; want %q", tc.url, got, err, tc.key)
		}
	}
	for _, bad := range []string{
		"https://other.example.com/v2/x",     // under no prefix
		"https://api.example.com:8443/v2/x",  // another port
		"http://hooks.example.net/in/a",      // the default port is another port
		"https://bücher.example/",            // non-ASCII: only the xn-- form
		"https://api.example.com/v2/../v1/x", // a dot segment
		"https://user@api.example.com/v2/x",  // user info
	} {
		_, err := r.KeyOf(bad)
		var de *dest.Error
		if !errors.As(err, &de) || de.Field != dest.HeaderURL {
			t.Errorf("KeyOf(%q) = %v; want an *Error naming %s", bad, err, dest.HeaderURL)
		}
	}
	for _, tc := range []struct{ url, key string }{
		{"https://Hooks.Example.com:8443/in", "hooks.example.com:8443"},
		{"http://127.0.0.1:80/", "127.0.0.1"},
		{"http://[::1]:9000/", "[::1]:9000"},
	} {
		if got, err := dest.HostKey(tc.url); err != nil || got != tc.key {
			t.Errorf("HostKey(%q) = %q, %v; want %q", tc.url, got, err, tc.key)
		}
	}
}
