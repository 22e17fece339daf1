package testenv_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttler/throttler/internal/testenv"
)

// TestRedisClusterFailover: three masters with a replica each behind a
// go-redis cluster client built from URL(); killing the master of a key
// promotes its replica, which holds the key.
func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := testenv.StartRedisCluster(t, 3, 1)
	t.Logf("cluster ready in %v", time.Since(start).Round(time.Millisecond))
	opt, err := redis.ParseClusterURL(c.URL())
	if err != nil {
		t.Fatalf("ParseClusterURL(%q): %v", c.URL(), err)
	}
	if !slices.Equal(opt.Addrs, c.Addrs()) || len(opt.Addrs) != 6 {
		t.Fatalf("URL %q parses to %v, want the six nodes %v", c.URL(), opt.Addrs, c.Addrs())
	}
	cc := redis.NewClusterClient(opt)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const key = "thr:{demo}:k"
	if err := cc.Set(ctx, key, "before", 0).Err(); err != nil {
		t.Fatal(err)
	}
	m := c.NodeForKey(t, key)
	if m < 0 || m > 2 {
		t.Fatalf("NodeForKey = %d, want one of the masters 0-2", m)
	}
	// The key is on node m: a plain client there reads it.
	direct := redis.NewClient(&redis.Options{Addr: c.Addrs()[m]})
	defer direct.Close()
	if got, err := direct.Get(ctx, key).Result(); err != nil || got != "before" {
		t.Fatalf("GET on node %d: %q %v", m, got, err)
	}
	if n, err := direct.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 on node %d: %d %v, want its replica to acknowledge", m, n, err)
	}

	killed := time.Now()
	c.KillNode(t, m)
	if conn, err := net.DialTimeout("tcp", c.Addrs()[m], time.Second); err == nil {
		conn.Close()
		t.Fatalf("node %d still accepts connections after KillNode", m)
	}
	next := c.WaitFailover(t, m)
	t.Logf("node %d replaced node %d in %v", next, m, time.Since(killed).Round(time.Millisecond))
	if want := 3 + m; next != want {
		t.Fatalf("WaitFailover = %d, want node %d (the replica of node %d)", next, want, m)
	}
	if got := c.NodeForKey(t, key); got != next {
		t.Fatalf("NodeForKey after the failover = %d, want %d", got, next)
	}
	// go-redis reloads its slot map on a MOVED reply or every
	// ClusterStateReloadInterval (60 s by default), not when a node refuses
	// connections: until then it keeps dialling the dead master.
	cc.ReloadState(ctx)
	if got, err := cc.Get(ctx, key).Result(); err != nil || got != "before" {
		t.Fatalf("GET after the failover: %q %v, want \"before\"", got, err)
	}
}

// TestRedisClusterOneNode: one master owns every slot.
func TestRedisClusterOneNode(t *testing.T) {
	t.Parallel()
	c := testenv.StartRedisCluster(t, 1, 0)
	opt, err := redis.ParseClusterURL(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	cc := redis.NewClusterClient(opt)
	defer cc.Close()
	ctx := context.Background()
	for _, k := range []string{"a", "b", "thr:{x}:y"} {
		if err := cc.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		if i := c.NodeForKey(t, k); i != 0 {
			t.Fatalf("NodeForKey(%q) = %d", k, i)
		}
	}
}
