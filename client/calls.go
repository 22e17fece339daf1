package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/throttler/throttler/api"
)

// SubmitOptions are the optional parts of a submission. The zero value
// (or a nil pointer) submits with a fresh idempotency key and no key.
type SubmitOptions struct {
	// IdempotencyKey becomes the job id (Idempotency-Key header): a second
	// submission with the same one within the server's dedup window is not
	// stored again. Empty: the client makes one, the same on every retry.
	IdempotencyKey string
	// ThrottleKey is the job's key on a keyed lane (Throttle-Key header),
	// as api.BatchItem.ThrottleKey is an item's.
	ThrottleKey string
	// Key is the job's key on a keyed lane; ThrottleKey, when set, wins.
	//
	// Deprecated: use ThrottleKey, the name the batch item and the header
	// use.
	Key string
	// ContentType is stored with the job and sent to the target
	// (default application/octet-stream).
	ContentType string
	// Delay holds the job back: it is stored at once (api.StateScheduled)
	// and enters its lane's queue this long after the server took it
	// (Throttle-Delay). Zero: no delay.
	Delay time.Duration
	// NotBefore, instead of Delay, is the earliest time the job enters its
	// lane's queue (Throttle-Not-Before). Zero: none.
	NotBefore time.Time
	// Expires is when the job, if not started, is dead-lettered with the
	// reason "expired" instead (Throttle-Expires). Zero: never.
	Expires time.Time
	// Method, Path and URL say where the job goes within its HTTP lane's
	// target (Throttle-Method, Throttle-Path, Throttle-URL headers): a
	// method of target.http.methods, a path under target.http.url, a
	// URL under target.http.job_urls. Empty: the lane's.
	Method string
	Path   string
	URL    string
	// Forward are headers the target receives (Throttle-Forward-<Name>),
	// names the lane lists in target.http.forward_headers.
	Forward map[string]string
	// Callback is where the job's record is POSTed once it settles
	// (Throttle-Callback), a URL under the lane's results.callback_urls,
	// as api.BatchItem.Callback is an item's. Empty: none.
	Callback string
}

// Submit stores one job in lane. The answer says whether it started at
// once (api.StateAdmitted), waits (api.StateQueued, with an estimated
// wait) or was delayed (api.StateScheduled); Duplicate is set when the
// idempotency key was already stored.
func (c *Client) Submit(ctx context.Context, lane string, payload []byte, opts *SubmitOptions) (*api.Accepted, error) {
	var o SubmitOptions
	if opts != nil {
		o = *opts
	}
	if o.IdempotencyKey == "" {
		o.IdempotencyKey = newIdempotencyKey()
	}
	h := http.Header{}
	h.Set("Idempotency-Key", o.IdempotencyKey)
	if o.ThrottleKey == "" {
		o.ThrottleKey = o.Key
	}
	if o.ThrottleKey != "" {
		h.Set("Throttle-Key", o.ThrottleKey)
	}
	for name, v := range map[string]string{"Throttle-Method": o.Method, "Throttle-Path": o.Path, "Throttle-URL": o.URL, "Throttle-Callback": o.Callback} {
		if v != "" {
			h.Set(name, v)
		}
	}
	for name, v := range o.Forward {
		h.Set("Throttle-Forward-"+name, v)
	}
	ct := o.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	h.Set("Content-Type", ct)
	if o.Delay != 0 {
		h.Set("Throttle-Delay", o.Delay.String())
	}
	if !o.NotBefore.IsZero() {
		h.Set("Throttle-Not-Before", o.NotBefore.UTC().Format(time.RFC3339Nano))
	}
	if !o.Expires.IsZero() {
		h.Set("Throttle-Expires", o.Expires.UTC().Format(time.RFC3339Nano))
	}
	if payload == nil {
		payload = []byte{}
	}
	var out api.Accepted
	if _, err := c.do(ctx, request{method: http.MethodPost, path: []string{"v1", "lanes", lane, "jobs"}, header: h, body: payload}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SubmitBatch stores items in lane with one request (POST
// /v1/lanes/{lane}/jobs:batch). The answer has one result per item, in
// order; each item stands alone (a refused one has Status ≥ 400 and a
// Problem; nothing of it was stored). Items without an idempotency key get
// one (the slice is not modified), so that a retried batch stores each job
// once.
func (c *Client) SubmitBatch(ctx context.Context, lane string, items []api.BatchItem) (*api.BatchAccepted, error) {
	send := make([]api.BatchItem, len(items))
	for i, it := range items {
		if it.IdempotencyKey == "" {
			it.IdempotencyKey = newIdempotencyKey()
		}
		send[i] = it
	}
	body, err := json.Marshal(send)
	if err != nil {
		return nil, fmt.Errorf("client: batch: %w", err)
	}
	var out api.BatchAccepted
	if _, err := c.do(ctx, request{method: http.MethodPost, path: []string{"v1", "lanes", lane, "jobs:batch"}, body: body}, &out); err != nil {
		return nil, err
	}
	if len(out.Results) != len(items) {
		return &out, fmt.Errorf("client: batch answer has %d results for %d items", len(out.Results), len(items))
	}
	return &out, nil
}

// Lanes lists every lane with its limits and live state (GET /v1/lanes).
func (c *Client) Lanes(ctx context.Context) ([]api.LaneStatus, error) {
	var out api.Lanes
	if _, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "lanes"}}, &out); err != nil {
		return nil, err
	}
	return out.Lanes, nil
}

