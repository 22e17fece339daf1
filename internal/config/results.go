package config

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/throttler/throttler/internal/dest"
)

// Results keeps a record of each job of a lane (its state, attempts and
// the target's answer) and with it an Idempotency-Key that lasts as long as
// the record. nil (no results key in the file): no records; the lane's
// jobs are de-duplicated within nats.dedup_window only.
type Results struct {
	// Keep is how long a record is kept after its job was stored; an
	// Idempotency-Key is honoured as long. Zero means DefaultResultsKeep.
	Keep Duration `yaml:"keep"`
	// MaxBody is how much of the target's answer a record keeps; a longer
	// body is cut and marked. Zero means DefaultResultsMaxBody.
	MaxBody ByteSize `yaml:"max_body"`
	// MaxWait bounds ?wait= on a submission. Zero means
	// DefaultResultsMaxWait.
	MaxWait Duration `yaml:"max_wait"`
	// Headers are the target's answer headers a record keeps (besides
	// Content-Type).
	Headers []string `yaml:"headers"`
	// CallbackURLs are the URL prefixes a job may name in
	// Throttle-Callback (compared as target.http.job_urls are); none
	// refuses the header.
	CallbackURLs []string `yaml:"callback_urls"`
	// CallbackLane is the lane the callbacks go through: an HTTP lane
	// whose target.http.job_urls cover every callback_urls prefix. It
	// paces, signs, retries and dead-letters them. Required with
	// callback_urls.
	CallbackLane string `yaml:"callback_lane"`
	// ReplySubjects are the NATS subject prefixes a job published over
	// NATS may name in Throttle-Reply (records.Replies): its settled
	// record is published there. A prefix covers itself and the subjects
	// under it at a token boundary. None (the default) refuses the header:
	// such a job is dead-lettered. Over HTTP the header is always refused.
	ReplySubjects []string `yaml:"reply_subjects"`
}

// Defaults of a lane's results.
const (
	DefaultResultsKeep    = 24 * time.Hour
	DefaultResultsMaxBody = 64 << 10
	DefaultResultsMaxWait = 60 * time.Second
	// MaxResultsBody bounds results.max_body: a record is one JetStream
	// message, and a waiting caller's answer is read from it.
	MaxResultsBody = 1 << 20
	// MaxResultsWait bounds results.max_wait: a held request holds a
	// connection.
	MaxResultsWait = 15 * time.Minute
	// MaxResultsHeaders bounds results.headers.
	MaxResultsHeaders = 32
	// MaxReplySubjects bounds results.reply_subjects.
	MaxReplySubjects = 32
)

// MaxRecord bounds one of the lane's records in bytes: the answer's body
// (up to twice max_body once escaped in JSON) and the rest. A callback
// carries one record, so a callback lane's max_body is at least this.
func (r *Results) MaxRecord() int64 { return 2*int64(r.MaxBody) + 64<<10 }

func (r *Results) applyDefaults() {
	if r.Keep == 0 {
		r.Keep = Duration(DefaultResultsKeep)
	}
	if r.MaxBody == 0 {
		r.MaxBody = DefaultResultsMaxBody
	}
	if r.MaxWait == 0 {
		r.MaxWait = Duration(DefaultResultsMaxWait)
	}
	for i, h := range r.Headers {
		r.Headers[i] = http.CanonicalHeaderKey(strings.TrimSpace(h))
	}
}

// validate checks a lane's results; fail names the field under results.
func (r *Results) validate(fail func(field, format string, args ...any) error) error {
	switch {
	case r.Keep < Duration(time.Second) || r.Keep > Duration(366*24*time.Hour):
		return fail("results.keep", "must be between 1s and 366 days, got %v", r.Keep.D())
	case r.MaxBody < 0 || r.MaxBody > MaxResultsBody:
		return fail("results.max_body", "must be between 0 and 1MiB, got %d", r.MaxBody)
	case r.MaxWait < 0 || r.MaxWait > Duration(MaxResultsWait):
		return fail("results.max_wait", "must be between 0 and %v, got %v", MaxResultsWait, r.MaxWait.D())
	case len(r.Headers) > MaxResultsHeaders:
		return fail("results.headers", "lists %d headers; at most %d are allowed", len(r.Headers), MaxResultsHeaders)
	case len(r.ReplySubjects) > MaxReplySubjects:
		return fail("results.reply_subjects", "lists %d prefixes; at most %d are allowed", len(r.ReplySubjects), MaxReplySubjects)
	}
	for i, h := range r.Headers {
		if !validToken(h) {
			return fail(fmt.Sprintf("results.headers[%d]", i), "%q is not a header name", h)
		}
	}
	if _, err := dest.NewPrefixes(r.CallbackURLs); err != nil {
		var fe *dest.FieldError
		if errors.As(err, &fe) {
			return fail("results.callback_urls"+fe.Field, "%s", fe.Detail)
		}
		return fail("results.callback_urls", "%v", err)
	}
	switch {
	case len(r.CallbackURLs) > 0 && r.CallbackLane == "":
		return fail("results.callback_lane", "must name the lane the callbacks go through when results.callback_urls is set")
	case len(r.CallbackURLs) == 0 && r.CallbackLane != "":
		return fail("results.callback_urls", "must list the callback URL prefixes when results.callback_lane is set")
	}
	return nil
}

// validToken reports an RFC 9110 token (a header name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
