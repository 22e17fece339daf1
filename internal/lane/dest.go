package lane

import (
	"errors"
	"net/http"
	"strings"

	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/dispatch"
	"github.com/throttler/throttler/internal/queue"
)

// A key's own target on a keyed HTTP lane: PATCH …/keys/{key} with a url
// (under target.http.job_urls), headers (names the lane forwards) and a
// Standard Webhooks signing_secret, stored with the key's other overrides in
// queue.LimitsBucket, so every instance applies it and it outlives
// restarts. Each instance makes the key's dispatch.KeyTarget when the
// override reaches it (its watch), not per job.

// keyTarget is the target of key's jobs; nil for the lane's own.
func (l *Lane) keyTarget(key string) *dispatch.KeyTarget {
	if key == "" || l.keyed == nil {
		return nil
	}
	l.overMu.Lock()
	defer l.overMu.Unlock()
	return l.keyTargets[key]
}

// setKeyTarget makes key's target from its override v (nil: removed).
// The caller holds overMu. A stored target the lane's lists no longer
// allow (the file changed) is kept as a refusal: the key's jobs are dead
// letters rather than sent to the lane's URL.
func (l *Lane) setKeyTarget(key string, v *queue.KeyLimit) {
	var kt *dispatch.KeyTarget
	if v != nil {
		var err error
		if kt, err = l.keyTargetOf(*v); err != nil {
			l.log.Warn("a key's stored target is refused by the lane's lists; its jobs are dead-lettered until it is changed",
				"key", key, "err", err)
			kt = &dispatch.KeyTarget{Err: err}
		}
	}
	if kt == nil {
		delete(l.keyTargets, key)
		return
	}
	if l.keyTargets == nil {
		l.keyTargets = map[string]*dispatch.KeyTarget{}
	}
	l.keyTargets[key] = kt
}

// keyTargetOf checks an override's target against the lane's lists and
// makes it; nil when the override sets none. An error names the body
// member at fault: a *dest.Error (url, headers/<Name>) or a
// *bucket.LimitError (signing_secret), whose text never holds a value.
func (l *Lane) keyTargetOf(o queue.KeyLimit) (*dispatch.KeyTarget, error) {
	if o.URL == "" && len(o.Headers) == 0 && o.SigningSecret == "" {
		return nil, nil
	}
	if l.rules == nil {
		return nil, &dest.Error{Field: "url", Err: dest.ErrNotHTTP, Detail: "only a lane with an http target takes a key's url, headers or signing_secret"}
	}
	kt := &dispatch.KeyTarget{}
	if o.URL != "" {
		u, err := l.rules.CheckURL(o.URL)
		if err != nil {
			var de *dest.Error
			if errors.As(err, &de) {
				return nil, &dest.Error{Field: "url", Err: de.Err, Detail: de.Detail}
			}
			return nil, err
		}
		kt.URL = u
	}
	if len(o.Headers) > 0 {
		if err := l.rules.CheckKeyHeaders(o.Headers); err != nil {
			return nil, err
		}
		kt.Header = make(http.Header, len(o.Headers))
		for k, v := range o.Headers {
			kt.Header[http.CanonicalHeaderKey(k)] = []string{v}
		}
	}
	if o.SigningSecret != "" {
		s, err := dispatch.NewSigner([]string{o.SigningSecret}, l.d.Clock)
		if err != nil {
			// NewSigner's message names secrets[0]; the body member is one.
			// It never repeats the secret.
			msg := err.Error()
			if i := strings.LastIndex(msg, ": "); i >= 0 {
				msg = msg[i+2:]
			}
			return nil, &dest.Error{Field: "signing_secret", Err: dispatch.ErrBadSecret, Detail: msg}
		}
		kt.Signer = s
	}
	return kt, nil
}
