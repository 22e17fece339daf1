package redisclaims_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/keyed/redisclaims"
	"github.com/throttler/throttler/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// twoInstances starts a redis-server and returns a client of it and the
// claims of two instances, "a" and "b", sharing it under cfg.
func twoInstances(t *testing.T, cfg redisclaims.Config) (*redis.Client, *redisclaims.Claims, *redisclaims.Claims) {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: testenv.StartRedis(t).Addr})
	t.Cleanup(func() { client.Close() })
	cfg.Instance = "a"
	a := redisclaims.New(client, cfg)
	cfg.Instance = "b"
	return client, a, redisclaims.New(client, cfg)
}

// TestOneReaderPerKey: of two instances, only one holds a key at a time;
// a released key, or one whose holder stopped answering, goes to the
// other. Local, the single instance's claims, holds every key.
func TestOneReaderPerKey(t *testing.T) {
	ctx := context.Background()
	alive := 300 * time.Millisecond
	client, a, b := twoInstances(t, redisclaims.Config{Alive: alive})
	claim := func(c keyed.Claims, keys ...string) []string {
		t.Helper()
		got, err := c.Claim(ctx, "demo", keys)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := claim(a, "k1", "k2"); !slices.Equal(got, []string{"k1", "k2"}) {
		t.Fatalf("a claimed %v of free keys", got)
	}
	if got := claim(b, "k1", "k2", "k3"); !slices.Equal(got, []string{"k3"}) {
		t.Fatalf("b claimed %v, want only k3 (a holds k1 and k2)", got)
	}
	if got := claim(a, "k1"); !slices.Equal(got, []string{"k1"}) {
		t.Fatalf("a lost its own key: %v", got)
	}
	if err := a.Release(ctx, "demo", "k1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "demo", "k2"); err != nil { // not b's: no effect
		t.Fatal(err)
	}
	if got := claim(b, "k1", "k2"); !slices.Equal(got, []string{"k1"}) {
		t.Fatalf("b claimed %v after a released k1, want k1 only", got)
	}
	// a stops answering: once its liveness lapses, b takes k2 over.
	testenv.Eventually(t, 5*time.Second, "b to take over the key of a silent instance", func() bool {
		return slices.Equal(claim(b, "k2"), []string{"k2"})
	})
	if got := claim(a, "k2"); len(got) != 0 {
		t.Fatalf("a took k2 back from a live b: %v", got)
	}
	if got, _ := (keyed.Local{}).Claim(ctx, "demo", []string{"x", "y"}); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("Local claimed %v", got)
	}
	// An idle key costs nothing in Redis: released, its owner key is gone.
	if err := b.Release(ctx, "demo", "k1"); err != nil {
		t.Fatal(err)
	}
	if n, err := client.Exists(ctx, "thr:{demo}:own:k1").Result(); err != nil || n != 0 {
		t.Fatalf("released key still in Redis: %d, %v", n, err)
	}
}

