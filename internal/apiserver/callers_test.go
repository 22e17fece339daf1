package apiserver_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/apiserver"
	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/redisbucket"
	"github.com/throttler/throttler/internal/clock"
	"github.com/throttler/throttler/internal/metrics"
	"github.com/throttler/throttler/internal/quota"
	"github.com/throttler/throttler/internal/testenv"
)

const callersSection = `callers:
  per_ip: {limit: 100, window: 1m}
  plans: {free: {rate: 10/min, burst: 10}}
`

func TestCallersOff(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
	s, err := apiserver.New(parse(t, ""), logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Callers(apiserver.CallersConfig{Lanes: &bucket.Memory{}}); c != nil {
		t.Fatalf("caller quotas without a callers section: %+v", c)
	}
	if !strings.Contains(logs.String(), "caller quotas off") {
		t.Fatalf("no log that caller quotas are off:\n%s", logs.String())
	}
}

func TestCallersInMemory(t *testing.T) {
	t.Parallel()
	s, err := apiserver.New(parse(t, callersSection), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c := s.Callers(apiserver.CallersConfig{Lanes: &bucket.Memory{}, LaneNames: []string{"demo", "other"}})
	if c == nil {
		t.Fatal("no caller quotas with a callers section")
	}
	if _, ok := c.Limiter.(*quota.Memory); !ok {
		t.Fatalf("limiter without Redis: %T, want *quota.Memory", c.Limiter)
	}
	if _, free := c.Policy.Plans["free"]; len(c.Lanes) != 2 || c.Policy.PerIP.Limit != 100 || !free {
		t.Fatalf("callers: lanes %v, policy %+v", c.Lanes, c.Policy)
	}
}

// TestCallersFallbackLog: while Redis is away every caller check is
// answered from memory and counted, and the warning comes at most every
// 10 s, saying how many checks fell back since the last one.
func TestCallersFallbackLog(t *testing.T) {
	t.Parallel()
	away := testenv.ClosedAddr(t)
	client := redis.NewClient(&redis.Options{Addr: away, Password: "pw-1234", MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
	defer client.Close()
	pipe, err := client.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	defer pipe.Close()

	cfg := parse(t, callersSection)
	cfg.Redis.URL = "redis://:pw-1234@" + away
	var logs testenv.LogBuffer
	s, err := apiserver.New(cfg, logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c := s.Callers(apiserver.CallersConfig{Redis: pipe, Lanes: &bucket.Memory{}, Metrics: m, LaneNames: []string{"demo"}, Clock: clk})
	if _, ok := c.Limiter.(*quota.Failover); !ok {
		t.Fatalf("limiter with Redis: %T, want *quota.Failover", c.Limiter)
	}
	check := func() {
		t.Helper()
		r := quota.Request{Caller: "key:shop", Plan: bucket.Limit{Rate: 1, Burst: 10}, Cost: 1}
		if res, err := c.Limiter.Check(context.Background(), r); err != nil || !res.Plan.Allowed {
			t.Fatalf("check while Redis is away: %+v %v, want allowed from memory", res, err)
		}
	}
	check() // t0: warns
	clk.Advance(5 * time.Second)
	check()
	check()
	clk.Advance(5 * time.Second) // 10 s after the warning: warns again
	check()
	if n := testutil.ToFloat64(m.Callers.Fallbacks); n != 4 {
		t.Fatalf("fallbacks counted: %v, want 4", n)
	}
	var warnings []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "caller quotas are enforced per instance from memory") {
			warnings = append(warnings, l)
		}
	}
	if len(warnings) != 2 || !strings.Contains(warnings[0], `"checks_since_last_log":1`) || !strings.Contains(warnings[1], `"checks_since_last_log":3`) {
		t.Fatalf("fallback warnings: want 2 (after 1 check, then 3):\n%s", strings.Join(warnings, "\n"))
	}
	if strings.Contains(logs.String(), "pw-1234") {
		t.Fatalf("a log line holds redis.url's password:\n%s", logs.String())
	}
}

func TestLanesFold(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer client.Close()
	rs := redisbucket.New(client, redisbucket.DefaultConfig())
	for _, c := range []struct {
		name  string
		store bucket.Store
		mode  string
		fold  bool
	}{
		{"redis single", rs, "single", true},
		{"redis default mode", rs, "", true},
		{"redis sentinel", rs, "sentinel", true},
		{"redis cluster: two slots in one script", rs, "cluster", false},
		{"memory", &bucket.Memory{}, "", false},
	} {
		if got := apiserver.LanesFold(c.store, c.mode) != nil; got != c.fold {
			t.Errorf("%s: fold %v, want %v", c.name, got, c.fold)
		}
	}
}
