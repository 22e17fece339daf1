package redisquota_test

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/quota/redisquota"
	"github.com/throttler/throttler/internal/testenv"
)

// window reads an IP window as the store keeps it: three little-endian
// doubles (index, count, previous count).
func window(t *testing.T, v string) (idx, cur, prev float64) {
	t.Helper()
	if len(v) != 24 {
		t.Fatalf("IP window %q: %d bytes, want 24", v, len(v))
	}
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[8*i:]))) }
	return f(0), f(1), f(2)
}

// TestKeyLayout: the IP window is "<prefix>:{callers}:ipw:<ip>" holding
// {index, count, previous count} packed, with a TTL of two windows; the
// caller's bucket is "<prefix>:{callers}:c:<caller>" holding its tat in
// whole µs since the epoch as decimal digits, with a TTL until the bucket
// is full again. Both move as the requests and the windows go by.
func TestKeyLayout(t *testing.T) {
	rs := testenv.StartRedis(t)
	c := client(t, rs.URL())
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 10, 0, time.UTC)
	mc := clock.NewManual(t0)
	p := "l" + strconv.FormatInt(prefixes.Add(1), 10)
	s := redisquota.New(c, redisquota.Config{Prefix: p, Clock: mc})
	r := quota.Request{IP: "2001:db8::/64", PerIP: quota.Window{Limit: 100, Length: time.Minute},
		Caller: "key:layout", Plan: bucket.Limit{Rate: 2, Burst: 5}, Cost: 1}
	ipKey, cKey := p+":{callers}:ipw:"+r.IP, p+":{callers}:c:"+r.Caller
	extra := time.Minute // an injected clock adds a minute to every TTL
	for i := range 3 {
		if _, err := s.Check(ctx, r); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			mc.Advance(time.Minute) // the next window: this one's count becomes the previous
		}
	}
	idx, cur, prev := window(t, c.Get(ctx, ipKey).Val())
	wantIdx := float64(t0.Add(time.Minute).UnixMicro() / time.Minute.Microseconds())
	if idx != wantIdx || cur != 1 || prev != 2 {
		t.Fatalf("IP window {%v, %v, %v}, want {%v, 1, 2}", idx, cur, prev, wantIdx)
	}
	if ttl := c.PTTL(ctx, ipKey).Val(); ttl > 2*time.Minute+extra || ttl < 2*time.Minute+extra-5*time.Second {
		t.Fatalf("IP window TTL %v, want about two windows (+%v)", ttl, extra)
	}
	// The bucket was full a minute on: one request took a period (500ms).
	want := strconv.FormatInt(t0.Add(time.Minute+500*time.Millisecond).UnixMicro(), 10)
	if got := c.Get(ctx, cKey).Val(); got != want {
		t.Fatalf("caller state %q, want %q (tat in whole µs)", got, want)
	}
	if ttl := c.PTTL(ctx, cKey).Val(); ttl > 500*time.Millisecond+extra || ttl < extra-5*time.Second {
		t.Fatalf("caller state TTL %v, want about 500ms (+%v)", ttl, extra)
	}
}

// TestOldIPWindowsExpire: the text windows of earlier versions
// ("<prefix>:{callers}:ip:<ip>", "<index>:<count>:<previous count>") are
// never read: a full old window refuses nothing, and is left to expire by
// its own TTL. A value of any other shape under the new key (not 24 bytes)
// counts as no state and is replaced by a window of this request.
func TestOldIPWindowsExpire(t *testing.T) {
	rs := testenv.StartRedis(t)
	c := client(t, rs.URL())
	ctx := context.Background()
	now := time.Now()
	p := "o" + strconv.FormatInt(prefixes.Add(1), 10)
	s := redisquota.New(c, redisquota.Config{Prefix: p})
	r := quota.Request{IP: "198.51.100.20", PerIP: quota.Window{Limit: 3, Length: time.Minute}}
	idx := now.UnixMicro() / time.Minute.Microseconds()
	old := p + ":{callers}:ip:" + r.IP
	oldVal := strconv.FormatInt(idx, 10) + ":3:3"
	if err := c.Set(ctx, old, oldVal, 2*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Check(ctx, r)
	if err != nil || !res.IP.Allowed || res.IP.Count != 0 {
		t.Fatalf("%+v %v, want the old full window unread", res, err)
	}
	if v := c.Get(ctx, old).Val(); v != oldVal {
		t.Fatalf("old window %q, want it untouched (%q)", v, oldVal)
	}
	if ttl := c.PTTL(ctx, old).Val(); ttl <= 0 || ttl > 2*time.Minute {
		t.Fatalf("old window TTL %v, want it still expiring on its own", ttl)
	}
	// An old value under the new key, and a truncated one.
	key := p + ":{callers}:ipw:" + r.IP
	for _, bad := range []string{oldVal, "\x00\x01\x02"} {
		if err := c.Set(ctx, key, bad, 0).Err(); err != nil {
			t.Fatal(err)
		}
		res, err := s.Check(ctx, r)
		if err != nil || !res.IP.Allowed || res.IP.Count != 0 {
			t.Fatalf("over %q: %+v %v, want no state", bad, res, err)
		}
		if _, cur, _ := window(t, c.Get(ctx, key).Val()); cur != 1 {
			t.Fatalf("over %q: count %v, want the request's window", bad, cur)
		}
		if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 {
			t.Fatalf("over %q: TTL %v, want one set", bad, ttl)
		}
	}
}

// TestCallerStateReadAsBefore: a caller's bucket written by an earlier
// version (the tat as "%.0f" of whole µs: the same digits this one
// writes) holds: an empty bucket written before the upgrade still refuses.
func TestCallerStateReadAsBefore(t *testing.T) {
	rs := testenv.StartRedis(t)
	c := client(t, rs.URL())
	ctx := context.Background()
	p := "v" + strconv.FormatInt(prefixes.Add(1), 10)
	s := redisquota.New(c, redisquota.Config{Prefix: p})
	r := quota.Request{Caller: "key:old", Plan: bucket.Limit{Rate: 1.0 / 60, Burst: 2}, Cost: 1}
	tat := time.Now().Add(2 * time.Minute) // empty: τ + T ahead
	if err := c.Set(ctx, p+":{callers}:c:"+r.Caller, strconv.FormatInt(tat.UnixMicro(), 10), 3*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Check(ctx, r)
	if err != nil || res.Plan.Allowed || res.Plan.RetryAfter < 55*time.Second || res.Plan.RetryAfter > time.Minute {
		t.Fatalf("%+v %v, want a refusal for about a minute", res, err)
	}
	if _, err := c.Get(ctx, p+":{callers}:c:"+r.Caller).Int64(); err != nil && err != redis.Nil {
		t.Fatalf("caller state no longer an integer: %v", err)
	}
}
