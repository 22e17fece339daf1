//go:build !mutation

// The pacer on Redis leases: a mutation run leaves these out of its build
// (the same paths run on memLeases in pacer_test.go).

package keyed_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/keyed"
	"github.com/throttler/throttler/internal/keyed/redisclaims"
	"github.com/throttler/throttler/internal/testenv"
)

// leasePacer is a pacer of lane demo (max_inflight 4, 2 per key) whose
// leases are held in leases; its other parts are never called.
func leasePacer(t *testing.T, leases keyed.Leases) *keyed.Pacer[*memJob] {
	t.Helper()
	p, err := keyed.NewPacer(keyed.Config[*memJob]{
		Lane: "demo", Reader: &memReader{}, Pair: nopPair{}, Claims: keyed.Local{}, Leases: leases, Instance: "a",
		Start: func(context.Context, *memJob, func()) {}, LaneLimit: laneLimit, KeyLimit: keyLimit,
		KeyOpts: func(string) keyed.Opts { return keyed.Opts{MaxInflight: 2} }, MaxInflight: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func redisLeases(t *testing.T, cfg redisclaims.Config) *redisclaims.Claims {
	t.Helper()
	srv := testenv.StartRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	cfg.Instance = "a"
	return redisclaims.New(client, cfg)
}

// lostAnswer takes the leases in Redis and then reports an error, as when
// the script ran and its answer was lost (a timeout, a broken connection).
type lostAnswer struct{ keyed.Leases }

var errLost = errors.New("i/o timeout")

func (s lostAnswer) Acquire(ctx context.Context, lane, key, token string, laneMax, keyMax int) (keyed.Full, error) {
	if _, err := s.Leases.Acquire(ctx, lane, key, token, laneMax, keyMax); err != nil {
		return 0, err
	}
	return 0, errLost
}

// TestKeyedAcquireErrorReleases: an acquire whose answer was lost gives
// its token's leases back instead of holding them for a whole lease.
func TestKeyedAcquireErrorReleases(t *testing.T) {
	ctx := context.Background()
	real := redisLeases(t, redisclaims.Config{})
	k := leasePacer(t, lostAnswer{real})
	tok, _, err := k.Acquire(ctx, "k")
	if !errors.Is(err, errLost) || tok != "" {
		t.Fatalf("acquire: %q, %v; want no token and the lost answer", tok, err)
	}
	k.WaitReleases()
	if n, err := real.Held(ctx, "demo", "k"); err != nil || n != 0 {
		t.Fatalf("leases of k held after a lost acquire: %d, %v; want 0", n, err)
	}
	if n := k.HeldLeases(); n != 0 {
		t.Fatalf("tokens kept: %d", n)
	}
}

// TestKeyedAcquireBounds: the lane's and the key's in-flight bounds both
// refuse, and say which.
func TestKeyedAcquireBounds(t *testing.T) {
	ctx := context.Background()
	k := leasePacer(t, redisLeases(t, redisclaims.Config{}))
	steps := []struct {
		key  string
		want keyed.Full
	}{
		{"k", keyed.Taken}, {"k", keyed.Taken}, {"k", keyed.KeyFull},
		{"j", keyed.Taken}, {"j", keyed.Taken}, {"i", keyed.LaneFull},
	}
	for i, s := range steps {
		tok, full, err := k.Acquire(ctx, s.key)
		if err != nil || full != s.want || (tok != "") != (s.want == keyed.Taken) {
			t.Fatalf("step %d (%s): %q, %v, %v; want %v", i, s.key, tok, full, err, s.want)
		}
	}
	if n := k.HeldLeases(); n != 4 {
		t.Fatalf("tokens held: %d, want 4", n)
	}
}

// TestKeyedLeasesRefreshedAtStop: at a stop the claimer has ended, yet the
// leases of the deliveries still in flight stay alive past their lease
// until the deliveries drain (refreshUntil); then they lapse.
func TestKeyedLeasesRefreshedAtStop(t *testing.T) {
	realClock(t)
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	leases := redisLeases(t, redisclaims.Config{InflightLease: lease})
	k := leasePacer(t, leases)
	tok, full, err := k.Acquire(ctx, "k")
	if err != nil || full != keyed.Taken {
		t.Fatalf("acquire: %v, %v", full, err)
	}
	held := func() int {
		n, err := leases.Held(ctx, "demo", "k")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { k.RefreshUntil(ctx, stop, lease/6); close(done) }()
	// Three leases: without refreshes the lease lapsed long ago.
	deadline := time.Now().Add(3 * lease)
	for time.Now().Before(deadline) {
		if n := held(); n != 1 {
			close(stop)
			<-done
			t.Fatalf("lease %s of k lapsed while its delivery was in flight: held %d", tok, n)
		}
		time.Sleep(lease / 10)
	}
	close(stop)
	<-done
	testenv.Eventually(t, 5*time.Second, "the lease lapses once refreshes stop", func() bool { return held() == 0 })
}

// slowRelease holds every ReleaseLease until gate closes: a state store
// that answers slowly.
type slowRelease struct {
	keyed.Leases
	gate chan struct{}
}

func (s slowRelease) ReleaseLease(ctx context.Context, lane, key, token string) error {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Leases.ReleaseLease(ctx, lane, key, token)
}

// TestKeyedReleaseOffTheLoop: a lease the scheduling loop gives back (a
// reservation refused, the pacer down, a slot missed) is released on a
// goroutine of its own: the loop goes on while the store is slow, and the
// lease is free once the store answers.
func TestKeyedReleaseOffTheLoop(t *testing.T) {
	ctx := context.Background()
	real := redisLeases(t, redisclaims.Config{})
	gate := make(chan struct{})
	k := leasePacer(t, slowRelease{real, gate})
	tok, full, err := k.Acquire(ctx, "k")
	if err != nil || full != keyed.Taken {
		t.Fatalf("acquire: %v, %v", full, err)
	}
	k.ReleaseLeaseAsync(ctx, "k", tok) // returns with the store still silent
	if n := k.HeldLeases(); n != 0 {
		t.Fatalf("token %s still counted as held", tok)
	}
	if n, err := real.Held(ctx, "demo", "k"); err != nil || n != 1 {
		t.Fatalf("held before the store answered: %d, %v; want 1", n, err)
	}
	close(gate)
	k.WaitReleases()
	if n, err := real.Held(ctx, "demo", "k"); err != nil || n != 0 {
		t.Fatalf("held after the release: %d, %v; want 0", n, err)
	}
}
