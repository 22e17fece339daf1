package apiserver

import (
	"time"

	"context"
	"errors"
	"fmt"

	"github.com/throttler/throttler/api"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/dest"
	"github.com/throttler/throttler/internal/ingest"
	"github.com/throttler/throttler/internal/lane"
)

// Lanes is the API's view of the running lanes: it implements
// ingest.Directory and ingest.KeyDirectory over them. Add every lane
// before the API serves; then it is safe for concurrent use.
type Lanes struct {
	byName map[string]*lane.Lane
	order  []*lane.Lane
	cfg    map[string]config.Lane
	// keyFns are the keyed lanes' key lookups, made once per lane rather
	// than per request.
	keyFns map[string]keyFns
	// dest are the HTTP lanes' destination lists (package dest).
	dest map[string]*dest.Rules
	// held are the lanes' Held, made once per lane.
	held map[string]func() bool
	// callbacks are the lanes' results.callback_urls.
	callbacks map[string]*dest.Prefixes
	// callbackLanes are the lanes some lane names as its
	// results.callback_lane.
	callbackLanes map[string]bool
}

var (
	_ ingest.Directory     = (*Lanes)(nil)
	_ ingest.KeyDirectory  = (*Lanes)(nil)
	_ ingest.LanePauser    = (*Lanes)(nil)
	_ ingest.HistoryReader = (*Lanes)(nil)
)

// History implements ingest.HistoryReader.
func (d *Lanes) History(name string) (api.LaneHistory, bool) {
	l, ok := d.byName[name]
	if !ok {
		return api.LaneHistory{}, false
	}
	return l.History(), true
}

// keyFns are a keyed lane's lookups that ingest asks of each key.
type keyFns struct {
	limit   func(key string) bucket.Limit
	started func(ctx context.Context, key string) (int, error)
	// withoutURL is lane.Lane.KeyWithoutURL (url_host lanes).
	withoutURL func(key string) error
}

// NewLanes returns an empty directory.
func NewLanes() *Lanes {
	return &Lanes{byName: map[string]*lane.Lane{}, cfg: map[string]config.Lane{}, keyFns: map[string]keyFns{}, dest: map[string]*dest.Rules{}, held: map[string]func() bool{}, callbacks: map[string]*dest.Prefixes{}, callbackLanes: map[string]bool{}}
}

// Add lists l, started from lc, after the lanes added before it.
func (d *Lanes) Add(l *lane.Lane, lc config.Lane) {
	d.cfg[lc.Name] = lc
	d.byName[lc.Name] = l
	d.order = append(d.order, l)
	d.held[lc.Name] = l.Held
	if h := lc.Target.HTTP; h != nil {
		if r, err := dest.New(h.DestConfig()); err == nil { // validated with the config
			d.dest[lc.Name] = r
		}
	}
	if r := lc.Results; r != nil && r.CallbackLane != "" {
		d.callbackLanes[r.CallbackLane] = true
	}
	if r := lc.Results; r != nil && len(r.CallbackURLs) > 0 {
		if p, err := dest.NewPrefixes(r.CallbackURLs); err == nil { // validated with the config
			d.callbacks[lc.Name] = p
		}
	}
	if lc.PerKey != nil {
		// Made once: a method value is a new closure each time.
		d.keyFns[lc.Name] = keyFns{limit: l.KeyLimit, started: l.KeyStarted, withoutURL: l.KeyWithoutURL}
	}
}

// All is every lane, in the order they were added.
func (d *Lanes) All() []*lane.Lane { return d.order }

// Lane implements ingest.Directory.
func (d *Lanes) Lane(name string) (ingest.Lane, bool) {
	l, ok := d.byName[name]
	if !ok {
		return ingest.Lane{}, false
	}
	c := d.cfg[name]
	il := ingest.Lane{Admission: l.Admission(), MaxBody: l.MaxBody(), MaxDelay: c.MaxDelay.D(), AdmitWait: l.AdmitWait(), Cost: c.Cost, Observe: c.Observe}
	if r := c.Results; r != nil {
		// A lane that keeps results always has a wait bound above zero.
		il.ResultsMaxWait = max(r.MaxWait.D(), time.Nanosecond)
	}
	if f, ok := d.keyFns[name]; ok {
		il.KeyLimit, il.KeyStarted = f.limit, f.started
	}
	il.Dest = d.dest[name]
	il.KeyFromURL = c.PerKey != nil && c.PerKey.KeyFrom == dest.KeyFromURLHost && il.Dest != nil
	if il.KeyFromURL {
		il.KeyWithoutURL = d.keyFns[name].withoutURL
	}
	il.Held = d.held[name]
	il.Callbacks = d.callbacks[name]
	il.CallbacksOnly = d.callbackLanes[name]
	return il, true
}

// SetLimit implements ingest.Directory.
func (d *Lanes) SetLimit(ctx context.Context, name string, rate float64, burst int) (api.LaneStatus, error) {
	l, ok := d.byName[name]
	if !ok {
		return api.LaneStatus{}, fmt.Errorf("no lane %q", name)
	}
	if err := l.SetLimit(bucket.Limit{Rate: rate, Burst: burst}); err != nil {
		return api.LaneStatus{}, err
	}
	return l.Status(ctx), nil
}

// SetPaused implements ingest.LanePauser.
func (d *Lanes) SetPaused(ctx context.Context, name string, paused bool, by string) (api.LaneStatus, error) {
	l, ok := d.byName[name]
	if !ok {
		return api.LaneStatus{}, fmt.Errorf("no lane %q", name)
	}
	if err := l.SetPaused(ctx, paused, by); err != nil {
		if errors.Is(err, lane.ErrNoLimitsStore) {
			return api.LaneStatus{}, fmt.Errorf("%w: %w", ingest.ErrPauseUnavailable, err)
		}
		return api.LaneStatus{}, err
	}
	return l.Status(ctx), nil
}

// Status implements ingest.Directory.
func (d *Lanes) Status(ctx context.Context) []api.LaneStatus {
	out := make([]api.LaneStatus, 0, len(d.order))
	for _, l := range d.order {
		out = append(out, l.Status(ctx))
	}
	return out
}

// KeyStatus implements ingest.KeyDirectory.
func (d *Lanes) KeyStatus(_ context.Context, name, key string) (api.KeyStatus, error) {
	st, err := d.byName[name].KeyStatus(key)
	return st, keyErr(err)
}

// SetKey implements ingest.KeyDirectory.
func (d *Lanes) SetKey(ctx context.Context, name, key string, c ingest.KeyChange, by string) (api.KeyStatus, error) {
	st, err := d.byName[name].SetKey(ctx, key, keyChange(c), by)
	return st, keyErr(err)
}

// keyChange turns the API's change of a key into the lane's (a rate in
// jobs per second).
func keyChange(c ingest.KeyChange) lane.KeyChange {
	lc := lane.KeyChange{MaxInflight: c.MaxInflight, Weight: c.Weight, Paused: c.Paused, Burst: c.Burst, Reset: c.Reset,
		URL: c.URL, Headers: c.Headers, SigningSecret: c.SigningSecret}
	if c.Rate != nil {
		r := c.Rate.PerSecond()
		lc.Rate = &r
	}
	return lc
}

// keyErr turns the lane's "not keyed" into the API's, which answers 4xx.
func keyErr(err error) error {
	if errors.Is(err, lane.ErrNotKeyed) {
		return ingest.ErrNotKeyed
	}
	return err
}
