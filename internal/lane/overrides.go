package lane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/queue"
)

// Limits changed at runtime live in the key-value bucket queue.LimitsBucket
// (Deps.Limits): a lane's PATCHed rate and burst, and a keyed lane's
// per-key overrides. Every instance watches its lanes' entries, so a change
// applies everywhere within the watch's delivery (milliseconds), and an
// instance that starts later reads them first.

// ErrNotKeyed: the lane has no per_key block. It is api.ErrNotKeyed, which
// the HTTP API answers 404.
var ErrNotKeyed = api.ErrNotKeyed

// KeyChange is a change to one key's override; a nil field keeps its value.
type KeyChange struct {
	Rate        *float64
	Burst       *int
	MaxInflight *int
	Weight      *float64
	Paused      *bool
	// URL, Headers and SigningSecret set the key's own target (dest.go);
	// an empty URL or secret, or an empty map, drops it.
	URL           *string
	Headers       map[string]string
	SigningSecret *string
	// Reset drops the override first (the key goes back to per_key).
	Reset bool
}

// override returns key's override, if any.
func (l *Lane) override(key string) (queue.KeyLimit, bool) {
	l.overMu.Lock()
	defer l.overMu.Unlock()
	o, ok := l.over[key]
	return o, ok
}

// watchLimits applies the stored limits of the lane until ctx ends,
// watching again after a failure. loaded is closed once the entries stored
// when it began (an operator's hold among them) are applied: the drain
// starts no job before, so a restarted instance of a held lane delivers
// nothing.
func (l *Lane) watchLimits(ctx context.Context, loaded chan<- struct{}) {
	if l.d.Limits == nil {
		close(loaded)
		return
	}
	var once sync.Once
	for ctx.Err() == nil {
		err := l.d.Limits.Watch(ctx, l.cfg.Name, queue.LimitsWatch{
			Lane: l.applyLaneLimit, Pause: l.applyPause, Key: l.applyKeyLimit,
			Loaded: func() { once.Do(func() { close(loaded) }) },
			Bad: func(entry string, err error) {
				l.log.Warn("stored limit ignored", "entry", entry, "err", err)
			},
		})
		if err != nil && ctx.Err() == nil {
			l.log.Warn("watching stored limits failed; trying again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (l *Lane) applyLaneLimit(v queue.LaneLimit) {
	lim := bucket.Limit{Rate: v.Rate, Burst: v.Burst}
	if lim.Validate() != nil {
		l.log.Warn("stored lane limit refused", "rate", v.Rate, "burst", v.Burst)
		return
	}
	if old := l.limit.Swap(&lim); *old != lim {
		l.log.Info("lane limit changed (stored)", "rate", lim.Rate, "burst", lim.Burst, "was", old.String(), "by", v.By)
	}
}

func (l *Lane) applyKeyLimit(key string, v *queue.KeyLimit) {
	if l.keyed == nil {
		return
	}
	l.overMu.Lock()
	if v == nil {
		delete(l.over, key)
	} else {
		if l.over == nil {
			l.over = map[string]queue.KeyLimit{}
		}
		l.over[key] = *v
	}
	l.setKeyTarget(key, v)
	l.overMu.Unlock()
	l.keyed.SetOpts(key, l.keyOpts(key))
}

// KeyStatus reports key's limits and its state on this instance.
func (l *Lane) KeyStatus(key string) (api.KeyStatus, error) {
	if l.keyed == nil {
		return api.KeyStatus{}, ErrNotKeyed
	}
	lim, o := l.keyLimit(key), l.keyOpts(key)
	_, overridden := l.override(key)
	ks := l.keyed.Key(key)
	st := api.KeyStatus{Lane: l.cfg.Name, Key: key, Rate: lim.Rate, Burst: lim.Burst, MaxInflight: o.MaxInflight,
		Weight: o.Weight, EffectiveRate: l.keyed.KeyLimit(key, l.d.Clock.Now()).Rate, Paused: o.Paused, Overridden: overridden, Active: ks.Known, InFlight: ks.Inflight}
	if v, ok := l.override(key); ok {
		st.URL, st.SigningSecretSet = v.URL, v.SigningSecret != ""
		st.Headers = dest.Request{Headers: v.Headers}.HeaderNames()
	}
	if ks.Paused.After(l.d.Clock.Now()) {
		st.PausedUntil = ks.Paused.UTC().Format(time.RFC3339Nano)
	}
	return st, nil
}

// SetKey changes key's override, stores it (every instance applies it
// through its watch) and applies it here at once.
func (l *Lane) SetKey(ctx context.Context, key string, c KeyChange, by string) (api.KeyStatus, error) {
	if l.keyed == nil {
		return api.KeyStatus{}, ErrNotKeyed
	}
	if l.d.Limits == nil {
		return api.KeyStatus{}, errors.New("lane: no store for limits")
	}
	cur, _ := l.override(key)
	if c.Reset {
		cur = queue.KeyLimit{}
	}
	if c.Rate != nil {
		cur.Rate = c.Rate
	}
	if c.Burst != nil {
		cur.Burst = c.Burst
	}
	if c.MaxInflight != nil {
		cur.MaxInflight = c.MaxInflight
	}
	if c.Weight != nil {
		cur.Weight = c.Weight
	}
	if c.Paused != nil {
		cur.Paused = *c.Paused
	}
	if c.URL != nil {
		cur.URL = *c.URL
	}
	if c.Headers != nil {
		cur.Headers = c.Headers
		if len(c.Headers) == 0 {
			cur.Headers = nil
		}
	}
	if c.SigningSecret != nil {
		cur.SigningSecret = *c.SigningSecret
	}
	if _, err := l.keyTargetOf(key, cur); err != nil {
		return api.KeyStatus{}, err
	}
	lim := l.limitOf(cur)
	if err := lim.Validate(); err != nil {
		return api.KeyStatus{}, err
	}
	if m := cur.MaxInflight; m != nil && (*m < 1 || *m > l.cfg.MaxInflight) {
		return api.KeyStatus{}, &bucket.LimitError{Field: "max_inflight", Msg: fmt.Sprintf("must be between 1 and the lane's max_inflight (%d), got %d", l.cfg.MaxInflight, *m)}
	}
	if w := cur.Weight; w != nil && !(*w > 0 && *w <= 1000) {
		return api.KeyStatus{}, &bucket.LimitError{Field: "weight", Msg: fmt.Sprintf("must be greater than 0 and at most 1000, got %v", *w)}
	}
	cur.By, cur.At = by, time.Now().UTC()
	if err := l.d.Limits.PutKey(ctx, l.cfg.Name, key, cur); err != nil {
		return api.KeyStatus{}, err
	}
	l.applyKeyLimit(key, &cur)
	return l.KeyStatus(key)
}

// limitOf is the key limit an override gives.
func (l *Lane) limitOf(o queue.KeyLimit) bucket.Limit {
	lim := bucket.Limit{Rate: l.cfg.PerKey.Rate.PerSecond(), Burst: l.cfg.PerKey.Burst}
	if o.Rate != nil {
		lim.Rate = *o.Rate
	}
	if o.Burst != nil {
		lim.Burst = *o.Burst
	}
	return lim
}

// keyOpts are a key's scheduling settings: per_key, then its override.
func (l *Lane) keyOpts(key string) keyed.Opts {
	o := keyed.Opts{Weight: 1, MaxInflight: l.cfg.PerKey.MaxInflight}
	if v, ok := l.override(key); ok {
		if v.Weight != nil {
			o.Weight = *v.Weight
		}
		if v.MaxInflight != nil && !l.cfg.PerKey.Ordered {
			o.MaxInflight = *v.MaxInflight
		}
		o.Paused = v.Paused
	}
	return o
}

// keyLimit is a key's limit: per_key, then its override.
func (l *Lane) keyLimit(key string) bucket.Limit {
	o, _ := l.override(key)
	lim := l.limitOf(o)
	if lim.Validate() != nil {
		return bucket.Limit{Rate: l.cfg.PerKey.Rate.PerSecond(), Burst: l.cfg.PerKey.Burst}
	}
	return lim
}
