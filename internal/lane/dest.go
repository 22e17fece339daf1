package lane

import (
	"errors"
	"fmt"
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
		if kt, err = l.keyTargetOf(key, *v); err != nil {
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

// keyTargetOf checks key's override's target against the lane's lists and
// makes it; nil when the override sets none. On a url_host lane the url's
// host must be the key (urlHost). An error names the body member at
// fault: a *dest.Error (url, headers/<Name>) or a *bucket.LimitError
// (signing_secret), whose text never holds a value.
func (l *Lane) keyTargetOf(key string, o queue.KeyLimit) (*dispatch.KeyTarget, error) {
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
		if l.urlHost() {
			if k, _ := l.rules.KeyOf(o.URL); k != key {
				return nil, &dest.Error{Field: "url", Err: dest.ErrNotKeyHost,
					Detail: fmt.Sprintf("its host is the key %q, not %q: the lane takes a job's key from its URL's host (per_key.key_from %s), so a key's url is on the key's own host",
						k, key, dest.KeyFromURLHost)}
			}
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

// urlHost reports whether the lane takes a job's key from its URL's host
// (per_key.key_from: url_host, on an http target).
func (l *Lane) urlHost() bool {
	return l.cfg.PerKey != nil && l.cfg.PerKey.KeyFrom == dest.KeyFromURLHost && l.rules != nil
}

// KeyWithoutURL reports whether a job of key that names no URL may be
// taken on the lane: on a url_host lane only when key has its own url
// (PATCH …/keys/{key}, on this instance once the change reached it) or is
// the host of the lane's url (dest.Rules.BaseKey); any other key would
// send the job to the lane's url under a bucket of its own, a second
// bucket for that host. Nil on other lanes. The error says why and names
// no field; intake names it (Throttle-Key over HTTP, the dead letter's
// reason over NATS). Safe for concurrent use.
func (l *Lane) KeyWithoutURL(key string) error {
	if !l.urlHost() || key == l.rules.BaseKey() {
		return nil
	}
	if o, ok := l.override(key); ok && o.URL != "" {
		return nil
	}
	return fmt.Errorf("%q names no URL, has no url of its own (PATCH /v1/lanes/%s/keys/{key}) and is not the host of the lane's url: the lane takes a job's key from its URL's host (per_key.key_from %s); name a URL whose host is the key, or a key with its own url",
		key, l.cfg.Name, dest.KeyFromURLHost)
}
