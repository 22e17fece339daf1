package queue

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LimitsBucket is the JetStream key-value bucket that keeps the limits
// changed at runtime (PATCH of a lane, per-key overrides of a keyed lane),
// so that they survive restarts and reach every instance: each watches it.
// Entries: "lane.<lane>", "pause.<lane>" and "key.<lane>.<base64url(key)>",
// JSON with a version field.
const LimitsBucket = "THROTTLER_LIMITS"

// LaneLimit is a lane's rate and burst as changed at runtime.
type LaneLimit struct {
	V     int       `json:"v"`
	Rate  float64   `json:"rate"`
	Burst int       `json:"burst"`
	By    string    `json:"by,omitempty"`
	At    time.Time `json:"at"`
}

// LanePause is an operator's hold on a lane (PATCH {"paused": true}):
// while Paused, no instance starts the lane's jobs; they are still taken
// and queued. Kept apart from LaneLimit, so that holding a lane never
// stores a rate.
type LanePause struct {
	V      int       `json:"v"`
	Paused bool      `json:"paused"`
	By     string    `json:"by,omitempty"`
	At     time.Time `json:"at"`
	// Rev is the entry's revision in the bucket (not stored): later
	// changes have higher ones, whichever instance made them.
	Rev uint64 `json:"-"`
}

// KeyLimit is one key's override on a keyed lane; a nil field keeps the
// lane's per_key default.
type KeyLimit struct {
	V           int      `json:"v"`
	Rate        *float64 `json:"rate,omitempty"`
	Burst       *int     `json:"burst,omitempty"`
	MaxInflight *int     `json:"max_inflight,omitempty"`
	Weight      *float64 `json:"weight,omitempty"`
	Paused      bool     `json:"paused,omitempty"`
	// URL, Headers and SigningSecret are where the key's jobs go on an
	// HTTP lane (its receiver's URL under target.http.job_urls, headers
	// it sends, and its Standard Webhooks secret); empty: the lane's. The
	// secret is stored here, in JetStream, and never shown.
	URL           string            `json:"url,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	SigningSecret string            `json:"signing_secret,omitempty"`
	By            string            `json:"by,omitempty"`
	At            time.Time         `json:"at"`
}

// limitsVersion is the entries' format.
const limitsVersion = 1

// Limits reads and writes LimitsBucket. Safe for concurrent use.
type Limits struct {
	kv jetstream.KeyValue
}

// EnsureLimits creates or opens LimitsBucket.
func (q *Queue) EnsureLimits(ctx context.Context, replicas int) (*Limits, error) {
	kv, err := ensureKV(ctx, q.js, jetstream.KeyValueConfig{
		Bucket: LimitsBucket, Description: "throttler limits changed at runtime", History: 1,
		Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("queue: limits bucket: %w", err)
	}
	return &Limits{kv: kv}, nil
}

func laneEntry(lane string) string  { return "lane." + lane }
func pauseEntry(lane string) string { return "pause." + lane }
func keyEntry(lane, key string) string {
	return "key." + lane + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// PutLane stores lane's limit.
func (l *Limits) PutLane(ctx context.Context, lane string, v LaneLimit) error {
	v.V = limitsVersion
	b, _ := json.Marshal(v)
	if _, err := l.kv.Put(ctx, laneEntry(lane), b); err != nil {
		return fmt.Errorf("%w: store limit of lane %s: %v", ErrUnavailable, lane, err)
	}
	return nil
}

// PutPause stores lane's hold.
func (l *Limits) PutPause(ctx context.Context, lane string, v LanePause) (rev uint64, err error) {
	v.V = limitsVersion
	b, _ := json.Marshal(v)
	if rev, err = l.kv.Put(ctx, pauseEntry(lane), b); err != nil {
		return 0, fmt.Errorf("%w: store pause of lane %s: %v", ErrUnavailable, lane, err)
	}
	return rev, nil
}

// PutKey stores key's override on lane.
func (l *Limits) PutKey(ctx context.Context, lane, key string, v KeyLimit) error {
	v.V = limitsVersion
	b, _ := json.Marshal(v)
	if _, err := l.kv.Put(ctx, keyEntry(lane, key), b); err != nil {
		return fmt.Errorf("%w: store override of key %s of lane %s: %v", ErrUnavailable, key, lane, err)
	}
	return nil
}

// maxLimitEntry bounds an entry read back.
const maxLimitEntry = 16 << 10 // a key's headers take up to 8 KiB

// LimitsWatch are the calls Watch makes for one lane's entries.
type LimitsWatch struct {
	// Lane gets the lane's limit.
	Lane func(LaneLimit)
	// Pause gets the lane's hold (a removed entry: not paused).
	Pause func(LanePause)
	// Key gets a key's override; nil: the override was removed.
	Key func(key string, v *KeyLimit)
	// Bad hears of entries skipped: of another version, or unreadable.
	Bad func(entry string, err error)
	// Loaded, when set, is called once every entry stored when the watch
	// began has been handed to the calls above (each time Watch is called).
	Loaded func()
}

// Watch makes the calls of on for every stored entry of lane, then for
// every change, until ctx ends. Entries of another version or unreadable
// ones are skipped (reported to on.Bad).
func (l *Limits) Watch(ctx context.Context, lane string, on LimitsWatch) error {
	onLane, onKey, bad := on.Lane, on.Key, on.Bad
	w, err := l.kv.WatchFiltered(ctx, []string{laneEntry(lane), pauseEntry(lane), "key." + lane + ".*"})
	if err != nil {
		return fmt.Errorf("%w: watch limits of lane %s: %v", ErrUnavailable, lane, err)
	}
	defer func() { _ = w.Stop() }()
	keyPrefix := "key." + lane + "."
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("queue: limits watch ended")
			}
			if e == nil { // the stored entries were all delivered
				if on.Loaded != nil {
					on.Loaded()
				}
				continue
			}
			name := e.Key()
			del := e.Operation() != jetstream.KeyValuePut
			if len(e.Value()) > maxLimitEntry {
				bad(name, errors.New("entry too large"))
				continue
			}
			if name == laneEntry(lane) {
				if del {
					continue
				}
				var v LaneLimit
				if err := json.Unmarshal(e.Value(), &v); err != nil || v.V != limitsVersion {
					bad(name, fmt.Errorf("unreadable or of another version: %v", err))
					continue
				}
				onLane(v)
				continue
			}
			if name == pauseEntry(lane) {
				var v LanePause
				if !del {
					if err := json.Unmarshal(e.Value(), &v); err != nil || v.V != limitsVersion {
						bad(name, fmt.Errorf("unreadable or of another version: %v", err))
						continue
					}
				}
				v.Rev = e.Revision()
				on.Pause(v)
				continue
			}
			raw, err := base64.RawURLEncoding.DecodeString(name[len(keyPrefix):])
			if err != nil || ValidKey(string(raw)) != nil {
				bad(name, errors.New("not a key entry"))
				continue
			}
			if del {
				onKey(string(raw), nil)
				continue
			}
			var v KeyLimit
			if err := json.Unmarshal(e.Value(), &v); err != nil || v.V != limitsVersion {
				bad(name, fmt.Errorf("unreadable or of another version: %v", err))
				continue
			}
			onKey(string(raw), &v)
		}
	}
}
