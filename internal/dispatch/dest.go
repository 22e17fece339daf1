package dispatch

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/throttler/throttler/internal/dest"
)

// A job's own destination on an HTTP target (package dest): its method,
// its path under the target's URL or its URL under the lane's job_urls,
// and its forwarded headers. Intake checked them; the target checks them
// again before sending, since a job published on the lane's public NATS
// subject was never checked, and the lane's lists may have changed since
// the job was stored. A job the lists refuse is Dead (ErrDestRefused): its
// request would never be allowed, and retrying cannot change that. The SSRF
// Guard still checks every address at dial time, and redirects are never
// followed (ErrRedirected), so a job URL cannot lead outside its prefix.

// ErrDestRefused is the error of a job whose own destination the lane's
// lists refuse; the wrapped *dest.Error names the header, never a value.
var ErrDestRefused = errors.New("dispatch: the job's destination is not allowed")

// KeyTarget is where one key of a keyed HTTP lane sends its jobs: its URL
// (checked against the lane's job_urls when it was set), the headers sent
// with each job (a job's own forwarded headers win), and its own signer,
// which replaces the lane's. Err, when set, is why the key's stored target
// is no longer allowed by the lane's lists: its jobs are Dead
// (ErrDestRefused) rather than sent to the lane's URL, a receiver that is
// not theirs. A KeyTarget is immutable.
type KeyTarget struct {
	URL    *url.URL
	Header http.Header
	Signer *Signer
	Err    error
}

// rules are the lane's lists, checked.
func (c HTTPConfig) rules() (*dest.Rules, error) {
	r, err := dest.New(dest.Config{URL: c.URL, Method: c.Method, Methods: c.Methods, ForwardHeaders: c.ForwardHeaders, JobURLs: c.JobURLs})
	var fe *dest.FieldError
	if errors.As(err, &fe) {
		return nil, fmt.Errorf("%s: %s", fieldName(fe.Field), fe.Detail)
	}
	return r, err
}

// fieldName is the HTTPConfig field of a dest.Config key.
func fieldName(key string) string {
	for _, f := range []struct{ key, name string }{{"methods", "Methods"}, {"forward_headers", "ForwardHeaders"}, {"job_urls", "JobURLs"}, {"url", "URL"}} {
		if len(key) >= len(f.key) && key[:len(f.key)] == f.key {
			return f.name + key[len(f.key):]
		}
	}
	return key
}

// keyHeadersGo reports whether a key's headers go with a job: they are
// its receiver's credentials, so not to a job URL (jobURL, "" for none) of
// another origin (scheme, host, port) than the key's URL. A key without a
// URL sends them wherever its jobs go (the lane's URL or its job_urls).
func keyHeadersGo(keyURL *url.URL, jobURL string) bool {
	if keyURL == nil || jobURL == "" {
		return true
	}
	u, err := url.Parse(jobURL)
	if err != nil {
		return false // refused below anyway
	}
	return strings.EqualFold(u.Scheme, keyURL.Scheme) && strings.EqualFold(u.Hostname(), keyURL.Hostname()) &&
		portOf(u) == portOf(keyURL)
}

// portOf is u's port, or its scheme's default.
func portOf(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

// route points req where job (and its key) asks to go and returns the
// method and the job's own URL (nil for the target's); a refused
// destination comes back as a Dead Result.
func (h *HTTP) route(req *http.Request, job Job) (method string, to *url.URL, res Result) {
	var keyURL *url.URL
	if kt := job.KeyTarget; kt != nil {
		if kt.Err != nil {
			return h.method, nil, Result{Verdict: Dead, Err: fmt.Errorf("%w: key %s: %w", ErrDestRefused, job.Key, kt.Err)}
		}
		keyURL = kt.URL
		if len(kt.Header) > 0 && keyHeadersGo(kt.URL, job.Dest.URL) {
			for k, v := range kt.Header {
				req.Header[k] = v
			}
		}
	}
	// The job's own headers go in after its key's: they win.
	method, to, err := h.rules.ResolveInto(job.Dest, keyURL, req.Header)
	if err != nil {
		return h.method, nil, Result{Verdict: Dead, Err: fmt.Errorf("%w: %w", ErrDestRefused, err)}
	}
	req.Method = method
	if to != nil {
		req.URL, req.Host = to, to.Host
	}
	return method, to, Result{}
}
