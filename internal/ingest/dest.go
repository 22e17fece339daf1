package ingest

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/queue"
	"github.com/throttler/throttler/internal/records"
)

// Where a job goes, at HTTP intake (package dest): a single job says it
// with Throttle-Method, Throttle-Path, Throttle-URL and
// Throttle-Forward-<Name> headers, a batch item with its method, path, url
// and headers members. Intake checks them against the lane's lists before
// anything is stored; a refusal is a 400 naming the header (or the item's
// JSON pointer) through the refusal table (its rows for dest's
// sentinels), and its detail never holds a forwarded value.

// jobDest reads and checks the destination headers of r for lane.
func jobDest(r *http.Request, lane Lane) (dest.Request, error) {
	var d dest.Request
	for _, f := range []struct {
		name string
		to   *string
	}{{dest.HeaderMethod, &d.Method}, {dest.HeaderPath, &d.Path}, {dest.HeaderURL, &d.URL}} {
		v := r.Header.Values(f.name)
		switch {
		case len(v) > 1:
			return d, refusal(ErrBadHeader, f.name, "%s: %d headers; at most one is allowed", f.name, len(v))
		case len(v) == 1 && v[0] == "":
			return d, refusal(ErrBadHeader, f.name, "%s is empty", f.name)
		case len(v) == 1:
			*f.to = v[0]
		}
	}
	for k, v := range r.Header {
		name, ok := strings.CutPrefix(k, dest.ForwardPrefix)
		if !ok {
			continue
		}
		if len(v) > 1 {
			return d, refusal(ErrBadHeader, k, "%s: %d headers; at most one is allowed", k, len(v))
		}
		if d.Headers == nil {
			d.Headers = make(map[string]string)
		}
		d.Headers[name] = v[0]
	}
	if d.IsZero() {
		return d, nil
	}
	if err := checkDest(lane, d); err != nil {
		return d, destRefusal(err, "")
	}
	return d, nil
}

// urlKey is the key of a job on a url_host lane (Lane.KeyFromURL): the
// job's own key (given, already checked), which must agree with the host
// of its URL when it names one, else that host; urls are the job's
// Throttle-URL values. A job with neither is refused as a keyed lane
// refuses a job without a key; a key without a URL is taken only when
// lane.KeyWithoutURL takes it. keyFault classifies a refusal.
func urlKey(given string, urls []string, name string, lane Lane) (string, error) {
	switch {
	case len(urls) == 0 && given == "":
		return "", &Refusal{Err: ErrBadHeader, Cause: errNoKey, Field: HeaderThrottleKey,
			Detail: fmt.Sprintf("lane %s is keyed with per_key.key_from %s: every job needs a Throttle-Key header naming its key, or a Throttle-URL whose host is its key", name, dest.KeyFromURLHost)}
	case len(urls) == 0:
		if err := keyWithoutURL(lane, given); err != nil {
			return "", &Refusal{Err: ErrBadHeader, Cause: err, Field: HeaderThrottleKey, Detail: HeaderThrottleKey + " " + err.Error()}
		}
		return given, nil
	case len(urls) > 1:
		return "", refusal(ErrBadHeader, dest.HeaderURL, "%s: %d headers; at most one is allowed", dest.HeaderURL, len(urls))
	}
	key, err := lane.Dest.KeyOf(urls[0])
	if err != nil {
		return "", destRefusal(err, "")
	}
	switch err := keyAgrees(given, key); {
	case errors.Is(err, errKeyDisagrees):
		return "", &Refusal{Err: ErrBadHeader, Cause: err, Field: HeaderThrottleKey, Detail: HeaderThrottleKey + " " + err.Error()}
	case err != nil:
		return "", &Refusal{Err: ErrBadHeader, Cause: err, Field: dest.HeaderURL, Detail: dest.HeaderURL + ": its host cannot be a key: " + err.Error()}
	}
	return key, nil
}

// errNoKey: a job on a keyed lane names no key (nor, on a url_host lane,
// a URL).
var errNoKey = errors.New("no key")

// What a refusal of a job's key is about, for its log reason.
const (
	faultMissing = iota // no key (errNoKey)
	faultKey            // a key that is not its URL's host, or names none the lane takes
	faultDest           // the URL
)

func keyFault(err error) int {
	switch {
	case errors.Is(err, errNoKey):
		return faultMissing
	case errors.Is(err, errKeyDisagrees), errors.Is(err, errKeyWithoutURL):
		return faultKey
	}
	return faultDest
}

// errKeyWithoutURL: on a url_host lane, a job names a key and no URL, and
// the lane takes no such job of that key (Lane.KeyWithoutURL).
var errKeyWithoutURL = errors.New("a key without a URL")

// keyWithoutURL is nil when lane takes a job of key that names no URL,
// else errKeyWithoutURL with the lane's reason.
func keyWithoutURL(lane Lane, key string) error {
	if lane.KeyWithoutURL == nil {
		return nil
	}
	if err := lane.KeyWithoutURL(key); err != nil {
		return &causeError{errKeyWithoutURL, err}
	}
	return nil
}

// causeError is a sentinel that classifies a cause, reading as the cause.
type causeError struct{ class, cause error }

func (e *causeError) Error() string   { return e.cause.Error() }
func (e *causeError) Unwrap() []error { return []error{e.class, e.cause} }

// errKeyDisagrees: on a url_host lane, a job's key is not its URL's host.
var errKeyDisagrees = errors.New("the key is not its URL's host")

