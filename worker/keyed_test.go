package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/throttler/throttler/internal/bucket"
	"github.com/throttler/throttler/internal/bucket/buckettest"
	"github.com/throttler/throttler/internal/config"
	"github.com/throttler/throttler/worker"
)

// TestKeyedLanePullWorkers: a keyed lane (every key 10/s) served by a pull
// pool of four workers, drained by two instances sharing Redis. Every job
// reaches a worker once, with its key in Job.Key and in the Throttle-Key
// header, in order per key, and no key gets more than burst + rate·W
// starts in any window W at the workers.
func TestKeyedLanePullWorkers(t *testing.T) {
	const perKey = 15
	keys := []string{"a", "b", "c"}
	perRate, err := bucket.ParseRate("10/s")
	if err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, 2, "100/s", 8, func(l *config.Lane) {
		l.PerKey = &config.PerKey{Rate: perRate, Burst: 1}
	})
	var (
		mu     sync.Mutex
		starts = map[string][]time.Time{}
		order  = map[string][]string{}
		bad    []string
	)
	t0 := time.Now()
	for i := range 4 {
		runPool(t, f.conn(t), worker.Config{Subject: workSubject, Name: fmt.Sprintf("w%d", i)},
			func(_ context.Context, job *worker.Job) error {
				now := time.Now()
				mu.Lock()
				defer mu.Unlock()
				if h := job.Header.Get("Throttle-Key"); h != job.Key || job.Key == "" {
					bad = append(bad, fmt.Sprintf("job %s: Key %q, Throttle-Key %q", job.ID, job.Key, h))
				}
				starts[job.Key] = append(starts[job.Key], now)
				order[job.Key] = append(order[job.Key], job.ID)
				return nil
			})
	}
	js, err := jetstream.New(f.conn(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range perKey {
		for _, key := range keys {
			m := nats.NewMsg("throttle." + laneName + "." + key)
			id := fmt.Sprintf("%s-%03d", key, i)
			m.Data = []byte(id)
			if _, err := js.PublishMsg(context.Background(), m, jetstream.WithMsgID(id)); err != nil {
				t.Fatalf("publish %s: %v", id, err)
			}
		}
	}
	waitFor(t, 30*time.Second, "every job at a worker", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, key := range keys {
			if len(order[key]) < perKey {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("jobs without their key: %v", bad)
	}
	lim := bucket.Limit{Rate: 10, Burst: 1}
	for _, key := range keys {
		var want []string
		for i := range perKey {
			want = append(want, fmt.Sprintf("%s-%03d", key, i))
		}
		if !slices.Equal(order[key], want) {
			t.Errorf("key %s reached the workers as %v, want %v (in order, once each)", key, order[key], want)
		}
		var at []time.Duration
		for _, s := range starts[key] {
			at = append(at, s.Sub(t0))
		}
		// A start may come the lane's 10 ms period after its slot, plus
		// the hops to a worker on a loaded machine.
		buckettest.CheckWindows(t, at, lim, 40*time.Millisecond)
	}
}
