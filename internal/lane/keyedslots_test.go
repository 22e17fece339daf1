package lane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

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
