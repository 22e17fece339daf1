package service_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/throttler/throttler/internal/service"
	"github.com/throttler/throttler/internal/testenv"
)

// concurrencyTarget answers after a delay and records, per key and for
// the whole lane, the most requests it held at once.
type concurrencyTarget struct {
	mu              sync.Mutex
	now, most       map[string]int
	nowAll, mostAll int
	done            int
	srv             *httptest.Server
}

func newConcurrencyTarget(t *testing.T, delay time.Duration) *concurrencyTarget {
	c := &concurrencyTarget{now: map[string]int{}, most: map[string]int{}}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Throttle-Key")
		c.mu.Lock()
		c.now[key]++
		c.nowAll++
		c.most[key] = max(c.most[key], c.now[key])
		c.mostAll = max(c.mostAll, c.nowAll)
		c.mu.Unlock()
		time.Sleep(delay)
		c.mu.Lock()
		c.now[key]--
		c.nowAll--
		c.done++
		c.mu.Unlock()
	}))
	t.Cleanup(c.srv.Close)
	return c
}

// TestKeyedLaneMaxInflightAcrossInstances: three instances, one Redis, one
// nats-server, a target that takes 200 ms: key "one" with max_inflight 2
// never has more than 2 requests at the target at once, and the lane's
// max_inflight of 3 holds for the whole fleet (each instance alone would
// allow 3), each reached.
func TestKeyedLaneMaxInflightAcrossInstances(t *testing.T) {
	t.Parallel()
	natsSrv := testenv.StartNATS(t)
	redis := testenv.StartRedis(t)
	tgt := newConcurrencyTarget(t, 200*time.Millisecond)
	cfg := keyedConfig(t, tgt.srv.URL, 1000, 20, 50, 5)
	cfg.NATS.URL = natsSrv.ClientURL()
	cfg.Redis.URL = redis.URL()
	cfg.Lanes[0].MaxInflight = 3
	cfg.Lanes[0].PerKey.MaxInflight = 2
	var svcs []*service.Service
	for range 3 {
		cfg.NATS.DataDir = t.TempDir()
		s, _ := start(t, cfg)
		svcs = append(svcs, s)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	// Key "one" first, alone: its own bound binds; then six keys at once
	// across the three instances: the lane's bound binds.
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			if code := submitKeyed(t, client, svcs[i%3].Addr(), "one", fmt.Sprintf("one-%05d", i)); code != http.StatusAccepted {
				t.Errorf("submit one/%d: %d", i, code)
			}
		})
	}
	wg.Wait()
	waitFor(t, 30*time.Second, "key one's jobs delivered", func() bool {
		tgt.mu.Lock()
		defer tgt.mu.Unlock()
		return tgt.done >= 12
	})
	tgt.mu.Lock()
	oneMost := tgt.most["one"]
	tgt.mostAll = 0
	tgt.mu.Unlock()
	if oneMost != 2 {
		t.Errorf("key one had at most %d requests at the target at once, want exactly its max_inflight 2", oneMost)
	}
	for k := range 6 {
		for i := range 8 {
			wg.Go(func() {
				key := fmt.Sprintf("key%d", k)
				if code := submitKeyed(t, client, svcs[(k+i)%3].Addr(), key, fmt.Sprintf("%s-%05d", key, i)); code != http.StatusAccepted {
					t.Errorf("submit %s/%d: %d", key, i, code)
				}
			})
		}
	}
	wg.Wait()
	waitFor(t, 60*time.Second, "every job delivered", func() bool {
		tgt.mu.Lock()
		defer tgt.mu.Unlock()
		return tgt.done >= 12+48
	})
	tgt.mu.Lock()
	defer tgt.mu.Unlock()
	if tgt.mostAll != 3 {
		t.Errorf("the lane had at most %d requests at the target at once, want exactly its max_inflight 3 across the fleet", tgt.mostAll)
	}
	for k := range 6 {
		if m := tgt.most[fmt.Sprintf("key%d", k)]; m > 2 {
			t.Errorf("key%d had %d requests at the target at once, over its max_inflight 2", k, m)
		}
	}
}