// LaneChange is a change of a lane's limits; an empty Rate or a nil Burst
// keeps that value.
type LaneChange struct {
	Rate  Rate `json:"rate,omitempty"`
	Burst *int `json:"burst,omitempty"`
}

// Rate is a rate as written in the config file: "50/s", "120/min",
// "1000/h", or a bare number of jobs per second ("0.5"), which is sent as a
// JSON number.
type Rate string

// MarshalJSON writes a bare number as a number, anything else as a string
// for the server to parse (and refuse, naming the field, when it is not a
// rate).
func (r Rate) MarshalJSON() ([]byte, error) {
	if f, err := strconv.ParseFloat(string(r), 64); err == nil {
		return json.Marshal(f)
	}
	return json.Marshal(string(r))
}

// SetLane changes a lane's rate and/or burst on every instance (PATCH
// /v1/lanes/{lane}) and returns the lane's new state. Needs an admin key.
func (c *Client) SetLane(ctx context.Context, lane string, change LaneChange) (*api.LaneStatus, error) {
	body, err := json.Marshal(change)
	if err != nil {
		return nil, err
	}
	var out api.LaneStatus
	if _, err := c.do(ctx, request{method: http.MethodPatch, path: []string{"v1", "lanes", lane}, body: body}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PauseLane holds a lane on every instance (PATCH /v1/lanes/{lane}
// {"paused": true}): its jobs are still accepted and queued, none starts
// until ResumeLane. The hold is stored and outlives restarts. Returns the
// lane's new state (PausedByOperator true). Needs an admin key.
func (c *Client) PauseLane(ctx context.Context, lane string) (*api.LaneStatus, error) {
	return c.setPaused(ctx, lane, true)
}

// ResumeLane releases a lane PauseLane held, on every instance; its
// backlog drains at the lane's rate. Needs an admin key.
func (c *Client) ResumeLane(ctx context.Context, lane string) (*api.LaneStatus, error) {
	return c.setPaused(ctx, lane, false)
}

func (c *Client) setPaused(ctx context.Context, lane string, paused bool) (*api.LaneStatus, error) {
	body, _ := json.Marshal(struct {
		Paused bool `json:"paused"`
	}{paused})
	var out api.LaneStatus
	if _, err := c.do(ctx, request{method: http.MethodPatch, path: []string{"v1", "lanes", lane}, body: body}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeadLetters is ListDead.
//
// Deprecated: use ListDead; the dead-letter calls are all named *Dead.
func (c *Client) DeadLetters(ctx context.Context, lane string, after uint64, limit int) (*api.DeadLetters, error) {
	return c.ListDead(ctx, lane, after, limit)
}

// DeadLetter is GetDead.
//
// Deprecated: use GetDead; the dead-letter calls are all named *Dead.
func (c *Client) DeadLetter(ctx context.Context, lane string, seq uint64) (*api.DeadLetter, error) {
	return c.GetDead(ctx, lane, seq)
}

// ListDead lists one page of a lane's dead letters, oldest first,
// without payloads: those after sequence after, at most limit (0: the
// server's default of 100; at most 1000). NextAfter in the answer, when
// not 0, is the after of the next page.
func (c *Client) ListDead(ctx context.Context, lane string, after uint64, limit int) (*api.DeadLetters, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatUint(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out api.DeadLetters
	if _, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "lanes", lane, "dead"}, query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetDead reads one dead letter with its payload. Needs an admin key.
func (c *Client) GetDead(ctx context.Context, lane string, seq uint64) (*api.DeadLetter, error) {
	var out api.DeadLetter
	if _, err := c.do(ctx, request{method: http.MethodGet, path: deadPath(lane, seq)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ReplayDead puts one dead letter back at the tail of its lane (attempts
// reset, id kept) and deletes it; it returns the job id.
func (c *Client) ReplayDead(ctx context.Context, lane string, seq uint64) (string, error) {
	return c.ReplayDeadWithKey(ctx, lane, seq, "")
}

// ReplayDeadWithKey is ReplayDead giving the job key as its key ("" keeps
// its own): for a job dead-lettered without a key on a keyed lane, or
// with one the lane refuses, which a replay without a key refuses (409
// replay-undeliverable).
func (c *Client) ReplayDeadWithKey(ctx context.Context, lane string, seq uint64, key string) (string, error) {
	var out struct {
		ID string `json:"id"`
	}
	var q url.Values
	if key != "" {
		q = url.Values{"key": {key}}
	}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: append(deadPath(lane, seq), "replay"), query: q}, &out); err != nil {
		return "", err
	}
	return out.ID, nil
}

// ReplayAllDead replays a lane's dead letters, oldest first, at most max
// of them in this call (0: the server's bound of 100000), and returns how
// many it replayed. Call it again until it returns fewer than max to
// replay more, reporting progress in between. ReplayAll says also how
// many it passed over.
func (c *Client) ReplayAllDead(ctx context.Context, lane string, max int) (int, error) {
	r, err := c.ReplayAll(ctx, lane, max)
	return r.Replayed, err
}

// Replayed is what one replay of all dead letters did.
type Replayed struct {
	// Replayed dead letters, at most the call's max.
	Replayed int `json:"replayed"`
	// Expired dead letters passed over: their Throttle-Expires has
	// passed, so they are not replayed and stay dead (they do not count
	// against max). Each call counts those it passed, so calls in a row
	// count the same ones again.
	Expired int `json:"expired"`
	// Undeliverable dead letters passed over: their job has no key and
	// the lane is keyed, or a key the lane refuses; they stay (replay
	// each with ReplayDeadWithKey, or delete it) and do not count
	// against max. UndeliverableSeqs are the first 100 of them.
	Undeliverable     int      `json:"undeliverable"`
	UndeliverableSeqs []uint64 `json:"undeliverable_seqs"`
	// Until is the last dead-letter sequence the call could replay (the
	// lane's last when it began, or the call's until): pass it to the
	// calls after the first (ReplayAllUntil), so that a job replayed by
	// one and dead again before the next is not replayed twice.
	Until uint64 `json:"until"`
}

// ReplayAll is ReplayAllDead, with the count of dead letters it passed
// over.
func (c *Client) ReplayAll(ctx context.Context, lane string, max int) (Replayed, error) {
	return c.ReplayAllUntil(ctx, lane, max, 0)
}

// ReplayAllUntil is ReplayAll replaying no dead letter after sequence
// until (0: no bound but the lane's last when the call begins).
func (c *Client) ReplayAllUntil(ctx context.Context, lane string, max int, until uint64) (Replayed, error) {
	q := url.Values{}
	if max > 0 {
		q.Set("max", strconv.Itoa(max))
	}
	if until > 0 {
		q.Set("until", strconv.FormatUint(until, 10))
	}
	var out Replayed
	if _, err := c.do(ctx, request{method: http.MethodPost, path: []string{"v1", "lanes", lane, "dead", "replay"}, query: q}, &out); err != nil {
		return Replayed{}, err
	}
	return out, nil
}

// DeleteDead deletes one dead letter.
func (c *Client) DeleteDead(ctx context.Context, lane string, seq uint64) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: deadPath(lane, seq)}, nil)
	return err
}

// PurgeDead deletes every dead letter of a lane.
func (c *Client) PurgeDead(ctx context.Context, lane string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: []string{"v1", "lanes", lane, "dead"}}, nil)
	return err
}

func deadPath(lane string, seq uint64) []string {
	return []string{"v1", "lanes", lane, "dead", strconv.FormatUint(seq, 10)}
}

// KeyChange overrides a key's limits; nil fields keep their value.
type KeyChange struct {
	Rate        Rate     `json:"rate,omitempty"`
	Burst       *int     `json:"burst,omitempty"`
	MaxInflight *int     `json:"max_inflight,omitempty"`
	Weight      *float64 `json:"weight,omitempty"`
	Paused      *bool    `json:"paused,omitempty"`
	// URL, Headers and SigningSecret give the key its own target on an
	// HTTP lane: a URL under target.http.job_urls, headers the lane
	// forwards, a Standard Webhooks secret (whsec_…, write-only). An
	// empty URL or secret, or an empty non-nil map, drops one; nil keeps.
	URL           *string           `json:"url,omitempty"`
	Headers       map[string]string `json:"headers"`
	SigningSecret *string           `json:"signing_secret,omitempty"`
	// Reset drops the key's override: it follows the lane's per_key
	// values again.
	Reset bool `json:"reset,omitempty"`
}

// Key reads one key of a keyed lane (GET /v1/lanes/{lane}/keys/{key}).
func (c *Client) Key(ctx context.Context, lane, key string) (*api.KeyStatus, error) {
	var out api.KeyStatus
	if _, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "lanes", lane, "keys", key}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetKey changes one key's overrides (PATCH /v1/lanes/{lane}/keys/{key}).
// Needs an admin key.
func (c *Client) SetKey(ctx context.Context, lane, key string, change KeyChange) (*api.KeyStatus, error) {
	body, err := json.Marshal(change)
	if err != nil {
		return nil, err
	}
	var out api.KeyStatus
	if _, err := c.do(ctx, request{method: http.MethodPatch, path: []string{"v1", "lanes", lane, "keys", key}, body: body}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
