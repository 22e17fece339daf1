package redisbucket_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/testenv"
)

// shared is the redis-server of every test that does not stop its server:
// one for the package, each test taking it empty from sharedRedis.
var shared *testenv.Redis

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "redisbucket-test-")
	if err == nil {
		shared, err = testenv.LaunchRedis(dir)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "redisbucket tests need a real redis-server "+
			"(`apt-get install redis-server` or `brew install redis`): %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	shared.Close()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sharedRedis returns the address of the package's redis-server, emptied of
// keys and scripts. Tests that stop their server start one of their own.
func sharedRedis(t testing.TB) string {
	t.Helper()
	for _, cmd := range [][]string{{"FLUSHALL"}, {"SCRIPT", "FLUSH"}} {
		if _, err := testenv.RedisDo(shared.Addr, cmd...); err != nil {
			t.Fatalf("%v on the shared redis-server: %v", cmd, err)
		}
	}
	return shared.Addr
}

var (
	ctx  = context.Background()
	lane = bucket.Key{Lane: "demo"}
)

// newClient connects to srv and closes the client when the test ends.
// ContextTimeoutEnabled makes the client honour context deadlines on its
// sockets, which the store's Timeout relies on against a server that hangs.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// newFailFastClient is a client as redisbucket.New recommends it for
// production: no redial and no retry, so an outage is reported at once.
func newFailFastClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialerRetries: 1, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// onClock is a store on client (the default configuration) whose scripts
// read clk instead of Redis TIME.
func onClock(client redis.Scripter, clk clock.Clock) *redisbucket.Store {
	cfg := redisbucket.DefaultConfig()
	cfg.Clock = clk
	return redisbucket.New(client, cfg)
}

// fixedClock returns a clock stuck at one instant (nothing refills).
func fixedClock() clock.Clock {
	return buckettest.NewClock() // nothing advances it
}

func TestConformance(t *testing.T) {
	client := newClient(t, sharedRedis(t))
	buckettest.Run(t, func(t *testing.T, clock *clock.Manual) bucket.Store {
		if err := client.FlushAll(ctx).Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		return onClock(client, clock)
	}, buckettest.Options{Resolution: 2 * time.Microsecond})
}

// TestMatchesMemoryExactly drives the Redis store and the in-memory store
// with the same random operations at nanosecond-precise times, with rates
// whose periods are not whole microseconds: the answers must be identical,
// not merely close.
func TestMatchesMemoryExactly(t *testing.T) {
	client := newClient(t, sharedRedis(t))
	clock := buckettest.NewClock()
	rs := onClock(client, clock)
	ms := &bucket.Memory{Clock: clock}

	rng := rand.New(rand.NewPCG(3, 4))
	keys := []bucket.Key{{Lane: "a"}, {Lane: "a", Sub: "x"}, {Lane: "b"}}
	limits := []bucket.Limit{
		{Rate: 3, Burst: 4},              // T = 333333334ns
		{Rate: 7.5, Burst: 1},            // T = 133333334ns
		{Rate: 909090.9, Burst: 13},      // T = 1101ns: 1.1µs, far below a µs of rounding
		{Rate: bucket.MaxRate, Burst: 2}, // T = 1µs
		{Rate: 0.25, Burst: 3},           // T = 4s
	}
	for i := 0; i < 3000; i++ {
		k := keys[rng.IntN(len(keys))]
		l := limits[(i/300)%len(limits)] // change limits now and then, as an admin would
		clock.Advance(time.Duration(rng.Int64N(int64(3 * l.Period()))))
		switch op := rng.IntN(10); {
		case op < 4:
			got, err := rs.Admit(ctx, k, l)
			want, _ := ms.Admit(ctx, k, l)
			if err != nil || got != want {
				t.Fatalf("op %d Admit(%v, %v) = %+v, %v; memory says %+v", i, k, l, got, err, want)
			}
		case op < 7:
			n := 1 + rng.IntN(20)
			got, err := rs.Reserve(ctx, k, l, n)
			want, _ := ms.Reserve(ctx, k, l, n)
			if err != nil || got != want {
				t.Fatalf("op %d Reserve(%v, %v, %d) = %+v, %v; memory says %+v", i, k, l, n, got, err, want)
			}
		case op < 9:
			got, err := rs.Peek(ctx, k, l)
			want, _ := ms.Peek(ctx, k, l)
			if err != nil || got != want {
				t.Fatalf("op %d Peek(%v, %v) = %+v, %v; memory says %+v", i, k, l, got, err, want)
			}
		default:
			d := time.Duration(rng.Int64N(int64(5*l.Period()))) - l.Period()
			if err := rs.Pause(ctx, k, l, d); err != nil {
				t.Fatalf("op %d Pause: %v", i, err)
			}
			ms.Pause(ctx, k, l, d)
		}
	}
}

// TestRealClock uses Redis TIME (no Now hook): fake clocks hide bugs. The
// bounds allow for any delay between calls, as on a loaded CI machine.
func TestRealClock(t *testing.T) {
	s := redisbucket.New(newClient(t, sharedRedis(t)), redisbucket.DefaultConfig())
	l := bucket.Limit{Rate: 1000, Burst: 1}

	start := time.Now()
	r, err := s.Reserve(ctx, lane, l, 10)
	if err != nil {
		t.Fatal(err)
	}
	// At is Redis TIME (µs) when the script ran: on this host, between
	// the call and its answer, as the local clock reads them.
	if lo, hi := start.Truncate(time.Microsecond), time.Now(); r.At.Before(lo) || r.At.After(hi) {
		t.Errorf("reservation At %v, want Redis TIME between the call at %v and its answer at %v", r.At, lo, hi)
	}
	if r.N != 10 || r.Period != time.Millisecond {
		t.Fatalf("reservation %+v, want 10 slots 1ms apart", r)
	}
	for i := range 10 {
		if got, want := r.Delay(i), time.Duration(i)*time.Millisecond; got != want {
			t.Errorf("slot %d starts after %v, want %v", i, got, want)
		}
	}

	// The next call sees the ten slots taken: its first slot comes 10ms
	// after the first call's now, less the time that passed in between
	// (at most what this test measured, plus a millisecond of wall-clock
	// slack: Redis TIME is not monotonic).
	r, err = s.Reserve(ctx, lane, l, 1)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := 10*time.Millisecond-elapsed-time.Millisecond, 10*time.Millisecond+time.Millisecond; r.First < lo || r.First > hi {
		t.Errorf("11th slot at %v from now, want in [%v, %v]", r.First, lo, hi)
	}

	// Admission on a fresh lane with a period far longer than two calls take.
	k := bucket.Key{Lane: "admit"}
	l = bucket.Limit{Rate: 5, Burst: 1} // T = 200ms
	start = time.Now()
	if d, err := s.Admit(ctx, k, l); err != nil || !d.Allowed {
		t.Fatalf("first admit: %+v %v", d, err)
	}
	d, err := s.Admit(ctx, k, l)
	elapsed = time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if elapsed < l.Period()-time.Millisecond { // else the second job may rightly pass
		if lo := l.Period() - elapsed - time.Millisecond; d.Allowed || d.RetryAfter < lo || d.RetryAfter > l.Period()+time.Millisecond {
			t.Fatalf("second admit after %v: %+v, want refused with RetryAfter in [%v, %v]", elapsed, d, lo, l.Period())
		}
	}
	time.Sleep(d.RetryAfter + time.Millisecond)
	if d, err := s.Admit(ctx, k, l); err != nil || !d.Allowed {
		t.Fatalf("admit after RetryAfter: %+v %v", d, err)
	}
}

func TestKeysExpireOnceFull(t *testing.T) {
	client := newClient(t, sharedRedis(t))
	s := redisbucket.New(client, redisbucket.DefaultConfig())
	l := bucket.Limit{Rate: 20, Burst: 3} // T = 50ms
	k := bucket.Key{Lane: "ttl", Sub: "endpoint-1"}
	key := s.Key(k)
	if key != "thr:{ttl}:k:endpoint-1" {
		t.Fatalf("key = %q", key)
	}

	start := time.Now()
	d, err := s.Admit(ctx, k, l)
	if err != nil || !d.Allowed || d.ResetAfter != 50*time.Millisecond {
		t.Fatalf("admit: %+v %v, want allowed with ResetAfter 50ms", d, err)
	}
	pttl, err := client.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	// TTL ≥ time to refill (an early expiry would hand out a burst too
	// soon), and not much more (an idle lane costs nothing).
	if lo := d.ResetAfter - time.Since(start) - time.Millisecond; pttl < lo || pttl > d.ResetAfter+time.Millisecond {
		t.Fatalf("PTTL %v, want in [%v, %v]", pttl, lo, d.ResetAfter+time.Millisecond)
	}

	// More slots push tat further; the TTL follows.
	r, err := s.Reserve(ctx, k, l, 4)
	if err != nil {
		t.Fatal(err)
	}
	refill := r.First + l.Tolerance() + 4*l.Period() // tat' - now
	if pttl, err = client.PTTL(ctx, key).Result(); err != nil {
		t.Fatal(err)
	}
	if pttl < refill-time.Since(start)-time.Millisecond || pttl > refill+time.Millisecond {
		t.Fatalf("PTTL after reserve %v, want about %v", pttl, refill)
	}

	// Once the bucket is full again the key is gone, and not before.
	deadline := start.Add(refill + 5*time.Second)
	for {
		n, err := client.Exists(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key still there %v after the bucket refilled", time.Since(start)-refill)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if gone := time.Since(start); gone < refill-5*time.Millisecond {
		t.Fatalf("key gone after %v, before the bucket refilled (%v)", gone, refill)
	}
	if d, err := s.Peek(ctx, k, l); err != nil || d.Remaining != l.Burst {
		t.Fatalf("peek after expiry: %+v %v, want a full bucket", d, err)
	}
	if ks, _ := client.Keys(ctx, "*").Result(); len(ks) != 0 {
		t.Fatalf("keys left after refill: %v", ks)
	}
}

// TestZeroConfig: a store made from the zero Config works with the defaults
// (prefix "thr", DefaultTimeout), as Config's doc says.
func TestZeroConfig(t *testing.T) {
	client := newClient(t, sharedRedis(t))
	s := redisbucket.New(client, redisbucket.Config{})
	if d, err := s.Admit(ctx, lane, bucket.Limit{Rate: 1, Burst: 1}); err != nil || !d.Allowed {
		t.Fatalf("admit: %+v %v", d, err)
	}
	if n, err := client.Exists(ctx, "thr:{demo}:gcra").Result(); err != nil || n != 1 {
		t.Fatalf("state under the default prefix: %d %v", n, err)
	}
}

func TestKeyLayout(t *testing.T) {
	s := redisbucket.New(nil, redisbucket.Config{Prefix: "p"})
	for _, c := range []struct {
		k    bucket.Key
		want string
	}{
		{bucket.Key{Lane: "demo"}, "p:{demo}:gcra"},
		{bucket.Key{Lane: "demo", Sub: "https://x/{y}"}, "p:{demo}:k:https://x/{y}"},
		{bucket.Key{Lane: "a}b{c%"}, "p:{a%7Db%7Bc%25}:gcra"},
	} {
		if got := s.Key(c.k); got != c.want {
			t.Errorf("Key(%#v) = %q, want %q", c.k, got, c.want)
		}
	}
	// Without escaping, lane "a}:k:x" would share lane "a" key "x}:gcra"'s key.
	if s.Key(bucket.Key{Lane: "a}:k:x"}) == s.Key(bucket.Key{Lane: "a", Sub: "x}:gcra"}) {
		t.Fatal("two keys share a Redis key")
	}
	if got := redisbucket.New(nil, redisbucket.Config{}).Key(bucket.Key{Lane: "l"}); got != "thr:{l}:gcra" {
		t.Fatalf("zero Config key = %q, want the default prefix", got)
	}
	if err := (redisbucket.Config{Prefix: "x{y}"}).Validate(); err == nil || !strings.Contains(err.Error(), "prefix") {
		t.Fatalf("Validate of a braced prefix = %v, want an error naming the prefix", err)
	}
	for _, cfg := range []redisbucket.Config{redisbucket.DefaultConfig(), {}} {
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Validate(%+v) = %v", cfg, err)
		}
	}
	if err := (redisbucket.Config{Timeout: -time.Nanosecond}).Validate(); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("Validate of a negative timeout = %v, want an error naming the timeout", err)
	}
}

