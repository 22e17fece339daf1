package backend_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttler/throttler/internal/backend"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/internal/testenv"
)

// failFast are the options every kind shares: one dial, no command
// retries, deadlines from the context.
func failFast(o *redis.UniversalOptions) bool {
	return o.ContextTimeoutEnabled && o.DialerRetries == 1 && o.MaxRetries == -1 && o.DialTimeout == 500*time.Millisecond
}

func TestRedisOptions(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  config.Redis
		want redis.UniversalOptions
	}{
		{"single", config.Redis{URL: "redis://app:pw@10.0.0.1:6380/2"},
			redis.UniversalOptions{Addrs: []string{"10.0.0.1:6380"}, DB: 2, Username: "app", Password: "pw"}},
		{"single by name", config.Redis{URL: "redis://10.0.0.1:6379", Mode: "single"},
			redis.UniversalOptions{Addrs: []string{"10.0.0.1:6379"}}},
		{"sentinel", config.Redis{Mode: "sentinel", URL: "redis://app:pw@s1:26379/1?master_name=main&addr=s2:26379"},
			// go-redis reads the URL's user as the sentinels' (the master's
			// credentials come with the master's address).
			redis.UniversalOptions{Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "main", DB: 1, SentinelUsername: "app", SentinelPassword: "pw"}},
		{"cluster", config.Redis{Mode: "cluster", URL: "redis://app:pw@c1:7000?addr=c2:7001&addr=c3:7002"},
			redis.UniversalOptions{Addrs: []string{"c1:7000", "c2:7001", "c3:7002"}, IsClusterMode: true, Username: "app", Password: "pw"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := backend.RedisOptions(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !failFast(got) {
				t.Errorf("not fail-fast: %+v", got)
			}
			g := redis.UniversalOptions{Addrs: got.Addrs, MasterName: got.MasterName, DB: got.DB, Username: got.Username, Password: got.Password,
				SentinelUsername: got.SentinelUsername, SentinelPassword: got.SentinelPassword, IsClusterMode: got.IsClusterMode}
			w := c.want
			if strings.Join(g.Addrs, ",") != strings.Join(w.Addrs, ",") || g.MasterName != w.MasterName || g.DB != w.DB || g.Username != w.Username ||
				g.Password != w.Password || g.SentinelUsername != w.SentinelUsername || g.SentinelPassword != w.SentinelPassword || g.IsClusterMode != w.IsClusterMode {
				t.Fatalf("options:\n got %+v\nwant %+v", g, w)
			}
		})
	}
}

func TestRedisOptionsErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []config.Redis{
		{URL: "http://app:s3cret-pw@10.0.0.1:6379"},
		{URL: "redis://app:s3cret-pw@10.0.0.1:6379/notadb"},
		{Mode: "sentinel", URL: "redis://app:s3cret-pw@s1:26379?master_name=m&bogus=1"},
		{Mode: "cluster", URL: "redis://app:s3cret-pw@c1:7000?bogus=1"},
	} {
		_, err := backend.RedisOptions(c)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.Field != "redis.url" {
			t.Errorf("%s %q: %v, want a config error on redis.url", c.Mode, config.RedactURL(c.URL), err)
			continue
		}
		if strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("%s: the error shows the password: %v", c.Mode, err)
		}
	}
}

func TestOpenRedis(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	var logs testenv.LogBuffer
	r, err := backend.OpenRedis(ctx, config.Redis{URL: srv.URL()}, logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Pipe.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := r.Client.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("read back through the client: %q %v", v, err)
	}
	r.Close()
	if err := r.Client.Ping(ctx).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("ping after Close: %v, want redis.ErrClosed", err)
	}
	if l := logs.String(); strings.Contains(l, "unreachable") {
		t.Fatalf("a reachable Redis was logged unreachable:\n%s", l)
	}
}

// TestOpenRedisAway: a Redis that does not answer at start is logged (its
// password hidden), not refused, and answers once it is up.
func TestOpenRedisAway(t *testing.T) {
	t.Parallel()
	addr := testenv.ClosedAddr(t)
	url := "redis://:s3cret-pw@" + addr
	var logs testenv.LogBuffer
	start := time.Now()
	r, err := backend.OpenRedis(context.Background(), config.Redis{URL: url}, logs.Logger())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("OpenRedis waited %v for a Redis that is away", took)
	}
	l := logs.String()
	if !strings.Contains(l, "redis unreachable at start") || strings.Contains(l, "s3cret-pw") {
		t.Fatalf("want a warning without the password:\n%s", l)
	}
	if err := r.Scrub(errors.New("dial redis://:s3cret-pw@" + addr + ": refused")); strings.Contains(err.Error(), "s3cret-pw") {
		t.Fatalf("Scrub kept the password: %v", err)
	}
}

// TestOpenRedisCluster: on a Redis Cluster (one node owning every slot)
// the client is a cluster client, and Close stops its slot map reloads
// (goleak checks no goroutine is left).
func TestOpenRedisCluster(t *testing.T) {
	t.Parallel()
	node := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: node.Addr})
	defer c.Close()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the cluster to be ok", func() bool {
		info, err := c.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	r, err := backend.OpenRedis(ctx, config.Redis{URL: "redis://" + node.Addr, Mode: "cluster"}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Client.(*redis.ClusterClient); !ok {
		t.Fatalf("client %T, want *redis.ClusterClient", r.Client)
	}
	if err := r.Pipe.Set(ctx, "{lane}:k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Close()
}

func TestScrub(t *testing.T) {
	t.Parallel()
	if backend.Scrub(nil, "redis://:pw@h:1") != nil {
		t.Fatal("Scrub(nil) is not nil")
	}
	inner := context.DeadlineExceeded
	err := backend.Scrub(errors.Join(errors.New("redis://:topsecret@h:1 timed out"), inner), "redis://:topsecret@h:1")
	if strings.Contains(err.Error(), "topsecret") || !errors.Is(err, inner) {
		t.Fatalf("Scrub: %q (wraps the cause: %v)", err, errors.Is(err, inner))
	}
}
