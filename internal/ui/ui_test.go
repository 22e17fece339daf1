package ui

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func get(t *testing.T, path string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest("GET", path, nil)
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, r)
	return rec
}

// TestFilesAndHeaders: every file is served with its type, the strict CSP
// and the no-framing headers; /ui redirects to /ui/ (relative, for proxies
// with a path prefix); an unknown file is 404; an unchanged file is 304.
func TestFilesAndHeaders(t *testing.T) {
	want := map[string]string{
		"/ui/":          "text/html; charset=utf-8",
		"/ui/app.js":    "text/javascript; charset=utf-8",
		"/ui/app.css":   "text/css; charset=utf-8",
		"/ui/icon.svg":  "image/svg+xml",
		"/ui/nope.html": "text/plain; charset=utf-8",
		"/ui":           "",
	}
	for path, ct := range want {
		rec := get(t, path, nil)
		h := rec.Header()
		if h.Get("Content-Security-Policy") != CSP || h.Get("X-Frame-Options") != "DENY" ||
			h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "no-referrer" {
			t.Fatalf("%s: headers %v", path, h)
		}
		switch path {
		case "/ui":
			if rec.Code != http.StatusMovedPermanently || h.Get("Location") != "ui/" {
				t.Fatalf("/ui: %d Location %q", rec.Code, h.Get("Location"))
			}
			continue
		case "/ui/nope.html":
			if rec.Code != http.StatusNotFound {
				t.Fatalf("%s: %d", path, rec.Code)
			}
			continue
		}
		if rec.Code != 200 || h.Get("Content-Type") != ct || rec.Body.Len() == 0 || h.Get("Cache-Control") != "no-cache" {
			t.Fatalf("%s: %d %q %q (%d bytes)", path, rec.Code, h.Get("Content-Type"), h.Get("Cache-Control"), rec.Body.Len())
		}
		again := get(t, path, map[string]string{"If-None-Match": h.Get("ETag")})
		if again.Code != http.StatusNotModified {
			t.Fatalf("%s with its ETag: %d", path, again.Code)
		}
	}
	for _, part := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(CSP, part) {
			t.Fatalf("CSP lacks %s: %s", part, CSP)
		}
	}
	if strings.Contains(CSP, "unsafe") {
		t.Fatalf("CSP allows unsafe code: %s", CSP)
	}
}

// TestNothingInlineOrRemote: the page has no inline script, style or event
// handler (the CSP would block them), and nothing it loads or calls comes
// from another origin (no CDN, no web font): every URL in the files is
// relative.
func TestNothingInlineOrRemote(t *testing.T) {
	html := string(files["index.html"].body)
	if m := regexp.MustCompile(`<script(?:\s[^>]*)?>`).FindAllString(html, -1); len(m) != 1 || !strings.Contains(m[0], `src="app.js"`) {
		t.Fatalf("scripts: %q; want only <script src=\"app.js\">", m)
	}
	for _, bad := range []string{"<style", " style=", " onclick=", " onload=", " onsubmit=", "javascript:"} {
		if strings.Contains(html, bad) {
			t.Fatalf("index.html has inline %q", bad)
		}
	}
	remote := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|url\(`)
	for name, f := range files {
		body := strings.ReplaceAll(string(f.body), `xmlns="http://www.w3.org/2000/svg"`, "")
		if m := remote.FindString(body); m != "" {
			t.Fatalf("%s refers to %q", name, m)
		}
	}
	js := string(files["app.js"].body)
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "localStorage"} {
		if strings.Contains(js, bad) {
			t.Fatalf("app.js uses %s", bad)
		}
	}
}