func TestNoScriptFallback(t *testing.T) {
	client := newClient(t, sharedRedis(t))
	s := redisbucket.New(client, redisbucket.DefaultConfig())
	l := bucket.Limit{Rate: 1, Burst: 3}
	if _, err := s.Admit(ctx, lane, l); err != nil {
		t.Fatal(err)
	}
	if err := client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := s.Admit(ctx, lane, l)
	if err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("admit after SCRIPT FLUSH: %+v %v, want allowed, 1 left", d, err)
	}
	if _, err := s.Reserve(ctx, lane, l, 2); err != nil {
		t.Fatal(err)
	}
	if got := redisbucket.Calls(s); got != 3 {
		t.Fatalf("Calls() = %d, want 3 (a NOSCRIPT fallback counts once)", got)
	}
}

func TestUnavailable(t *testing.T) {
	srv := testenv.StartRedis(t)
	cfg := redisbucket.DefaultConfig()
	cfg.Timeout = 100 * time.Millisecond
	slow := cfg
	slow.Timeout = 2 * time.Second
	l := bucket.Limit{Rate: 100, Burst: 10}
	stores := []struct {
		name   string
		s      *redisbucket.Store
		within time.Duration
		cause  string
	}{
		// go-redis defaults: it redials until the deadline.
		{"default client", redisbucket.New(newClient(t, srv.Addr), cfg), cfg.Timeout + 200*time.Millisecond, "deadline exceeded"},
		// The options New recommends: no redial, no retry.
		// The options New recommends: no redial, no retry. It fails long
		// before its (here long) timeout.
		{"fail-fast client", redisbucket.New(newFailFastClient(t, srv.Addr), slow), 250 * time.Millisecond, "connection refused"},
	}
	for _, st := range stores {
		if _, err := st.s.Admit(ctx, lane, l); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
	}

	srv.Stop(t)
	for _, st := range stores {
		s := st.s
		calls := []struct {
			name string
			call func() error
		}{
			{"Admit", func() error { _, err := s.Admit(ctx, lane, l); return err }},
			{"Reserve", func() error { _, err := s.Reserve(ctx, lane, l, 5); return err }},
			{"Peek", func() error { _, err := s.Peek(ctx, lane, l); return err }},
			{"Pause", func() error { return s.Pause(ctx, lane, l, time.Second) }},
		}
		for _, c := range calls {
			start := time.Now()
			err := c.call()
			elapsed := time.Since(start)
			t.Logf("%s: %s with Redis down: %v after %v", st.name, c.name, err, elapsed)
			if !errors.Is(err, bucket.ErrUnavailable) {
				t.Fatalf("%s: %s with Redis down: %v, want ErrUnavailable", st.name, c.name, err)
			}
			if errors.Is(err, bucket.ErrInvalidLimit) {
				t.Fatalf("%s: %s: %v also claims an invalid limit", st.name, c.name, err)
			}
			if elapsed > st.within {
				t.Fatalf("%s: %s took %v with Redis down, want at most %v", st.name, c.name, elapsed, st.within)
			}
			if msg := err.Error(); !strings.Contains(msg, "demo") || !strings.Contains(msg, st.cause) {
				t.Errorf("%s: %s error %q does not name the lane and the cause %q", st.name, c.name, msg, st.cause)
			}
		}
	}

	// The outage ends: the same clients and stores work again by themselves.
	srv.Start(t)
	for _, st := range stores {
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err := st.s.Admit(ctx, lane, l)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still failing 5s after Redis came back: %v", st.name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// hungServer accepts connections and never answers, like a Redis that is
// stuck or a network that drops replies.
func hungServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

func TestTimeoutOnHungServer(t *testing.T) {
	addr := hungServer(t)
	cfg := redisbucket.DefaultConfig()
	cfg.Timeout = 200 * time.Millisecond
	s := redisbucket.New(newClient(t, addr), cfg)
	l := bucket.Limit{Rate: 100, Burst: 10}

	start := time.Now()
	_, err := s.Admit(ctx, lane, l)
	if !errors.Is(err, bucket.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("admit against a hung server: %v, want ErrUnavailable and DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > cfg.Timeout+300*time.Millisecond {
		t.Fatalf("default timeout %v, but the call took %v", cfg.Timeout, elapsed)
	}

	// A deadline of the caller's own wins over the default.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := s.Reserve(cctx, lane, l, 1); !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("reserve against a hung server: %v", err)
	}
	if elapsed := time.Since(start); elapsed > 50*time.Millisecond+250*time.Millisecond {
		t.Fatalf("caller's deadline 50ms, but the call took %v", elapsed)
	}
}

func TestConcurrentAdmitsTakeExactlyTheBurst(t *testing.T) {
	checkConcurrentExactness(t, onClock(newClient(t, sharedRedis(t)), fixedClock()), bucket.Limit{Rate: 1, Burst: 50}, 8, 100, 1)
}

// checkConcurrentExactness runs workers×each Admit calls on one key at a
// fixed time (exactly the burst may be admitted) and as many Reserve calls
// of n slots on a second key (no slot may be handed out twice).
func checkConcurrentExactness(t *testing.T, s *redisbucket.Store, l bucket.Limit, workers, each, n int) {
	t.Helper()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed int
		firsts  = map[time.Duration]int{}
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				d, err := s.Admit(ctx, lane, l)
				if err != nil {
					t.Error(err)
					return
				}
				r, err := s.Reserve(ctx, bucket.Key{Lane: "demo", Sub: "drain"}, l, n)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if d.Allowed {
					allowed++
				}
				firsts[r.First]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if allowed != l.Burst {
		t.Fatalf("%d admitted by %d concurrent workers at a fixed time, want exactly the burst %d", allowed, workers, l.Burst)
	}
	for i := range workers * each {
		if slot := time.Duration(n*i)*l.Period() - l.Tolerance(); firsts[slot] != 1 {
			t.Fatalf("reservation %d (first slot at %v) made %d times, want once", i, slot, firsts[slot])
		}
	}
}

func TestInvalidLimitsSendNothing(t *testing.T) {
	// A nil client would panic if any call reached it.
	s := redisbucket.New(nil, redisbucket.DefaultConfig())
	for _, l := range []bucket.Limit{
		{Rate: 0, Burst: 1},
		{Rate: 1e-9, Burst: 1_000_000}, // below MinRate, and spans longer than a Duration holds
	} {
		if _, err := s.Admit(ctx, lane, l); !errors.Is(err, bucket.ErrInvalidLimit) {
			t.Errorf("Admit(%v) = %v, want ErrInvalidLimit", l, err)
		}
		if _, err := s.Reserve(ctx, lane, l, 1); !errors.Is(err, bucket.ErrInvalidLimit) {
			t.Errorf("Reserve(%v) = %v, want ErrInvalidLimit", l, err)
		}
		if _, err := s.Peek(ctx, lane, l); !errors.Is(err, bucket.ErrInvalidLimit) {
			t.Errorf("Peek(%v) = %v, want ErrInvalidLimit", l, err)
		}
		if err := s.Pause(ctx, lane, l, time.Second); !errors.Is(err, bucket.ErrInvalidLimit) {
			t.Errorf("Pause(%v) = %v, want ErrInvalidLimit", l, err)
		}
	}
	// Valid for Limit.Validate, but 3000 slots 1e15 ns apart span more than
	// a time.Duration holds (maxSpan, 2^61 ns, is a quarter of it).
	if _, err := s.Reserve(ctx, lane, bucket.Limit{Rate: 1e-6, Burst: 1}, 3000); !errors.Is(err, bucket.ErrInvalidLimit) {
		t.Errorf("Reserve of 3000 slots at 1e-6/s = %v, want ErrInvalidLimit", err)
	}
	if redisbucket.Calls(s) != 0 {
		t.Fatalf("Calls() = %d after invalid limits only", redisbucket.Calls(s))
	}

	// The bound itself is allowed: 2^31 slots of 2^30 ns (a rate of
	// 10^9/2^30 per second) span exactly 2^61 ns, and so does a pause of
	// 2^61 ns either way; the next representable value past it is not.
	ok := redisbucket.New(fakeClient{[]any{"0", "", int64(0)}}, redisbucket.DefaultConfig())
	edge := bucket.Limit{Rate: 1e9 / (1 << 30), Burst: 1}
	if _, err := ok.Reserve(ctx, lane, edge, 1<<31-1); err != nil {
		t.Errorf("Reserve spanning exactly 2^61 ns: %v", err)
	}
	if _, err := s.Reserve(ctx, lane, edge, 1<<31); !errors.Is(err, bucket.ErrInvalidLimit) {
		t.Errorf("Reserve spanning 2^61 ns and a slot: %v, want ErrInvalidLimit", err)
	}
	for _, d := range []time.Duration{1 << 61, -1 << 61} {
		if err := ok.Pause(ctx, lane, edge, d); err != nil {
			t.Errorf("Pause(%v): %v", d, err)
		}
		if err := s.Pause(ctx, lane, edge, d+d/(1<<52)); !errors.Is(err, bucket.ErrInvalidLimit) {
			t.Errorf("Pause(%v): %v, want ErrInvalidLimit", d+d/(1<<52), err)
		}
	}
}

// TestForeignState: a key under the prefix that the store did not write
// (another application, another type) gives an error, never a panic or a
// fresh bucket.
func TestForeignState(t *testing.T) {
	client := newClient(t, sharedRedis(t))
	s := redisbucket.New(client, redisbucket.DefaultConfig())
	l := bucket.Limit{Rate: 1, Burst: 1}

	client.Set(ctx, s.Key(lane), "not a tat", 0)
	if _, err := s.Admit(ctx, lane, l); !errors.Is(err, bucket.ErrUnavailable) || !strings.Contains(err.Error(), "unreadable state") {
		t.Fatalf("admit on a garbled state: %v", err)
	}
	k := bucket.Key{Lane: "demo", Sub: "h"}
	client.HSet(ctx, s.Key(k), "tat", "1")
	if _, err := s.Reserve(ctx, k, l, 1); !errors.Is(err, bucket.ErrUnavailable) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("reserve on a hash: %v", err)
	}
}

// fakeClient answers every script with a fixed reply.
type fakeClient struct{ reply any }

func (f fakeClient) cmd(ctx context.Context) *redis.Cmd {
	c := redis.NewCmd(ctx)
	c.SetVal(f.reply)
	return c
}

func (f fakeClient) Eval(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return f.cmd(ctx)
}

func (f fakeClient) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return f.cmd(ctx)
}

