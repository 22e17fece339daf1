package dest_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/throttler/throttler/internal/dest"
)

// FuzzPathStaysUnderBase: no accepted Throttle-Path resolves outside the
// base's path, however the target decodes it (once, twice) or cleans it.
func FuzzPathStaysUnderBase(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "%2e%2e/x", "%252e%252e", `a\..\b`, "a/%2F/b", "a?b=../c", "./.", "a%00", "..;/x", "%c0%ae%c0%ae/x", ".%2e/x", "a/..%2f"} {
		f.Add(s)
	}
	r, err := dest.New(dest.Config{URL: "https://api.example.com/v1/base", JobURLs: []string{"https://api.example.com/v2/"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if p == "" {
			return // asks for nothing: the base as configured
		}
		res, err := r.Resolve(dest.Request{Path: p}, nil)
		if err != nil {
			return
		}
		under(t, res.URL, "/v1/base")
		res, err = r.Resolve(dest.Request{URL: "https://api.example.com/v2/" + p}, nil)
		if err == nil {
			under(t, res.URL, "/v2")
		}
		if res, err = r.Resolve(dest.Request{URL: p}, nil); err == nil {
			under(t, res.URL, "/v2")
			if res.URL.Hostname() != "api.example.com" || res.URL.Scheme != "https" || res.URL.User != nil {
				t.Fatalf("%q: URL %s outside the prefix", p, res.URL)
			}
		}
	})
}

func under(t *testing.T, u *url.URL, base string) {
	t.Helper()
	esc := u.EscapedPath()
	for _, p := range []string{esc, u.Path, unescape(u.Path)} {
		if p != base && !strings.HasPrefix(p, base+"/") {
			t.Fatalf("%s: path %q is not under %s", u, p, base)
		}
		for _, seg := range strings.Split(strings.ReplaceAll(p, `\`, "/"), "/") {
			if seg == ".." || seg == "." {
				t.Fatalf("%s: path %q has a dot segment", u, p)
			}
		}
		if strings.ContainsAny(p, "\x00\\") {
			t.Fatalf("%s: path %q has a NUL or backslash", u, p)
		}
	}
}

func unescape(s string) string {
	if d, err := url.PathUnescape(s); err == nil {
		return d
	}
	return s
}
