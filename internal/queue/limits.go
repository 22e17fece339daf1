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
// Entries: "lane.<lane>" and "key.<lane>.<base64url(key)>", JSON with a
// version field.
const LimitsBucket = "THROTTLER_LIMITS"

// LaneLimit is a lane's rate and burst as changed at runtime.
type LaneLimit struct {
	V     int       `json:"v"`
	Rate  float64   `json:"rate"`
	Burst int       `json:"burst"`
	By    string    `json:"by,omitempty"`
	At    time.Time `json:"at"`
}

// KeyLimit is one key's override on a keyed lane; a nil field keeps the
// lane's per_key default.
type KeyLimit struct {
	V           int       `json:"v"`
	Rate        *float64  `json:"rate,omitempty"`
	Burst       *int      `json:"burst,omitempty"`
	MaxInflight *int      `json:"max_inflight,omitempty"`
	Weight      *float64  `json:"weight,omitempty"`
	Paused      bool      `json:"paused,omitempty"`
	By          string    `json:"by,omitempty"`
	At          time.Time `json:"at"`
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

func laneEntry(lane string) string { return "lane." + lane }
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
const maxLimitEntry = 4096

// Watch calls onLane and onKey (nil: the override was removed) for every
// stored entry of lane, then for every change, until ctx ends. Entries of
// another version or unreadable ones are skipped (reported to bad).
func (l *Limits) Watch(ctx context.Context, lane string, onLane func(LaneLimit), onKey func(key string, v *KeyLimit), bad func(entry string, err error)) error {
	w, err := l.kv.WatchFiltered(ctx, []string{laneEntry(lane), "key." + lane + ".*"})
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