func (f fakeClient) EvalRO(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return f.cmd(ctx)
}

func (f fakeClient) EvalShaRO(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	return f.cmd(ctx)
}

func (fakeClient) ScriptExists(ctx context.Context, _ ...string) *redis.BoolSliceCmd {
	return redis.NewBoolSliceCmd(ctx)
}

func (fakeClient) ScriptLoad(ctx context.Context, _ string) *redis.StringCmd {
	return redis.NewStringCmd(ctx)
}

func TestUnexpectedRepliesAreErrors(t *testing.T) {
	l := bucket.Limit{Rate: 1, Burst: 1}
	for _, reply := range []any{
		nil, "x", int64(1), []any{}, []any{int64(1)}, []any{"1", "0"},
		[]any{int64(2), "0"}, []any{int64(1), "NaN"}, []any{int64(1), 1.5},
		[]any{int64(1), "0", "extra"}, []any{int64(1), "0", "", int64(0), "extra"},
		[]any{"1", "0", "", int64(0)}, []any{int64(1), "0", int64(5), int64(0)},
		[]any{int64(1), "0", "", int64(2)}, []any{int64(1), "0", "", "0"},
		[]any{int64(1), "1000000000", "12x.000", int64(0)}, []any{int64(1), "1000000000", "12.0001", int64(0)},
	} {
		s := redisbucket.New(fakeClient{reply}, redisbucket.DefaultConfig())
		if _, err := s.Admit(ctx, lane, l); !errors.Is(err, bucket.ErrUnavailable) {
			t.Errorf("Admit with reply %#v: %v, want ErrUnavailable", reply, err)
		}
	}
	for _, reply := range []any{
		nil, []any{"0"}, "abc", 2.5, []any{"0", ""}, []any{"0", "", int64(0), ""},
		[]any{"x", "", int64(0)}, []any{"0", int64(1), int64(0)}, []any{"0", "", int64(3)},
		[]any{"1", "1.2.000", int64(0)},
	} {
		s := redisbucket.New(fakeClient{reply}, redisbucket.DefaultConfig())
		if _, err := s.Reserve(ctx, lane, l, 1); !errors.Is(err, bucket.ErrUnavailable) {
			t.Errorf("Reserve with reply %#v: %v, want ErrUnavailable", reply, err)
		}
		if _, err := s.Peek(ctx, lane, l); !errors.Is(err, bucket.ErrUnavailable) {
			t.Errorf("Peek with reply %#v: %v, want ErrUnavailable", reply, err)
		}
		if err := s.Pause(ctx, lane, l, time.Second); !errors.Is(err, bucket.ErrUnavailable) {
			t.Errorf("Pause with reply %#v: %v, want ErrUnavailable", reply, err)
		}
	}
	// Durations past the ends of time.Duration saturate, never wrap round.
	for reply, wantAllowed := range map[string]bool{"9223372036854775808": false, "1e300": false, "-9223372036854775809": true, "-1e300": true} {
		s := redisbucket.New(fakeClient{[]any{reply, "", int64(0)}}, redisbucket.DefaultConfig())
		d, err := s.Peek(ctx, lane, l)
		if err != nil || d.Allowed != wantAllowed || !wantAllowed && d.RetryAfter < 100*365*24*time.Hour {
			t.Errorf("Peek with tat-now %s: %+v %v, want allowed %v", reply, d, err, wantAllowed)
		}
	}
	// The model and the script disagreeing is an error too: allowed, yet
	// tat - now far beyond the tolerance.
	s := redisbucket.New(fakeClient{[]any{int64(1), "9000000000", "", int64(0)}}, redisbucket.DefaultConfig())
	if _, err := s.Admit(ctx, lane, l); !errors.Is(err, bucket.ErrUnavailable) {
		t.Errorf("Admit with an inconsistent reply: %v, want an error", err)
	}
}
