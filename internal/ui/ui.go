// Package ui serves the live status page at /ui: static files embedded in
// the binary (plain HTML, CSS and JavaScript; no build step, nothing
// fetched from elsewhere). The files hold no data: the page asks the API
// for everything it shows, with the operator's API key, so the API's own
// checks (keys and scopes, Host, cross-site requests) apply to it as to any
// client.
//
// Every response carries a strict Content-Security-Policy (scripts and
// styles from this server only, no inline code, fetches to this origin
// only, no framing) and the matching older headers.
package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// CSP is the Content-Security-Policy of every response of the page.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

type file struct {
	body  []byte
	ctype string
	etag  string
}

// files are the embedded files by name ("index.html", "app.js").
var files = func() map[string]file {
	out := map[string]file{}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ct := mime.TypeByExtension(path.Ext(p))
		if ct == "" {
			ct = "application/octet-stream"
		}
		out[strings.TrimPrefix(p, "static/")] = file{body: b, ctype: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic("ui: reading the embedded files: " + err.Error())
	}
	return out
}()

// Handler serves the page: /ui redirects to /ui/, /ui/ is index.html and
// /ui/<name> an embedded file; anything else is 404.
func Handler() http.Handler {
	return http.HandlerFunc(serve)
}

func serve(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.URL.Path == "/ui" {
		// Relative, so that a proxy's path prefix stays.
		// (http.Redirect would make it absolute.)
		h.Set("Location", "ui/")
		w.WriteHeader(http.StatusMovedPermanently)
		return
	}
	name := strings.TrimPrefix(r.URL.Path, "/ui/")
	if name == "" {
		name = "index.html"
	}
	f, ok := files[name]
	if !ok {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte("no such file in the status page\n"))
		return
	}
	h.Set("Content-Type", f.ctype)
	// Revalidate every time: a new binary serves new files at once.
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", f.etag)
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.body))
}
