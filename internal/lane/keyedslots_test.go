package lane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/keyed/redisclaims"
	"github.com/throttler/throttler/internal/testenv"
)

// lostAnswer takes the slots in Redis and then reports an error, as when
// the script ran and its answer was lost (a timeout, a broken connection).
type lostAnswer struct{ keyed.Slots }

var errLost = errors.New("i/o timeout")

func (s lostAnswer) Acquire(ctx context.Context, lane, key, token string, laneMax, keyMax int) (keyed.Full, error) {
	if _, err := s.Slots.Acquire(ctx, lane, key, token, laneMax, keyMax); err != nil {
		return 0, err
	}
	return 0, errLost
}

// TestKeyedAcquireErrorReleases: an acquire whose answer was lost gives
// its token's slots back instead of holding them for a whole lease.
func TestKeyedAcquireErrorReleases(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	real := redisclaims.New(client, redisclaims.Config{Instance: "a"})
	l := &Lane{
		cfg: config.Lane{Name: "demo", MaxInflight: 4},
		d:   Deps{Slots: lostAnswer{real}, Instance: "a", DispatchCtx: ctx},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	l.cfg.PerKey = &config.PerKey{MaxInflight: 2}
	k := &keyedRun{l: l, slots: map[string]string{}}
	tok, _, err := k.acquire(ctx, "k")
	if !errors.Is(err, errLost) || tok != "" {
		t.Fatalf("acquire: %q, %v; want no token and the lost answer", tok, err)
	}
	k.releases.Wait()
	if n, err := real.Held(ctx, "demo", "k"); err != nil || n != 0 {
		t.Fatalf("slots of k held after a lost acquire: %d, %v; want 0", n, err)
	}
	if len(k.slots) != 0 {
		t.Fatalf("tokens kept: %v", k.slots)
	}
}

// TestKeyedSlotsRefreshedAtStop: at a stop the claimer has ended, yet the
// slots of the deliveries still in flight stay alive past their lease
// until the deliveries drain (refreshUntil); then they lapse.
func TestKeyedSlotsRefreshedAtStop(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	const lease = 300 * time.Millisecond
	slots := redisclaims.New(client, redisclaims.Config{Instance: "a", SlotLease: lease})
	l := &Lane{
		cfg: config.Lane{Name: "demo", MaxInflight: 4, PerKey: &config.PerKey{MaxInflight: 2}},
		d:   Deps{Slots: slots, Instance: "a", DispatchCtx: ctx},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	k := &keyedRun{l: l, slots: map[string]string{}}
	tok, full, err := k.acquire(ctx, "k")
	if err != nil || full != keyed.Taken {
		t.Fatalf("acquire: %v, %v", full, err)
	}
	held := func() int {
		n, err := slots.Held(ctx, "demo", "k")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { k.refreshUntil(stop, lease/6); close(done) }()
	// Three leases: without refreshes the slot lapsed long ago.
	deadline := time.Now().Add(3 * lease)
	for time.Now().Before(deadline) {
		if n := held(); n != 1 {
			close(stop)
			<-done
			t.Fatalf("slot %s of k lapsed while its delivery was in flight: held %d", tok, n)
		}
		time.Sleep(lease / 10)
	}
	close(stop)
	<-done
	testenv.Eventually(t, 5*time.Second, "the slot lapses once refreshes stop", func() bool { return held() == 0 })
}

// slowRelease holds every ReleaseSlot until gate closes: a state store
// that answers slowly.
type slowRelease struct {
	keyed.Slots
	gate chan struct{}
}

func (s slowRelease) ReleaseSlot(ctx context.Context, lane, key, token string) error {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Slots.ReleaseSlot(ctx, lane, key, token)
}

// TestKeyedReleaseOffTheLoop: a slot the scheduling loop gives back (a
// reservation refused, the pacer down, a slot missed) is released on a
// goroutine of its own: the loop goes on while the store is slow, and the
// slot is free once the store answers.
func TestKeyedReleaseOffTheLoop(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	real := redisclaims.New(client, redisclaims.Config{Instance: "a"})
	gate := make(chan struct{})
	l := &Lane{
		cfg: config.Lane{Name: "demo", MaxInflight: 4, PerKey: &config.PerKey{MaxInflight: 2}},
		d:   Deps{Slots: slowRelease{real, gate}, Instance: "a", DispatchCtx: ctx},
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	k := &keyedRun{l: l, slots: map[string]string{}}
	tok, full, err := k.acquire(ctx, "k")
	if err != nil || full != keyed.Taken {
		t.Fatalf("acquire: %v, %v", full, err)
	}
	k.releaseSlotAsync("k", tok) // returns with the store still silent
	k.mu.Lock()                  // the release's goroutine deletes the token again
	_, ok := k.slots[tok]
	k.mu.Unlock()
	if ok {
		t.Fatalf("token %s still counted as held", tok)
	}
	if n, err := real.Held(ctx, "demo", "k"); err != nil || n != 1 {
		t.Fatalf("held before the store answered: %d, %v; want 1", n, err)
	}
	close(gate)
	k.releases.Wait()
	if n, err := real.Held(ctx, "demo", "k"); err != nil || n != 0 {
		t.Fatalf("held after the release: %d, %v; want 0", n, err)
	}
}