// TestSlowShared: a key's slow-down stored by one instance is read by
// another with its age (from Redis's TTL, no instance clock), and is gone
// from Redis once it would have recovered.
func TestSlowShared(t *testing.T) {
	ctx := context.Background()
	client, a, b := twoInstances(t, redisclaims.Config{})
	if err := a.SaveSlow(ctx, "demo", "k1", 0.25, 400*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := client.Set(ctx, "thr:{demo}:slow:bad", "2 0.5 1000", time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := b.LoadSlow(ctx, "demo", []string{"k1", "k2", "bad"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Key != "k1" || got[0].Factor != 0.25 || got[0].Age < 0 || got[0].Age > 200*time.Millisecond {
		t.Fatalf("loaded %+v, want k1 at 0.25 aged < 200ms (k2 has none, bad is of another version)", got)
	}
	testenv.Eventually(t, 5*time.Second, "a recovered slow-down to leave Redis", func() bool {
		n, err := client.Exists(ctx, "thr:{demo}:slow:k1").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if got, err := b.LoadSlow(ctx, "demo", []string{"k1"}); err != nil || len(got) != 0 {
		t.Fatalf("loaded %+v, %v after it expired", got, err)
	}
}

// TestLeasesBoundTheFleet: two instances share a key's and a lane's
// in-flight bounds; a lease given back is free at once, and the leases of an
// instance that stopped refreshing come back after their lease.
func TestLeasesBoundTheFleet(t *testing.T) {
	ctx := context.Background()
	lease := 400 * time.Millisecond
	client, a, b := twoInstances(t, redisclaims.Config{InflightLease: lease})
	acquire := func(c *redisclaims.Claims, key, tok string, want keyed.Full) {
		t.Helper()
		got, err := c.Acquire(ctx, "demo", key, tok, 3, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s on %s: %v, want %v", tok, key, got, want)
		}
	}
	acquire(a, "k", "a1", keyed.Taken)
	acquire(b, "k", "b1", keyed.Taken)
	acquire(b, "k", "b2", keyed.KeyFull) // two of k in flight, whoever holds them
	acquire(a, "k", "a1", keyed.Taken)   // a token already holding counts once
	acquire(a, "j", "a2", keyed.Taken)
	acquire(b, "j", "b3", keyed.LaneFull) // three of the lane in flight
	if err := b.ReleaseLease(ctx, "demo", "k", "b1"); err != nil {
		t.Fatal(err)
	}
	acquire(b, "j", "b3", keyed.Taken)
	// a keeps a1 alive, b stops refreshing b3: b3 lapses, a1 does not.
	testenv.Eventually(t, 5*time.Second, "a crashed holder's lease to come back", func() bool {
		if err := a.Refresh(ctx, "demo", map[string]string{"a1": "k", "a2": "j"}); err != nil {
			t.Fatal(err)
		}
		got, err := a.Acquire(ctx, "demo", "k", "a3", 3, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got != keyed.Taken && got != keyed.LaneFull {
			t.Fatalf("a3: %v while b3 holds the lane's third lease", got)
		}
		return got == keyed.Taken
	})
	if n, err := client.ZCard(ctx, "thr:{demo}:inflight").Result(); err != nil || n != 3 {
		t.Fatalf("lane leases held: %d, %v, want 3 (a1, a2, a3)", n, err)
	}
	for _, tok := range []string{"a1", "a3"} {
		if err := a.ReleaseLease(ctx, "demo", "k", tok); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.ReleaseLease(ctx, "demo", "j", "a2"); err != nil {
		t.Fatal(err)
	}
	if n, err := client.Exists(ctx, "thr:{demo}:inflight", "thr:{demo}:kin:k", "thr:{demo}:kin:j").Result(); err != nil || n != 0 {
		t.Fatalf("%d lease sets left with nothing in flight (%v)", n, err)
	}
}

// countingScripter counts the script calls sent to Redis.
type countingScripter struct {
	*redis.Client
	calls atomic.Int64
}

func (c *countingScripter) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	c.calls.Add(1)
	return c.Client.EvalSha(ctx, sha1, keys, args...)
}

func (c *countingScripter) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	c.calls.Add(1)
	return c.Client.Eval(ctx, script, keys, args...)
}

// TestLeasesCombined: leases taken and given back at the same time by
// many callers go to Redis in fewer script calls than callers, and each is
// answered as if alone: of 64 keys asking at once under a lane bound of
// 10, exactly 10 are taken; once all are given back no lease set is left.
func TestLeasesCombined(t *testing.T) {
	ctx := context.Background()
	client := &countingScripter{Client: redis.NewClient(&redis.Options{Addr: testenv.StartRedis(t).Addr})}
	t.Cleanup(func() { client.Client.Close() })
	c := redisclaims.New(client, redisclaims.Config{Instance: "a"})
	if _, err := c.Acquire(ctx, "demo", "warm", "w", 10, 1); err != nil { // loads the script
		t.Fatal(err)
	}
	if err := c.ReleaseLease(ctx, "demo", "warm", "w"); err != nil {
		t.Fatal(err)
	}
	client.calls.Store(0)
	const callers = 64
	got := make([]keyed.Full, callers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			var err error
			if got[i], err = c.Acquire(ctx, "demo", fmt.Sprintf("k%d", i), fmt.Sprintf("t%d", i), 10, 1); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	taken := 0
	for _, f := range got {
		switch f {
		case keyed.Taken:
			taken++
		case keyed.LaneFull:
		default:
			t.Fatalf("answers %v: one key each, so only the lane may be full", got)
		}
	}
	if taken != 10 {
		t.Fatalf("%d leases taken under a lane bound of 10 (answers %v)", taken, got)
	}
	if n, err := client.ZCard(ctx, "thr:{demo}:inflight").Result(); err != nil || n != 10 {
		t.Fatalf("lane leases held: %d, %v, want 10", n, err)
	}
	for i := range callers {
		wg.Go(func() {
			if err := c.ReleaseLease(ctx, "demo", fmt.Sprintf("k%d", i), fmt.Sprintf("t%d", i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := client.calls.Load(); n >= 2*callers {
		t.Fatalf("%d script calls for %d acquires and %d releases made at once, want fewer", n, callers, callers)
	}
	keys, err := client.Keys(ctx, "thr:{demo}:*").Result()
	if err != nil || len(keys) != 0 {
		t.Fatalf("Redis keys left with nothing in flight: %v (%v)", keys, err)
	}
}
