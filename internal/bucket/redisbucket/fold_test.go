package redisbucket_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
)

// foldedOnly is the smallest script that folds a peek: PeekLua and the
// lane's reply, nothing of its own.
var foldedOnly = redis.NewScript(redisbucket.PeekLua + "local ns, tat, restored = lane_reply()\nreturn {ns, tat, restored}\n")

// TestFoldedPeekIsPeek: a peek folded into another script answers what
// Peek answers, at every fill of the bucket, counts as a call, and
// restores a lost state from its floor as Peek does. (Package redisquota
// folds its checks this way; its tests cover the folded script as a whole.)
func TestFoldedPeekIsPeek(t *testing.T) {
	client := newClient(t, sharedRedis(t))
	clock := buckettest.NewClock()
	s := onClock(client, clock)
	k := bucket.Key{Lane: "fold"}
	l := bucket.Limit{Rate: 10, Burst: 3}
	folded := func() bucket.Decision {
		t.Helper()
		f, err := s.Fold(k, l)
		if err != nil {
			t.Fatal(err)
		}
		if f.Key() != s.Key(k) {
			t.Fatalf("folded key %q, want %q", f.Key(), s.Key(k))
		}
		calls := redisbucket.Calls(s)
		reply, err := foldedOnly.Run(ctx, client, []string{f.Key()}, f.Args()...).Slice()
		if err != nil {
			t.Fatal(err)
		}
		if got := redisbucket.Calls(s); got != calls+1 {
			t.Fatalf("a folded peek counted %d calls, want 1", got-calls)
		}
		d, err := f.Decision(reply)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := range 6 { // full, partly spent, empty, then slots reserved ahead
		want, err := s.Peek(ctx, k, l)
		if err != nil {
			t.Fatal(err)
		}
		if got := folded(); got != want {
			t.Fatalf("step %d: folded %+v, Peek %+v", i, got, want)
		}
		if _, err := s.Reserve(ctx, k, l, 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Millisecond)
	}
	// Lost: the folded peek restores the state from the floor, once.
	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if d := folded(); d.Allowed || s.Restored() != 1 {
		t.Fatalf("folded peek after a loss: %+v, restored %d; want no room, restored once", d, s.Restored())
	}
	// A limit Peek refuses, and a tail of another shape.
	if _, err := s.Fold(k, bucket.Limit{Rate: 0, Burst: 1}); !errors.Is(err, bucket.ErrInvalidLimit) {
		t.Errorf("Fold of a zero rate: %v, want ErrInvalidLimit", err)
	}
	f, _ := s.Fold(k, l)
	for _, tail := range [][]any{{"0", ""}, {"0", "", int64(0), int64(0)}, {"x", "", int64(0)}, {"0", int64(1), int64(0)}} {
		if _, err := f.Decision(tail); !errors.Is(err, bucket.ErrUnavailable) {
			t.Errorf("Decision(%#v) = %v, want ErrUnavailable", tail, err)
		}
	}
}
