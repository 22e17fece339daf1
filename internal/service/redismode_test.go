package service_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttler/throttler/internal/servicetest"
	"github.com/throttler/throttler/internal/testenv"
)

// TestRedisClusterMode runs a lane against a Redis Cluster (one node owning
// every slot): the {lane} hash tag keeps each script's keys on one slot, and
// jobs flow as with a single Redis.
func TestRedisClusterMode(t *testing.T) {
	t.Parallel()
	node, c := oneNodeCluster(t)
	ctx := context.Background()
	rec := newRecorder(t)
	cfg := testConfig(t, t.TempDir(), rec.srv.URL, 100, 5)
	cfg.Redis.URL = "redis://" + node.Addr
	cfg.Redis.Mode = "cluster"
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	for i := 0; i < 20; i++ {
		if code, _, _ := submit(t, client, svc.Addr(), "demo", fmt.Sprintf("cl-%02d", i), "x"); code != http.StatusAccepted {
			t.Fatalf("job %d: %d", i, code)
		}
	}
	waitFor(t, 10*time.Second, "20 deliveries", func() bool { return len(rec.snapshot()) == 20 })
	keys, err := c.Keys(ctx, "thr:{demo}:*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("no lane state in the cluster: %v %v", keys, err)
	}
}

// TestCallerQuotasOnRedisCluster: on Redis Cluster the lane's keys and the
// {callers} keys sit on different slots, so the caller check does not fold
// the lane's peek into its script (a script over two slots fails with
// CROSSSLOT, even on one node): the layers hold from Redis, in their own
// script, and no check falls back to memory.
func TestCallerQuotasOnRedisCluster(t *testing.T) {
	t.Parallel()
	node, c := oneNodeCluster(t)
	ctx := context.Background()
	rec := newRecorder(t)
	ns := testenv.StartNATS(t)
	cfg := callersConfig(t, ns.ClientURL(), "redis://"+node.Addr, rec.srv.URL+"/hook", 40)
	cfg.Redis.Mode = "cluster"
	svc, _ := start(t, cfg)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	codes := map[int]int{}
	for range 12 {
		codes[call(t, client, "POST", "http://"+svc.Addr()+"/v1/lanes/demo/jobs", "shop-secret", "{}")]++
	}
	if codes[202] != 10 || codes[429] != 2 {
		t.Fatalf("12 jobs of a key on 10/min: %v, want 10 × 202 and 2 × 429", codes)
	}
	m, _ := servicetest.Scrape(t, svc.Addr(), "ops-secret")
	if v, ok := m.Get("throttler_caller_quota_fallbacks_total"); !ok || v != 0 {
		t.Fatalf("caller checks fell back to memory on Redis Cluster:\n%s", m.Grep("throttler_caller_quota_fallbacks_total"))
	}
	if n, err := c.Exists(ctx, "thr:{callers}:c:key:shop").Result(); err != nil || n != 1 {
		t.Fatalf("the plan's state is not in the cluster: %d %v", n, err)
	}
}

// oneNodeCluster starts a Redis Cluster of one node owning every slot and
// returns it with a plain client to it, once the cluster says ok.
func oneNodeCluster(t *testing.T) (*testenv.Redis, *redis.Client) {
	t.Helper()
	node := testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
	c := redis.NewClient(&redis.Options{Addr: node.Addr})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatalf("CLUSTER ADDSLOTSRANGE: %v", err)
	}
	waitFor(t, 10*time.Second, "the cluster to be ok", func() bool {
		info, err := c.ClusterInfo(ctx).Result()
		return err == nil && len(info) > 0 && strings.Contains(info, "cluster_state:ok")
	})
	return node, c
}