// keyDisagrees is errKeyDisagrees with the two keys.
type keyDisagrees struct{ given, fromURL string }

func (e *keyDisagrees) Error() string {
	return fmt.Sprintf("%q is not the host of its URL (%q): the lane takes a job's key from its URL's host (per_key.key_from %s); leave the key out, or give that host",
		e.given, e.fromURL, dest.KeyFromURLHost)
}

// Is makes a keyDisagrees errKeyDisagrees.
func (e *keyDisagrees) Is(target error) bool { return target == errKeyDisagrees }

// keyAgrees checks the key a job on a url_host lane gives (or "") against
// fromURL, the key of its URL: a job may name its key, but never one
// other than its URL's host, which would give that receiving host a
// second bucket. The error says why, naming neither field.
func keyAgrees(given, fromURL string) error {
	if given != "" && given != fromURL {
		return &keyDisagrees{given, fromURL}
	}
	// Config checks that every job_urls host is a valid key; kept as a
	// guard, since the key names a subject.
	return queue.ValidKey(fromURL)
}

// jobCallback reads and checks the Throttle-Callback header of r for lane:
// "" when absent. The URL must be under one of the lane's
// results.callback_urls, compared as Throttle-URL is against job_urls.
func jobCallback(r *http.Request, lane Lane) (string, error) {
	v := r.Header.Values(dest.HeaderCallback)
	switch {
	case len(v) == 0:
		return "", nil
	case len(v) > 1:
		return "", refusal(ErrBadHeader, dest.HeaderCallback, "%s: %d headers; at most one is allowed", dest.HeaderCallback, len(v))
	case v[0] == "":
		return "", refusal(ErrBadHeader, dest.HeaderCallback, "%s is empty", dest.HeaderCallback)
	}
	if _, err := lane.Callbacks.CheckCallback(v[0]); err != nil {
		return "", destRefusal(err, "")
	}
	return v[0], nil
}

// refuseReply refuses a Throttle-Reply on an HTTP submission. The header is
// for jobs published over NATS, whose publisher has no other way to hear
// the answer; an HTTP caller waits with ?wait= or names a Throttle-Callback.
// Accepting it here would let an API key choose a NATS subject for the
// throttler to publish on: a principal of one kind steering another's
// traffic, which no NATS permission of the caller's stands behind.
func refuseReply(r *http.Request) error {
	if _, ok := r.Header[http.CanonicalHeaderKey(records.HeaderReply)]; !ok {
		return nil
	}
	return refusal(ErrBadHeader, records.HeaderReply, "%s is for jobs published over NATS; over HTTP, wait for the answer with ?wait= or name a Throttle-Callback", records.HeaderReply)
}

// checkDest checks d against lane's lists.
func checkDest(lane Lane, d dest.Request) error {
	if lane.Dest == nil {
		field := dest.HeaderPath
		switch {
		case d.Method != "":
			field = dest.HeaderMethod
		case d.URL != "":
			field = dest.HeaderURL
		case d.Path == "":
			field = dest.ForwardPrefix + d.HeaderNames()[0]
		}
		return &dest.Error{Field: field, Err: dest.ErrNotHTTP, Detail: "only a lane with an http target takes a job's method, path, URL or headers"}
	}
	return lane.Dest.Check(d)
}

// destRefusal is the refusal of a destination dest refused; item is the
// JSON pointer of a batch item ("/3"), "" for a single job.
func destRefusal(err error, item string) *Refusal {
	rf := &Refusal{Err: ErrBadHeader, Cause: err, Detail: err.Error()}
	var de *dest.Error
	if !errors.As(err, &de) {
		return rf
	}
	rf.Field = de.Field
	if item != "" {
		rf.Err = ErrBadBody
		rf.Field = item + itemMember(de.Field)
		rf.Detail = "item " + item[1:] + ": " + strings.TrimPrefix(err.Error(), de.Field+": ")
	}
	return rf
}

// itemMember is the batch item member that stands for a dest header.
func itemMember(field string) string {
	switch field {
	case dest.HeaderMethod:
		return "/method"
	case dest.HeaderPath:
		return "/path"
	case dest.HeaderURL:
		return "/url"
	case dest.HeaderCallback:
		return "/callback"
	}
	if name, ok := strings.CutPrefix(field, dest.ForwardPrefix); ok {
		return "/headers/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(name)
	}
	return ""
}

// itemDest is the destination of batch item it.
func itemDest(it api.BatchItem) dest.Request {
	return dest.Request{Method: it.Method, Path: it.Path, URL: it.URL, Headers: it.Headers}
}

// batchDest checks the destinations of a checked batch against lane.
func batchDest(jobs []batchJob, lane Lane) *Refusal {
	for i := range jobs {
		d := jobs[i].job.Dest
		if d.IsZero() {
			continue
		}
		if err := checkDest(lane, d); err != nil {
			return destRefusal(err, "/"+strconv.Itoa(i))
		}
	}
	return nil
}

// batchCallbacks checks the callbacks of a checked batch against lane's
// results.callback_urls.
func batchCallbacks(jobs []batchJob, lane Lane) *Refusal {
	for i := range jobs {
		cb := jobs[i].job.Callback
		if cb == "" {
			continue
		}
		if _, err := lane.Callbacks.CheckCallback(cb); err != nil {
			return destRefusal(err, "/"+strconv.Itoa(i))
		}
	}
	return nil
}
