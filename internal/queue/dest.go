package queue

import (
	"net/http"
	"net/textproto"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/throttler/throttler/internal/dest"
)

// Where a job goes (package dest) travels with the job as message
// headers, the same on every subject: Throttle-Method, Throttle-Path,
// Throttle-URL and one Throttle-Forward-<Name> per forwarded header. A job
// published on a public subject says it with the same headers; the queue
// keeps them within dest's bounds and the HTTP target checks them against
// the lane's lists before it sends anything, so a value from outside is
// never believed unchecked. Forwarded values sit in JetStream with the job
// (and with its dead letter): they are the submitter's to send, and are
// never logged or listed.

// Canonical keys of the headers a stored job carries (jobMsg fills its
// header map directly).
var (
	headerMethod = textproto.CanonicalMIMEHeaderKey(dest.HeaderMethod)
	headerPath   = textproto.CanonicalMIMEHeaderKey(dest.HeaderPath)
	headerURL    = textproto.CanonicalMIMEHeaderKey(dest.HeaderURL)
)

// refused stands for a header a job sent twice or over its bound: no lane
// allows it, so the target refuses the job instead of sending it where
// one of the values, or none, would.
const refused = "\x00"

// addDest appends the headers of d through add.
func addDest(d dest.Request, add func(k, v string)) {
	if d.Method != "" {
		add(headerMethod, d.Method)
	}
	if d.Path != "" {
		add(headerPath, d.Path)
	}
	if d.URL != "" {
		add(headerURL, d.URL)
	}
	for k, v := range d.Headers {
		add(textproto.CanonicalMIMEHeaderKey(dest.ForwardPrefix+k), v)
	}
}

// setDest writes d on a message the throttler stores itself (dead
// letters).
func setDest(h nats.Header, d dest.Request) {
	addDest(d, func(k, v string) { h[k] = []string{v} })
}

// throttlePrefix starts every header decodeDest reads.
const throttlePrefix = "Throttle-"

// decodeDest reads where a stored message's job goes, its header names in
// any case, in one pass over the headers. A header sent twice (in one
// spelling or two) or over dest's bounds becomes a value no lane allows, so
// that the target refuses the job; what is kept is checked against the
// lane's lists at dispatch.
func decodeDest(h nats.Header) dest.Request {
	var d dest.Request
	set := func(field *string, v []string, max int) {
		if *field != "" || len(v) != 1 || len(v[0]) > max {
			*field = refused
			return
		}
		*field = v[0]
	}
	size := 0
	for k, v := range h {
		if len(k) <= len(throttlePrefix) || !strings.EqualFold(k[:len(throttlePrefix)], throttlePrefix) || len(v) == 0 {
			continue
		}
		switch {
		case strings.EqualFold(k, dest.HeaderMethod):
			set(&d.Method, v, 16)
		case strings.EqualFold(k, dest.HeaderPath):
			set(&d.Path, v, dest.MaxPath)
		case strings.EqualFold(k, dest.HeaderURL):
			set(&d.URL, v, dest.MaxURL)
		default:
			name, ok := cutForward(k)
			if !ok {
				continue
			}
			if d.Headers == nil {
				d.Headers = make(map[string]string)
			}
			c := http.CanonicalHeaderKey(name)
			size += len(name) + len(v[0])
			if _, dup := d.Headers[c]; dup || len(v) != 1 || size > dest.MaxHeaderBytes {
				d.Headers[c] = refused
				continue
			}
			d.Headers[c] = v[0]
		}
	}
	return d
}

// cutForward returns the name a Throttle-Forward-<Name> header forwards.
func cutForward(k string) (string, bool) {
	n := len(dest.ForwardPrefix)
	if len(k) <= n || !strings.EqualFold(k[:n], dest.ForwardPrefix) {
		return "", false
	}
	return k[n:], true
}
