package redisbucket_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/testenv"
)

// TestLostKeyStateIsRestored: Redis loses its data (FLUSHALL) right after a
// key of a keyed lane spent its burst (0.1/s burst 3; the lane-wide limit,
// 1000/s, binds only while its own restored state holds it, about a
// second). Without a floor for the key's state the next reservation found
// a full bucket and the key started a second burst as soon as the lane let
// it: 6 starts within about a second where G1 per key allows 3 + 0.1·W.
// With it, the key's state is restored as an empty bucket: its next slot
// a period (10 s) from the loss.
func TestLostKeyStateIsRestored(t *testing.T) {
	srv := testenv.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := redisbucket.New(client, redisbucket.DefaultConfig())
	ll := bucket.Limit{Rate: 1000, Burst: 1000}
	kl := bucket.Limit{Rate: 0.1, Burst: 3}
	k := bucket.Key{Lane: "demo", Sub: "a"}
	for i := range kl.Burst {
		r, err := s.ReservePair(ctx, k, ll, kl, 0, 0)
		if err != nil || !r.OK || r.Due != 0 {
			t.Fatalf("slot %d of the burst: %+v %v", i, r, err)
		}
	}
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// The key's next slots: at most one within a period of the burst
	// (3 + 0.1·10 s), the lane's restored state letting it start then.
	var due []time.Duration
	for range kl.Burst {
		r, err := s.ReservePair(ctx, k, ll, kl, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.OK && r.Due <= 10*time.Second+100*time.Millisecond {
			due = append(due, r.Due)
		}
	}
	if len(due) > 1 {
		t.Fatalf("after the loss the key got %d slots within a period of its burst (%v), want 1: a second burst", len(due), due)
	}
	// The lane's own state is restored as an empty bucket of the lane's
	// limit (next slot a lane period away, about 1 s after the loss), not
	// pushed by a key's period: another key starts then. Before, the pair
	// script read the key's period where the lane's held slots go, and the
	// whole lane waited 10 s.
	r, err := s.ReservePair(ctx, bucket.Key{Lane: "demo", Sub: "b"}, ll, kl, 0, 0)
	if err != nil || !r.OK || r.Due > 1100*time.Millisecond {
		t.Fatalf("another key after the loss: %+v %v, want a slot within about a second", r, err)
	}
	// Two states were lost and restored, each told once: the lane's and
	// the key's (logged under the key's name, not as the lane's).
	if s.Restored() != 2 {
		t.Fatalf("restored %d, want 2", s.Restored())
	}
}
